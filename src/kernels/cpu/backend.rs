//! [`CpuBackend`]: a model (dense, Qwen3.5 / Qwen3-Next, Nemotron-H), its paged KV cache (full
//! attention layers only), the recurrent-state slots of hybrid models and a private rayon pool.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use super::kv_cache::{BatchPlan, KvCache, PlanLimits};
use super::recurrent::{SeqState, StateCache, seq_states};
use crate::kernels::{Backend, BackendError, Batch, BatchOutput};
use crate::models::dense::DenseModel;
use crate::models::nemotron_h::NemotronHModel;
use crate::models::qwen3_5::QwenHybridModel;
use crate::models::{Architecture, ModelError, ModelSpec, Weights};

/// How to build a [`CpuBackend`].
#[derive(Debug, Clone)]
pub struct CpuOptions {
    /// Layer ids to capture, ascending, each in `0..=L` (DESIGN.md §1.1).
    pub capture_layers: Vec<usize>,
    /// KV cache blocks per layer.
    pub num_blocks: usize,
    /// Positions per KV block.
    pub block_size: usize,
    /// Threads of the backend's rayon pool; 0 = all cores.
    pub threads: usize,
    /// Recurrent-state slots (hybrid models: one per running request, i.e. `max_num_seqs`;
    /// ignored for dense models).
    pub num_state_slots: usize,
}

/// The model families, dispatched by architecture.
enum Model {
    Dense(DenseModel),
    Qwen(QwenHybridModel),
    Nemotron(NemotronHModel),
}

impl Model {
    fn load(weights: &Weights, spec: ModelSpec) -> Result<Self, ModelError> {
        Ok(match spec.architecture {
            Architecture::Qwen3_5 | Architecture::Qwen3Next => {
                Self::Qwen(QwenHybridModel::load(weights, spec)?)
            }
            Architecture::NemotronH => Self::Nemotron(NemotronHModel::load(weights, spec)?),
            _ => Self::Dense(DenseModel::load(weights, spec)?),
        })
    }

    fn spec(&self) -> &ModelSpec {
        match self {
            Self::Dense(m) => m.spec(),
            Self::Qwen(m) => m.spec(),
            Self::Nemotron(m) => m.spec(),
        }
    }

    /// (KV cache layers, floats per KV slot).
    fn kv_shape(&self) -> (usize, usize) {
        match self {
            Self::Dense(m) => (m.spec().num_layers, m.kv_dim()),
            Self::Qwen(m) => (m.num_attention_layers(), m.kv_dim()),
            Self::Nemotron(m) => (m.num_attention_layers(), m.kv_dim()),
        }
    }

    fn state_shapes(&self) -> Vec<(usize, usize)> {
        match self {
            Self::Dense(_) => Vec::new(),
            Self::Qwen(m) => m.state_shapes(),
            Self::Nemotron(m) => m.state_shapes(),
        }
    }

    fn final_norm(&self, x: &[f32]) -> Vec<f32> {
        match self {
            Self::Dense(m) => m.final_norm(x),
            Self::Qwen(m) => m.final_norm(x),
            Self::Nemotron(m) => m.final_norm(x),
        }
    }

    fn greedy(&self, rows: &[f32], threads: usize) -> Vec<u32> {
        match self {
            Self::Dense(m) => m.greedy(rows, threads),
            Self::Qwen(m) => m.greedy(rows, threads),
            Self::Nemotron(m) => m.greedy(rows, threads),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        tokens: &[u32],
        plan: &BatchPlan<'_>,
        seqs: &[SeqState],
        cache: &mut KvCache,
        states: &mut StateCache,
        threads: usize,
        capture: &mut dyn FnMut(usize, &[f32]),
    ) -> Vec<f32> {
        match self {
            Self::Dense(m) => m.forward(tokens, plan, cache, threads, capture),
            Self::Qwen(m) => m.forward(tokens, plan, seqs, cache, states, threads, capture),
            Self::Nemotron(m) => m.forward(tokens, plan, seqs, cache, states, threads, capture),
        }
    }
}

/// The CPU implementation of [`Backend`].
pub struct CpuBackend {
    model: Model,
    cache: KvCache,
    /// Recurrent state of hybrid models (no layers for dense ones).
    states: StateCache,
    pool: rayon::ThreadPool,
    threads: usize,
    capture_layers: Vec<usize>,
    /// layer id -> index into `capture_layers`
    capture_slot: Vec<Option<usize>>,
}

impl CpuBackend {
    /// Loads the weights of `dir` for `spec` (from [`ModelSpec::from_dir`]) and allocates the
    /// KV cache.
    pub fn load(dir: &Path, spec: ModelSpec, opts: CpuOptions) -> Result<Self, ModelError> {
        check_options(&spec, &opts)?;
        let threads = match opts.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("hsx-cpu-{i}"))
            .build()
            .map_err(|e| {
                ModelError::InvalidOptions(format!("cannot start {threads} threads: {e}"))
            })?;
        let weights = Weights::open(dir)?;
        let model = pool.install(|| Model::load(&weights, spec))?;
        let (kv_layers, kv_dim) = model.kv_shape();
        let cache = KvCache::new(kv_layers, opts.num_blocks, opts.block_size, kv_dim)
            .map_err(ModelError::InvalidOptions)?;
        let state_shapes = model.state_shapes();
        let slots = if state_shapes.is_empty() {
            0
        } else {
            opts.num_state_slots
        };
        let states = StateCache::new(&state_shapes, slots).map_err(ModelError::InvalidOptions)?;
        let capture_slot = capture_slots(&opts.capture_layers, model.spec().num_layers);
        Ok(Self {
            model,
            cache,
            states,
            pool,
            threads,
            capture_layers: opts.capture_layers,
            capture_slot,
        })
    }

    pub fn spec(&self) -> &ModelSpec {
        self.model.spec()
    }

    /// Threads of the backend's pool.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The model's final RMSNorm over `hidden`-wide rows: turns captured id-L rows into Hugging
    /// Face's post-norm `hidden_states[L]`.
    pub fn final_norm(&self, rows: &[f32]) -> Vec<f32> {
        self.pool.install(|| self.model.final_norm(rows))
    }

    fn limits(&self) -> PlanLimits {
        PlanLimits::new(
            self.model.spec(),
            self.cache.num_blocks(),
            self.cache.block_size(),
        )
    }

    fn run(&mut self, batch: &Batch<'_>, plan: &BatchPlan<'_>, seqs: &[SeqState]) -> BatchOutput {
        let h = self.model.spec().hidden_size;
        let k = self.capture_layers.len();
        let t = plan.num_tokens();
        let mut captured = vec![0.0f32; t * k * h];
        let (model, cache, states, slots, threads) = (
            &self.model,
            &mut self.cache,
            &mut self.states,
            &self.capture_slot,
            self.threads,
        );
        states.reset_fresh(seqs);
        let sampled_tokens = self.pool.install(|| {
            let mut capture = |id: usize, x: &[f32]| {
                if let Some(ki) = slots[id] {
                    for (row, dst) in x.chunks_exact(h).zip(captured.chunks_exact_mut(k * h)) {
                        dst[ki * h..(ki + 1) * h].copy_from_slice(row);
                    }
                }
            };
            let last = model.forward(
                batch.token_ids,
                plan,
                seqs,
                cache,
                states,
                threads,
                &mut capture,
            );
            let rows: Vec<f32> = plan
                .sample_rows
                .iter()
                .flat_map(|&(_, r)| last[r * h..(r + 1) * h].iter().copied())
                .collect();
            model.greedy(&rows, threads)
        });
        BatchOutput {
            captured,
            sampled: plan.sampled(sampled_tokens, batch.seqs.len()),
        }
    }
}

impl Backend for CpuBackend {
    fn hidden_size(&self) -> usize {
        self.model.spec().hidden_size
    }

    fn capture_layers(&self) -> &[usize] {
        &self.capture_layers
    }

    fn forward(&mut self, batch: &Batch<'_>) -> Result<BatchOutput, BackendError> {
        let plan = BatchPlan::new(batch, &self.limits())?;
        let seqs = if self.model.spec().has_recurrent_layers() {
            seq_states(batch, self.states.num_slots())?
        } else {
            Vec::new()
        };
        if plan.num_tokens() == 0 {
            return Ok(BatchOutput::empty(batch));
        }
        catch_unwind(AssertUnwindSafe(|| self.run(batch, &plan, &seqs))).map_err(|panic| {
            let msg = panic_message(panic.as_ref());
            BackendError::Compute(format!("cpu forward panicked: {msg}"))
        })
    }
}

fn check_options(spec: &ModelSpec, opts: &CpuOptions) -> Result<(), ModelError> {
    let bad = |m: String| Err(ModelError::InvalidOptions(m));
    if opts.block_size == 0 || opts.num_blocks == 0 {
        return bad(format!(
            "num_blocks ({}) and block_size ({}) must be > 0",
            opts.num_blocks, opts.block_size
        ));
    }
    if opts.num_blocks > u32::MAX as usize {
        return bad(format!(
            "num_blocks {} does not fit block ids (u32)",
            opts.num_blocks
        ));
    }
    if spec.has_recurrent_layers() && opts.num_state_slots == 0 {
        return bad(format!(
            "{} has recurrent layers and needs num_state_slots > 0 (one per running request)",
            spec.architecture.hf_name()
        ));
    }
    check_capture_layers(spec, &opts.capture_layers)
}

/// Capture layer ids are in `0..=L` and strictly ascending (every backend's options).
pub(crate) fn check_capture_layers(spec: &ModelSpec, layers: &[usize]) -> Result<(), ModelError> {
    let bad = |m: String| Err(ModelError::InvalidOptions(m));
    let l = spec.num_layers;
    if let Some(&id) = layers.iter().find(|&&id| id > l) {
        return bad(format!("capture layer {id} is out of range 0..={l}"));
    }
    if layers.windows(2).any(|w| w[0] >= w[1]) {
        return bad(format!(
            "capture layers {layers:?} must be strictly ascending"
        ));
    }
    Ok(())
}

/// Layer id (`0..=num_layers`) -> index of that id in `capture_layers` (checked ids).
pub(crate) fn capture_slots(capture_layers: &[usize], num_layers: usize) -> Vec<Option<usize>> {
    let mut slots = vec![None; num_layers + 1];
    for (k, &id) in capture_layers.iter().enumerate() {
        slots[id] = Some(k);
    }
    slots
}

/// The message of a caught panic.
pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panic".into())
}
