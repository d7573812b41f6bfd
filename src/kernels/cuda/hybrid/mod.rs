//! The hybrid models on CUDA: Qwen3.5 / Qwen3-Next (Gated DeltaNet + gated attention, MoE
//! for Next) and Nemotron-H (Mamba-2 + attention + MLP blocks), step for step as
//! src/models/{qwen3_5, nemotron_h}.rs, on the core's GEMM, norm, RoPE, KV cache, attention,
//! embedding, capture and argmax pieces plus the recurrent kernels (conv1d.cu,
//! gated_delta.cu, mamba2.cu, moe.cu, hybrid/gated_attn.cu).
//!
//! Entry point: [`load`] (the CUDA backend's `load` dispatches here for
//! `Architecture::is_hybrid()`), which returns a [`HybridCudaBackend`].
//!
//! # Recurrent state
//! One slot per running request ([`crate::kernels::SeqChunk::state_slot`]), f32 conv and
//! SSM / delta state of every recurrent layer on the device ([`recurrent::StateSlots`]); a
//! chunk starting at position 0 has its slot zeroed first. The recurrences run token by token
//! (see the kernels), so a token's result is the same whatever the batch or the chunking.
//!
//! # Layer ids (DESIGN.md §1.1)
//! id 0 = embedding output, id i = the residual stream after i layers (blocks), id L = the
//! last layer's output before the final norm. Residual adds are fused into the following norm
//! and kept exact in f32, so a captured row is exactly the CPU's residual stream (up to the
//! kernels' rounding).

mod attn;
mod moe;
mod nemotron;
mod qwen;
mod recurrent;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use super::api::CudaOptions;
use super::capture::Capture;
use super::context::{CudaError, CudaResult, DevBuf, Gpu};
use super::gemm::linear;
use super::kv_cache::{ATTN_MAX_HD, DevKvCache, DevPlan};
use super::ops;
use super::weights::DevWeight;
use crate::kernels::cpu::kv_cache::{BatchPlan, PlanLimits};
use crate::kernels::cpu::recurrent::{SeqState, seq_states};
use crate::kernels::{Backend, BackendError, Batch, BatchOutput};
use crate::models::hybrid_config::LayerKind;
use crate::models::{Architecture, ModelError, ModelSpec, Weights};
use nemotron::NemotronCuda;
use qwen::QwenCuda;
use recurrent::{DevSeqs, MAX_STATE_DIM, StateSlots};

/// Row widths (f32 elements per token) of the shared activation buffers.
#[derive(Debug, Clone, Copy)]
pub struct Widths {
    /// First projection of a mixer / MLP (fused in_proj, qkv, gate_up).
    pub wide: usize,
    /// Conv output (recurrent layers).
    pub conv: usize,
    /// Recurrence / attention output before its gate or norm (f32).
    pub mid: usize,
    /// Input of the output projection (GEMM input dtype; f32-sized).
    pub act: usize,
}

/// Activation buffers for the token budget, allocated once and shared by every layer.
pub struct Buffers {
    /// The residual stream `[T, hidden]`, f32.
    pub x: DevBuf<f32>,
    /// Normed rows (GEMM input dtype; f32-sized).
    pub normed: DevBuf<f32>,
    /// A mixer's / MLP's output `[T, hidden]`, f32.
    pub proj: DevBuf<f32>,
    pub wide: DevBuf<f32>,
    pub conv: DevBuf<f32>,
    pub mid: DevBuf<f32>,
    pub act: DevBuf<f32>,
}

impl Buffers {
    fn new(gpu: &Gpu, hidden: usize, w: Widths, t: usize) -> CudaResult<Self> {
        let n = |width: usize| {
            width
                .checked_mul(t)
                .ok_or_else(|| CudaError::Invalid("activation buffer size overflows".into()))
        };
        Ok(Self {
            x: gpu.zeros(n(hidden)?)?,
            normed: gpu.zeros(n(hidden)?)?,
            proj: gpu.zeros(n(hidden)?)?,
            wide: gpu.zeros(n(w.wide)?)?,
            conv: gpu.zeros(n(w.conv)?)?,
            mid: gpu.zeros(n(w.mid)?)?,
            act: gpu.zeros(n(w.act)?)?,
        })
    }
}

/// Index of each layer among the layers of its kind (KV cache index for attention layers,
/// state index for recurrent ones), and the two counts (as models::hybrid_attn).
pub(crate) fn kind_indices(kinds: &[LayerKind]) -> (Vec<usize>, usize, usize) {
    let (mut attn, mut rec) = (0, 0);
    let idx = kinds
        .iter()
        .map(|k| match k {
            LayerKind::Attention => {
                attn += 1;
                attn - 1
            }
            k if k.is_recurrent() => {
                rec += 1;
                rec - 1
            }
            _ => 0,
        })
        .collect();
    (idx, attn, rec)
}

enum Model {
    Qwen(Box<QwenCuda>),
    Nemotron(Box<NemotronCuda>),
}

impl Model {
    fn spec(&self) -> &ModelSpec {
        match self {
            Self::Qwen(m) => &m.spec,
            Self::Nemotron(m) => &m.spec,
        }
    }

    /// (attention layers, recurrent layers, conv floats per slot, state floats per slot)
    fn cache_shape(&self) -> (usize, usize, usize, usize) {
        match self {
            Self::Qwen(m) => {
                let (c, s) = m.state_shape();
                (m.num_attn, m.num_rec, c, s)
            }
            Self::Nemotron(m) => {
                let (c, s) = m.state_shape();
                (m.num_attn, m.num_rec, c, s)
            }
        }
    }

    fn widths(&self) -> Widths {
        match self {
            Self::Qwen(m) => m.widths(),
            Self::Nemotron(m) => m.widths(),
        }
    }

    /// (final norm weight, LM head) for the greedy pick.
    fn head(&self) -> (&DevBuf<f32>, &DevWeight) {
        match self {
            Self::Qwen(m) => (&m.final_norm, m.lm_head.as_ref().unwrap_or(&m.embed)),
            Self::Nemotron(m) => (&m.final_norm, m.lm_head.as_ref().unwrap_or(&m.embed)),
        }
    }
}

/// Whether `spec` runs on the CUDA hybrid path; `Err` says why not.
pub fn check_supported(spec: &ModelSpec) -> Result<(), String> {
    let Some(h) = &spec.hybrid else {
        return Err("not a hybrid model".into());
    };
    if h.layers.contains(&LayerKind::Attention) && spec.head_dim > ATTN_MAX_HD {
        return Err(format!("head_dim {} > {ATTN_MAX_HD}", spec.head_dim));
    }
    if let Some(g) = &h.gdn
        && g.k_head_dim > MAX_STATE_DIM
    {
        return Err(format!(
            "linear_key_head_dim {} > {MAX_STATE_DIM}",
            g.k_head_dim
        ));
    }
    if let Some(m) = &h.mamba
        && m.state_size > MAX_STATE_DIM
    {
        return Err(format!("ssm_state_size {} > {MAX_STATE_DIM}", m.state_size));
    }
    if let Some(m) = &h.moe
        && m.num_experts > moe::MAX_EXPERTS
    {
        return Err(format!(
            "num_experts {} > {}",
            m.num_experts,
            moe::MAX_EXPERTS
        ));
    }
    Ok(())
}

/// Loads a hybrid model (`spec.architecture.is_hybrid()`) onto device `opts.device`.
pub fn load(
    dir: &Path,
    spec: ModelSpec,
    opts: CudaOptions,
) -> Result<Box<dyn Backend>, ModelError> {
    catch_unwind(AssertUnwindSafe(|| {
        HybridCudaBackend::load(dir, spec, opts)
    }))
    .unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panic".into());
        Err(ModelError::InvalidOptions(format!(
            "cuda: loading panicked: {msg}"
        )))
    })
    .map(|b| Box::new(b) as Box<dyn Backend>)
}

/// A hybrid model on one device with its KV cache (attention layers), recurrent state slots
/// and capture buffers (field order = drop order: buffers before the context they live in).
pub struct HybridCudaBackend {
    model: Model,
    buffers: Buffers,
    cache: DevKvCache,
    states: StateSlots,
    capture: Capture,
    capture_layers: Vec<usize>,
    /// layer id -> capture slot
    capture_slot: Vec<Option<usize>>,
    max_tokens: usize,
    gpu: Gpu,
}

impl HybridCudaBackend {
    pub fn load(dir: &Path, spec: ModelSpec, opts: CudaOptions) -> Result<Self, ModelError> {
        check_options(&spec, &opts)?;
        let gpu = Gpu::new(opts.device)?;
        tracing::info!(
            device = opts.device,
            name = %gpu.info.name,
            cc = ?gpu.info.compute_capability,
            arch = spec.architecture.hf_name(),
            "cuda backend (hybrid): device ready"
        );
        let weights = Weights::open(dir)?;
        let t = opts.max_num_batched_tokens;
        let model = match spec.architecture {
            Architecture::Qwen3_5 | Architecture::Qwen3Next => {
                Model::Qwen(Box::new(QwenCuda::load(&gpu, &weights, spec, t)?))
            }
            Architecture::NemotronH => {
                Model::Nemotron(Box::new(NemotronCuda::load(&gpu, &weights, spec)?))
            }
            other => {
                return Err(ModelError::InvalidOptions(format!(
                    "{} is not a hybrid architecture",
                    other.hf_name()
                )));
            }
        };
        let s = model.spec();
        let (h, kv_dim) = (s.hidden_size, s.num_kv_heads * s.head_dim);
        let buffers = Buffers::new(&gpu, h, model.widths(), t)?;
        let (num_attn, num_rec, conv_per, ssm_per) = model.cache_shape();
        let cache = DevKvCache::new(
            &gpu,
            num_attn,
            opts.num_blocks,
            opts.block_size,
            kv_dim,
            s.dtype,
        )?;
        let states = StateSlots::new(&gpu, num_rec, opts.num_state_slots, conv_per, ssm_per)?;
        let capture = Capture::new(&gpu, opts.capture_layers.len(), h, t)?;
        let mut capture_slot = vec![None; s.num_layers + 1];
        for (k, &id) in opts.capture_layers.iter().enumerate() {
            capture_slot[id] = Some(k);
        }
        gpu.stream.synchronize().map_err(CudaError::from)?;
        Ok(Self {
            model,
            buffers,
            cache,
            states,
            capture,
            capture_layers: opts.capture_layers,
            capture_slot,
            max_tokens: t,
            gpu,
        })
    }

    pub fn spec(&self) -> &ModelSpec {
        self.model.spec()
    }

    fn limits(&self) -> PlanLimits {
        let s = self.model.spec();
        PlanLimits {
            vocab: s.vocab_size,
            max_positions: s.max_position_embeddings,
            num_blocks: self.cache.num_blocks(),
            block_size: self.cache.block_size(),
        }
    }

    fn run(
        &mut self,
        batch: &Batch<'_>,
        plan: &BatchPlan<'_>,
        seqs: &[SeqState],
    ) -> CudaResult<BatchOutput> {
        let (gpu, b) = (&self.gpu, &self.buffers);
        let t = plan.num_tokens();
        self.capture.begin()?;
        let dev = DevPlan::new(gpu, batch.token_ids, plan)?;
        let dseqs = DevSeqs::new(gpu, seqs, t)?;
        self.states.reset_fresh(gpu, &dseqs)?;
        let (capture, slots) = (&self.capture, &self.capture_slot);
        let cap = |id: usize| match slots.get(id).copied().flatten() {
            Some(k) => capture.capture(gpu, k, b.x.ptr(), t),
            None => Ok(()),
        };
        match &self.model {
            Model::Qwen(m) => m.forward(gpu, b, &dev, &dseqs, &self.cache, &self.states, &cap)?,
            Model::Nemotron(m) => {
                m.forward(gpu, b, &dev, &dseqs, &self.cache, &self.states, &cap)?
            }
        }
        let rows: Vec<u32> = plan.sample_rows.iter().map(|&(_, r)| r as u32).collect();
        let tokens = self.greedy(&rows)?;
        let captured = self.capture.finish(t)?;
        let mut sampled = vec![None; batch.seqs.len()];
        for (&(seq, _), tok) in plan.sample_rows.iter().zip(tokens) {
            sampled[seq] = Some(tok);
        }
        Ok(BatchOutput { captured, sampled })
    }

    /// Greedy tokens of residual rows `rows` of the last forward: final norm, LM head,
    /// argmax. Waits for the compute stream.
    fn greedy(&self, rows: &[u32]) -> CudaResult<Vec<u32>> {
        let n = rows.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let gpu = &self.gpu;
        let s = self.model.spec();
        let (h, v, dt) = (s.hidden_size, s.vocab_size, s.dtype);
        let rows_dev = gpu.upload(rows)?;
        let last: DevBuf<f32> = gpu.zeros(n * h)?;
        let normed: DevBuf<f32> = gpu.zeros(n * h)?;
        let logits: DevBuf<f32> = gpu.zeros(n * v)?;
        let out: DevBuf<u32> = gpu.zeros(n)?;
        ops::gather_rows(gpu, self.buffers.x.ptr(), rows_dev.ptr(), last.ptr(), n, h)?;
        let (norm, head) = self.model.head();
        let eps = s.rms_norm_eps;
        ops::rms_norm(gpu, last.ptr(), norm.ptr(), normed.ptr(), dt, n, h, eps)?;
        linear(gpu, normed.ptr(), head, logits.ptr(), n)?;
        ops::argmax(gpu, logits.ptr(), n, v, out.ptr())?;
        gpu.download(&out, n)
    }
}

impl Backend for HybridCudaBackend {
    fn hidden_size(&self) -> usize {
        self.model.spec().hidden_size
    }

    fn capture_layers(&self) -> &[usize] {
        &self.capture_layers
    }

    fn forward(&mut self, batch: &Batch<'_>) -> Result<BatchOutput, BackendError> {
        let plan = BatchPlan::new(batch, &self.limits())?;
        let seqs = seq_states(batch, self.states.num_slots())?;
        let t = plan.num_tokens();
        if t == 0 {
            return Ok(BatchOutput {
                captured: Vec::new(),
                sampled: vec![None; batch.seqs.len()],
            });
        }
        if t > self.max_tokens {
            return Err(BackendError::InvalidBatch(format!(
                "{t} tokens exceed the CUDA backend's token budget {}",
                self.max_tokens
            )));
        }
        Ok(self.run(batch, &plan, &seqs)?)
    }
}

impl Drop for HybridCudaBackend {
    fn drop(&mut self) {
        // Nothing may still run on buffers about to be freed.
        let _ = self.gpu.stream.synchronize();
        let _ = self.gpu.copy_stream.synchronize();
    }
}

fn check_options(spec: &ModelSpec, opts: &CudaOptions) -> Result<(), ModelError> {
    let bad = |m: String| Err(ModelError::InvalidOptions(m));
    if let Err(why) = check_supported(spec) {
        return bad(format!(
            "{} does not run on the CUDA backend: {why} (use device = \"cpu\")",
            spec.architecture.hf_name()
        ));
    }
    if opts.block_size == 0 || opts.num_blocks == 0 || opts.max_num_batched_tokens == 0 {
        return bad(format!(
            "num_blocks ({}), block_size ({}) and max_num_batched_tokens ({}) must be > 0",
            opts.num_blocks, opts.block_size, opts.max_num_batched_tokens
        ));
    }
    if spec.has_recurrent_layers() && opts.num_state_slots == 0 {
        return bad(format!(
            "{} has recurrent layers and needs num_state_slots > 0 (one per running request)",
            spec.architecture.hf_name()
        ));
    }
    let int = i32::MAX as usize;
    if opts.num_blocks > int
        || opts.max_num_batched_tokens > int
        || opts.block_size > int
        || opts.num_state_slots > int
        || spec.max_position_embeddings > int
    {
        return bad(
            "num_blocks, block_size, num_state_slots, max_num_batched_tokens and \
             max_position_embeddings must fit in i32"
                .into(),
        );
    }
    let l = spec.num_layers;
    if let Some(&id) = opts.capture_layers.iter().find(|&&id| id > l) {
        return bad(format!("capture layer {id} is out of range 0..={l}"));
    }
    if opts.capture_layers.windows(2).any(|w| w[0] >= w[1]) {
        return bad(format!(
            "capture layers {:?} must be strictly ascending",
            opts.capture_layers
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::context::kernel_names_for_test;
    use super::super::nvrtc::SOURCES;
    use super::*;

    /// Every kernel the hybrid launchers call is an entry point of a loaded source.
    #[test]
    fn launched_hybrid_kernels_exist() {
        let all: Vec<String> = SOURCES
            .iter()
            .flat_map(|(_, src)| kernel_names_for_test(src))
            .collect();
        let mut wanted: Vec<String> = [
            "zero_state_slots_f32",
            "conv1d_silu_f32",
            "conv1d_state_update_f32",
            "gdn_qk_l2norm_f32",
            "gated_delta_rule_f32",
            "mamba2_scan_f32",
            "moe_route_f32",
            "moe_gather_rows_f32",
            "moe_gather_rows_u16",
            "moe_combine_f32",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for d in ["f32", "bf16", "f16"] {
            for k in [
                "gdn_gated_norm",
                "mamba2_gated_norm",
                "relu2",
                "moe_shared_gate",
                "attn_gate",
            ] {
                wanted.push(format!("{k}_{d}"));
            }
        }
        for w in &wanted {
            assert!(all.contains(w), "kernel `{w}` is launched but not defined");
        }
    }

    #[test]
    fn kind_indices_count_per_kind() {
        use LayerKind::*;
        let (idx, attn, rec) = kind_indices(&[Mamba2, Mlp, Attention, Mlp, Mamba2, Attention]);
        assert_eq!(idx, vec![0, 0, 0, 0, 1, 1]);
        assert_eq!((attn, rec), (2, 2));
    }
}
