//! [`CudaBackend`]: a model on one device, its paged KV cache and the capture buffers.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use super::api::{CudaOptions, CudaUnavailable, DeviceInfo};
use super::capture::Capture;
use super::context::{CudaError, CudaResult, Gpu};
use super::dense::DenseCuda;
use super::kv_cache::{ATTN_MAX_HD, DevKvCache, DevPlan};
use crate::kernels::cpu::kv_cache::{BatchPlan, PlanLimits};
use crate::kernels::{Backend, BackendError, Batch, BatchOutput};
use crate::models::{ModelError, ModelSpec, Weights};

/// Checks the libraries and device `ordinal` (never panics, even without a driver).
pub fn probe(ordinal: usize) -> Result<DeviceInfo, CudaUnavailable> {
    // cudarc panics where a symbol is missing from an old driver: report it as an error.
    catch_unwind(|| super::context::probe(ordinal)).unwrap_or_else(|p| {
        Err(CudaUnavailable::Init(format!(
            "the CUDA driver panicked: {}",
            panic_message(&p)
        )))
    })
}

/// Whether `spec`'s architecture runs on the CUDA backend (dense models so far).
pub fn supports(spec: &ModelSpec) -> bool {
    if spec.architecture.is_hybrid() {
        return super::hybrid::check_supported(spec).is_ok();
    }
    spec.head_dim <= ATTN_MAX_HD
}

/// Loads the model of `dir` onto device `opts.device`.
pub fn load(
    dir: &Path,
    spec: ModelSpec,
    opts: CudaOptions,
) -> Result<Box<dyn Backend>, ModelError> {
    if spec.architecture.is_hybrid() {
        return super::hybrid::load(dir, spec, opts);
    }
    catch_unwind(AssertUnwindSafe(|| CudaBackend::load(dir, spec, opts)))
        .unwrap_or_else(|p| {
            Err(ModelError::InvalidOptions(format!(
                "cuda: loading panicked: {}",
                panic_message(&p)
            )))
        })
        .map(|b| Box::new(b) as Box<dyn Backend>)
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panic".into())
}

/// The CUDA implementation of [`Backend`] (field order = drop order: buffers before the
/// context they live in).
pub struct CudaBackend {
    model: DenseCuda,
    cache: DevKvCache,
    capture: Capture,
    capture_layers: Vec<usize>,
    /// layer id -> capture slot
    capture_slot: Vec<Option<usize>>,
    gpu: Gpu,
}

impl CudaBackend {
    pub fn load(dir: &Path, spec: ModelSpec, opts: CudaOptions) -> Result<Self, ModelError> {
        check_options(&spec, &opts)?;
        let gpu = Gpu::new(opts.device)?;
        tracing::info!(
            device = opts.device,
            name = %gpu.info.name,
            cc = ?gpu.info.compute_capability,
            "cuda backend: device ready"
        );
        let weights = Weights::open(dir)?;
        let model = DenseCuda::load(&gpu, &weights, spec, opts.max_num_batched_tokens)?;
        let s = model.spec();
        let cache = DevKvCache::new(
            &gpu,
            s.num_layers,
            opts.num_blocks,
            opts.block_size,
            model.kv_dim(),
            s.dtype,
        )?;
        let k = opts.capture_layers.len();
        let capture = Capture::new(&gpu, k, s.hidden_size, opts.max_num_batched_tokens)?;
        let mut capture_slot = vec![None; s.num_layers + 1];
        for (k, &id) in opts.capture_layers.iter().enumerate() {
            capture_slot[id] = Some(k);
        }
        gpu.stream.synchronize().map_err(CudaError::from)?;
        Ok(Self {
            model,
            cache,
            capture,
            capture_layers: opts.capture_layers,
            capture_slot,
            gpu,
        })
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

    fn run(&mut self, batch: &Batch<'_>, plan: &BatchPlan<'_>) -> CudaResult<BatchOutput> {
        let gpu = &self.gpu;
        self.capture.begin()?;
        let dev = DevPlan::new(gpu, batch.token_ids, plan)?;
        self.model
            .forward(gpu, &dev, &self.cache, &self.capture, &self.capture_slot)?;
        let rows: Vec<u32> = plan.sample_rows.iter().map(|&(_, r)| r as u32).collect();
        let rows_dev = gpu.upload(&rows)?;
        let tokens = self.model.greedy(gpu, &rows_dev, rows.len())?;
        let captured = self.capture.finish(plan.num_tokens())?;
        let mut sampled = vec![None; batch.seqs.len()];
        for (&(seq, _), tok) in plan.sample_rows.iter().zip(tokens) {
            sampled[seq] = Some(tok);
        }
        Ok(BatchOutput { captured, sampled })
    }
}

impl Backend for CudaBackend {
    fn hidden_size(&self) -> usize {
        self.model.spec().hidden_size
    }

    fn capture_layers(&self) -> &[usize] {
        &self.capture_layers
    }

    fn forward(&mut self, batch: &Batch<'_>) -> Result<BatchOutput, BackendError> {
        let plan = BatchPlan::new(batch, &self.limits())?;
        let t = plan.num_tokens();
        if t == 0 {
            return Ok(BatchOutput {
                captured: Vec::new(),
                sampled: vec![None; batch.seqs.len()],
            });
        }
        if t > self.model.max_tokens() {
            return Err(BackendError::InvalidBatch(format!(
                "{t} tokens exceed the CUDA backend's token budget {}",
                self.model.max_tokens()
            )));
        }
        Ok(self.run(batch, &plan)?)
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // Nothing may still run on buffers about to be freed.
        let _ = self.gpu.stream.synchronize();
        let _ = self.gpu.copy_stream.synchronize();
    }
}

fn check_options(spec: &ModelSpec, opts: &CudaOptions) -> Result<(), ModelError> {
    let bad = |m: String| Err(ModelError::InvalidOptions(m));
    if !supports(spec) {
        return bad(format!(
            "{} does not run on the CUDA backend yet (dense Llama/Qwen2/Qwen3/Mistral with \
             head_dim <= {ATTN_MAX_HD} do; use device = \"cpu\")",
            spec.architecture.hf_name()
        ));
    }
    if opts.block_size == 0 || opts.num_blocks == 0 || opts.max_num_batched_tokens == 0 {
        return bad(format!(
            "num_blocks ({}), block_size ({}) and max_num_batched_tokens ({}) must be > 0",
            opts.num_blocks, opts.block_size, opts.max_num_batched_tokens
        ));
    }
    let int = i32::MAX as usize;
    if opts.num_blocks > int || opts.max_num_batched_tokens > int || opts.block_size > int {
        return bad("num_blocks, block_size and max_num_batched_tokens must fit in i32".into());
    }
    if spec.max_position_embeddings > int {
        return bad("max_position_embeddings must fit in i32".into());
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
