//! The hybrid models on CUDA: Qwen3.5 / Qwen3-Next (Gated DeltaNet + gated attention, MoE
//! for Next) and Nemotron-H (Mamba-2 + attention + MLP blocks), step for step as
//! src/models/{qwen3_5, nemotron_h}.rs, on the core's GEMM, norm, RoPE, KV cache, attention,
//! embedding, capture and argmax pieces plus the recurrent kernels (conv1d.cu,
//! gated_delta.cu, mamba2.cu, moe.cu, hybrid/gated_attn.cu).
//!
//! Entry point: [`HybridModel`], which the CUDA backend's `load` drives for
//! `Architecture::is_hybrid()` (the residual-stream loop is [`super::backend::residual_stream`]).
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

use super::api::CudaOptions;
use super::backend::{DevModel, residual_stream};
use super::context::{CudaError, CudaResult, DevBuf, Gpu};
use super::kv_cache::{ATTN_MAX_HD, DevKvCache, DevPlan};
use super::weights::DevWeight;
use crate::kernels::cpu::recurrent::{SeqState, seq_states};
use crate::kernels::{BackendError, Batch};
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

/// One forward of a hybrid model: the device, the shared activation buffers, the batch plan
/// and chunks, the KV cache and the state slots (fresh slots already zeroed).
pub struct Step<'a> {
    pub gpu: &'a Gpu,
    pub b: &'a Buffers,
    pub plan: &'a DevPlan,
    pub seqs: &'a DevSeqs,
    pub cache: &'a DevKvCache,
    pub states: &'a StateSlots,
}

impl Step<'_> {
    /// [`residual_stream`] of `blocks` on the shared buffers (`b.x` the residual stream).
    fn run_blocks<B>(
        &self,
        (spec, embed): (&ModelSpec, &DevWeight),
        blocks: &[B],
        norm: impl Fn(&B) -> u64,
        cap: &dyn Fn(usize) -> CudaResult<()>,
        body: impl FnMut(usize, &B) -> CudaResult<()>,
    ) -> CudaResult<()> {
        let (b, plan) = (self.b, self.plan);
        let stream = (&b.x, &b.normed, &b.proj);
        residual_stream(self.gpu, spec, embed, plan, stream, blocks, norm, cap, body)
    }
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

/// A hybrid model on the device with its activation buffers and recurrent state slots.
pub(crate) struct HybridModel {
    model: Model,
    buffers: Buffers,
    states: StateSlots,
}

impl HybridModel {
    pub(crate) fn load(
        gpu: &Gpu,
        weights: &Weights,
        spec: ModelSpec,
        opts: &CudaOptions,
    ) -> Result<Self, ModelError> {
        let t = opts.max_num_batched_tokens;
        let model = match spec.architecture {
            Architecture::Qwen3_5 | Architecture::Qwen3Next => {
                Model::Qwen(Box::new(QwenCuda::load(gpu, weights, spec, t)?))
            }
            Architecture::NemotronH => {
                Model::Nemotron(Box::new(NemotronCuda::load(gpu, weights, spec)?))
            }
            other => {
                return Err(ModelError::InvalidOptions(format!(
                    "{} is not a hybrid architecture",
                    other.hf_name()
                )));
            }
        };
        let buffers = Buffers::new(gpu, model.spec().hidden_size, model.widths(), t)?;
        let (_, num_rec, conv_per, ssm_per) = model.cache_shape();
        let states = StateSlots::new(gpu, num_rec, opts.num_state_slots, conv_per, ssm_per)?;
        Ok(Self {
            model,
            buffers,
            states,
        })
    }
}

impl DevModel for HybridModel {
    type Seqs = Vec<SeqState>;

    fn spec(&self) -> &ModelSpec {
        self.model.spec()
    }

    fn kv_shape(&self) -> (usize, usize) {
        let s = self.model.spec();
        (self.model.cache_shape().0, s.num_kv_heads * s.head_dim)
    }

    fn residual(&self) -> &DevBuf<f32> {
        &self.buffers.x
    }

    fn head(&self) -> (&DevBuf<f32>, &DevWeight) {
        self.model.head()
    }

    fn seqs(&self, batch: &Batch<'_>) -> Result<Vec<SeqState>, BackendError> {
        seq_states(batch, self.states.num_slots())
    }

    fn forward(
        &self,
        gpu: &Gpu,
        plan: &DevPlan,
        seqs: &Vec<SeqState>,
        cache: &DevKvCache,
        cap: &dyn Fn(usize) -> CudaResult<()>,
    ) -> CudaResult<()> {
        let dseqs = DevSeqs::new(gpu, seqs, plan.num_tokens)?;
        self.states.reset_fresh(gpu, &dseqs)?;
        let step = Step {
            gpu,
            b: &self.buffers,
            plan,
            seqs: &dseqs,
            cache,
            states: &self.states,
        };
        match &self.model {
            Model::Qwen(m) => m.forward(&step, cap),
            Model::Nemotron(m) => m.forward(&step, cap),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::context::kernel_names_for_test;
    use super::super::nvrtc::SOURCES;

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
}
