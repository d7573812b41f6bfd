//! [`DevBackend`]: a model on one device (the dense decoder or a hybrid, behind [`DevModel`]),
//! its paged KV cache and the capture buffers; and [`residual_stream`], the layer loop every
//! model runs.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use super::api::{CudaOptions, CudaUnavailable, DeviceInfo};
use super::capture::Capture;
use super::context::{CudaError, CudaResult, DevBuf, Gpu};
use super::dense::DenseCuda;
use super::gemm::linear;
use super::hybrid::HybridModel;
use super::kv_cache::{ATTN_MAX_HD, DevKvCache, DevPlan};
use super::ops;
use super::weights::DevWeight;
use crate::kernels::cpu::backend::{capture_slots, check_capture_layers, panic_message};
use crate::kernels::cpu::kv_cache::{BatchPlan, PlanLimits};
use crate::kernels::{Backend, BackendError, Batch, BatchOutput};
use crate::models::{ModelError, ModelSpec, Weights};

/// Checks the libraries and device `ordinal` (never panics, even without a driver).
pub fn probe(ordinal: usize) -> Result<DeviceInfo, CudaUnavailable> {
    // cudarc panics where a symbol is missing from an old driver: report it as an error.
    catch_unwind(|| super::context::probe(ordinal)).unwrap_or_else(|p| {
        Err(CudaUnavailable::Init(format!(
            "the CUDA driver panicked: {}",
            panic_message(p.as_ref())
        )))
    })
}

/// Why `spec` does not run on the CUDA backend (`None`: it does).
fn unsupported(spec: &ModelSpec) -> Option<String> {
    if spec.architecture.is_hybrid() {
        return super::hybrid::check_supported(spec).err();
    }
    (spec.head_dim > ATTN_MAX_HD).then(|| format!("head_dim {} > {ATTN_MAX_HD}", spec.head_dim))
}

/// Whether `spec`'s architecture runs on the CUDA backend.
pub fn supports(spec: &ModelSpec) -> bool {
    unsupported(spec).is_none()
}

/// Loads the model of `dir` onto device `opts.device`.
pub fn load(
    dir: &Path,
    spec: ModelSpec,
    opts: CudaOptions,
) -> Result<Box<dyn Backend>, ModelError> {
    catch_unwind(AssertUnwindSafe(
        || -> Result<Box<dyn Backend>, ModelError> {
            if spec.architecture.is_hybrid() {
                return Ok(Box::new(DevBackend::load(
                    dir,
                    spec,
                    opts,
                    HybridModel::load,
                )?));
            }
            Ok(Box::new(DevBackend::load(
                dir,
                spec,
                opts,
                DenseCuda::load,
            )?))
        },
    ))
    .unwrap_or_else(|p| {
        Err(ModelError::InvalidOptions(format!(
            "cuda: loading panicked: {}",
            panic_message(p.as_ref())
        )))
    })
}

/// A model on the device, as [`DevBackend`] drives it.
pub(super) trait DevModel: Send {
    /// What a batch needs beyond its plan (the hybrids' recurrent-state chunks).
    type Seqs;
    fn spec(&self) -> &ModelSpec;
    /// (KV cache layers, floats per KV slot).
    fn kv_shape(&self) -> (usize, usize);
    /// The residual stream `[T, hidden]` (f32) that captures and the greedy pick read.
    fn residual(&self) -> &DevBuf<f32>;
    /// (final norm weight, LM head) of the greedy pick.
    fn head(&self) -> (&DevBuf<f32>, &DevWeight);
    /// Checks `batch` beyond its plan.
    fn seqs(&self, batch: &Batch<'_>) -> Result<Self::Seqs, BackendError>;
    /// Runs every layer; `cap(id)` captures the residual stream for ids 0..=L. Leaves the last
    /// layer's (pre-norm) output in [`DevModel::residual`].
    fn forward(
        &self,
        gpu: &Gpu,
        plan: &DevPlan,
        seqs: &Self::Seqs,
        cache: &DevKvCache,
        cap: &dyn Fn(usize) -> CudaResult<()>,
    ) -> CudaResult<()>;
}

/// The residual stream `x`, the normed rows `normed` (GEMM input dtype) and a block's output
/// `proj`, `[T, hidden]` each.
pub(super) type Stream<'a> = (&'a DevBuf<f32>, &'a DevBuf<f32>, &'a DevBuf<f32>);

/// The layer loop of every model: `x = embed(tokens)` (id 0); per block `i`, block i-1's output
/// added into `x` and fused with block i's input norm (weight at `norm(block)`) into `normed`
/// (id i), then `body(i, block)` (reads `normed`, leaves its output in `proj`); last
/// `x += proj` (id L). The adds are exact in f32, so a captured row is the residual stream.
#[allow(clippy::too_many_arguments)]
pub(super) fn residual_stream<B>(
    gpu: &Gpu,
    spec: &ModelSpec,
    embed: &DevWeight,
    plan: &DevPlan,
    (x, normed, proj): Stream<'_>,
    blocks: &[B],
    norm: impl Fn(&B) -> u64,
    cap: &dyn Fn(usize) -> CudaResult<()>,
    mut body: impl FnMut(usize, &B) -> CudaResult<()>,
) -> CudaResult<()> {
    let t = plan.num_tokens;
    let (h, eps, dt) = (spec.hidden_size, spec.rms_norm_eps, spec.dtype);
    x.check(t * h, "tokens beyond the budget")?;
    ops::embed(gpu, plan.tokens.ptr(), embed, x.ptr(), t)?;
    cap(0)?;
    let (x, normed, proj) = (x.ptr(), normed.ptr(), proj.ptr());
    for (i, block) in blocks.iter().enumerate() {
        let w = norm(block);
        if i == 0 {
            ops::rms_norm(gpu, x, w, normed, dt, t, h, eps)?;
        } else {
            // Block i-1's residual add, fused with this block's input norm.
            ops::add_rms_norm(gpu, x, proj, w, normed, dt, t, h, eps)?;
            cap(i)?;
        }
        body(i, block)?;
    }
    ops::add(gpu, x, proj, t * h)?;
    cap(blocks.len())
}

/// The CUDA implementation of [`Backend`] (field order = drop order: buffers before the
/// context they live in).
pub(super) struct DevBackend<M> {
    model: M,
    cache: DevKvCache,
    capture: Capture,
    capture_layers: Vec<usize>,
    /// layer id -> capture slot
    capture_slot: Vec<Option<usize>>,
    max_tokens: usize,
    gpu: Gpu,
}

impl<M: DevModel> DevBackend<M> {
    fn load(
        dir: &Path,
        spec: ModelSpec,
        opts: CudaOptions,
        load_model: impl FnOnce(&Gpu, &Weights, ModelSpec, &CudaOptions) -> Result<M, ModelError>,
    ) -> Result<Self, ModelError> {
        check_options(&spec, &opts)?;
        let gpu = Gpu::new(opts.device)?;
        tracing::info!(
            device = opts.device,
            name = %gpu.info.name,
            cc = ?gpu.info.compute_capability,
            arch = spec.architecture.hf_name(),
            "cuda backend: device ready"
        );
        let weights = Weights::open(dir)?;
        let model = load_model(&gpu, &weights, spec, &opts)?;
        let s = model.spec();
        let (kv_layers, kv_dim) = model.kv_shape();
        let (blocks, block_size) = (opts.num_blocks, opts.block_size);
        let cache = DevKvCache::new(&gpu, kv_layers, blocks, block_size, kv_dim, s.dtype)?;
        let t = opts.max_num_batched_tokens;
        let capture = Capture::new(&gpu, opts.capture_layers.len(), s.hidden_size, t)?;
        let capture_slot = capture_slots(&opts.capture_layers, s.num_layers);
        gpu.stream.synchronize().map_err(CudaError::from)?;
        Ok(Self {
            model,
            cache,
            capture,
            capture_layers: opts.capture_layers,
            capture_slot,
            max_tokens: t,
            gpu,
        })
    }

    fn run(
        &mut self,
        batch: &Batch<'_>,
        plan: &BatchPlan<'_>,
        seqs: &M::Seqs,
    ) -> CudaResult<BatchOutput> {
        let (gpu, t) = (&self.gpu, plan.num_tokens());
        self.capture.begin()?;
        let dev = DevPlan::new(gpu, batch.token_ids, plan)?;
        let (capture, slots) = (&self.capture, &self.capture_slot);
        let x = self.model.residual().ptr();
        let cap = |id: usize| match slots.get(id).copied().flatten() {
            Some(k) => capture.capture(gpu, k, x, t),
            None => Ok(()),
        };
        self.model.forward(gpu, &dev, seqs, &self.cache, &cap)?;
        let rows: Vec<u32> = plan.sample_rows.iter().map(|&(_, r)| r as u32).collect();
        let tokens = self.greedy(&rows)?;
        let captured = self.capture.finish(t)?;
        let sampled = plan.sampled(tokens, batch.seqs.len());
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
        let x = self.model.residual().ptr();
        ops::gather_rows(gpu, x, rows_dev.ptr(), last.ptr(), n, h)?;
        let (norm, head) = self.model.head();
        let eps = s.rms_norm_eps;
        ops::rms_norm(gpu, last.ptr(), norm.ptr(), normed.ptr(), dt, n, h, eps)?;
        linear(gpu, normed.ptr(), head, logits.ptr(), n)?;
        ops::argmax(gpu, logits.ptr(), n, v, out.ptr())?;
        gpu.download(&out, n)
    }
}

impl<M: DevModel> Backend for DevBackend<M> {
    fn hidden_size(&self) -> usize {
        self.model.spec().hidden_size
    }

    fn capture_layers(&self) -> &[usize] {
        &self.capture_layers
    }

    fn forward(&mut self, batch: &Batch<'_>) -> Result<BatchOutput, BackendError> {
        let (blocks, block_size) = (self.cache.num_blocks(), self.cache.block_size());
        let plan = BatchPlan::new(
            batch,
            &PlanLimits::new(self.model.spec(), blocks, block_size),
        )?;
        let seqs = self.model.seqs(batch)?;
        let t = plan.num_tokens();
        if t == 0 {
            return Ok(BatchOutput::empty(batch));
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

impl<M> Drop for DevBackend<M> {
    fn drop(&mut self) {
        // Nothing may still run on buffers about to be freed.
        let _ = self.gpu.stream.synchronize();
        let _ = self.gpu.copy_stream.synchronize();
    }
}

fn check_options(spec: &ModelSpec, opts: &CudaOptions) -> Result<(), ModelError> {
    let bad = |m: String| Err(ModelError::InvalidOptions(m));
    if let Some(why) = unsupported(spec) {
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
    // Dense models ignore num_state_slots.
    let slots = if spec.architecture.is_hybrid() {
        opts.num_state_slots
    } else {
        0
    };
    let int = i32::MAX as usize;
    if opts.num_blocks > int
        || opts.max_num_batched_tokens > int
        || opts.block_size > int
        || slots > int
        || spec.max_position_embeddings > int
    {
        return bad(
            "num_blocks, block_size, num_state_slots, max_num_batched_tokens and \
             max_position_embeddings must fit in i32"
                .into(),
        );
    }
    check_capture_layers(spec, &opts.capture_layers)
}
