//! Wires the actors into a running engine: loads the model, spawns the block manager,
//! connector, event hub and scheduler, and starts the model runner thread.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use thiserror::Error;

use crate::actors::block_manager::PoolStats;
use crate::actors::block_manager::{BlockManagerHandle, BlockPool, SnapshotSlots};
use crate::actors::connector::ConnectorStats;
use crate::actors::connector::{ConnectorHandle, ConnectorOptions, FileLayout};
use crate::actors::events::{
    EventHubHandle, EventHubOptions, HubStats, Subscription, open_journal,
};
use crate::actors::messages::{InvalidRequestId, OutputDtype, Request, RequestId};
use crate::actors::model_runner::{self, RowShape, RunnerLinks};
use crate::actors::scheduler::{
    SchedulerHandle, SchedulerLimits, SchedulerLinks, SchedulerState, SchedulerStats, SubmitError,
};
use crate::config::{Config, ConfigError, DeviceChoice, resolve_layer_ids};
use crate::kernels::cuda;
use crate::models::{
    CpuBackend, CpuOptions, CudaOptions, cuda_supports, load_cuda as load_on_cuda,
};
use crate::models::{ModelError, ModelSpec, WeightDtype};

#[derive(Debug, Error)]
pub enum EngineError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("cannot create output directory {path}: {source}")]
    OutputDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot start the model runner thread: {0}")]
    Thread(std::io::Error),
    #[error("model loading failed: {0}")]
    Load(String),
    /// Positions past the model's are refused at start (its RoPE tables and the runner's
    /// checks stop there), not after a request has run up to them.
    #[error(
        "engine.max_model_len {asked} exceeds the model's {limit} {model_max} (0 takes the \
         model's){note}"
    )]
    MaxModelLen {
        asked: usize,
        model_max: usize,
        /// The config field that sets the model's limit, and why where it is not the obvious one.
        limit: &'static str,
        note: &'static str,
    },
    #[error(transparent)]
    Connector(#[from] crate::actors::connector::ConnectorError),
    #[error("cannot open the event journal {path}: {source}")]
    Journal {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What the engine runs, as clients need to know it.
#[derive(Debug, Clone)]
pub struct EngineInfo {
    pub model_name: String,
    pub num_layers: usize,
    /// Values per token of each captured layer: the model's residual-stream width (its hidden
    /// size, or `streams · hidden` with hyper-connections).
    pub hidden_size: usize,
    pub vocab_size: usize,
    pub layer_ids: Vec<usize>,
    pub dtype: OutputDtype,
    pub max_model_len: usize,
    pub output_dir: PathBuf,
    pub max_waiting: usize,
    /// The model directory (tokenizer.json and tokenizer_config.json live there).
    pub model_dir: PathBuf,
    /// The device and its kernels, in words (e.g. `cpu (2 threads, bf16 GEMM: amx)`).
    pub device: String,
}

/// A request as a client describes it.
#[derive(Debug, Clone)]
pub struct RequestSpec {
    pub id: String,
    pub token_ids: Vec<u32>,
    pub max_tokens: u32,
    pub include_output_tokens: bool,
}

const MAILBOX: usize = 256;

pub struct Engine {
    info: EngineInfo,
    scheduler: SchedulerHandle,
    blocks: BlockManagerHandle,
    connector: ConnectorHandle,
    events: EventHubHandle,
    runner: std::sync::Mutex<Option<JoinHandle<()>>>,
    /// The scheduler's limits, to check requests before submitting them.
    limits: SchedulerLimits,
}

impl Engine {
    /// Loads the model and starts every actor; events are journaled in memory only.
    pub async fn start(cfg: &Config) -> Result<Self, EngineError> {
        Self::start_with_journal(cfg, None).await
    }

    /// Like [`Self::start`], with events also journaled to (and restored from) a file.
    pub async fn start_with_journal(
        cfg: &Config,
        journal: Option<&Path>,
    ) -> Result<Self, EngineError> {
        let spec = ModelSpec::from_dir(&cfg.model.path)?;
        let layer_ids = resolve_layer_ids(cfg.engine.layer_ids.as_deref(), spec.num_layers)?;
        let info = engine_info(cfg, &spec, layer_ids)?;
        std::fs::create_dir_all(&info.output_dir).map_err(|source| EngineError::OutputDir {
            path: info.output_dir.clone(),
            source,
        })?;
        let has_recurrent = spec.has_recurrent_layers();
        let mut backend = load_backend(cfg, spec, &info.layer_ids, info.dtype).await?;
        let mut info = info;
        info.device = backend.device_name();
        tracing::info!(device = %info.device, "model loaded");

        let e = &cfg.engine;
        // Hybrid models keep one recurrent-state slot per running request.
        let state_slots = if has_recurrent { e.max_num_seqs } else { 0 };
        let hub_options = EventHubOptions {
            journal_capacity: cfg.events.journal_capacity,
            subscriber_capacity: cfg.events.subscriber_buffer,
            ..EventHubOptions::default()
        };
        let events = match journal {
            None => EventHubHandle::spawn(hub_options),
            Some(path) => {
                let journal =
                    open_journal(&hub_options, path).map_err(|source| EngineError::Journal {
                        path: path.to_owned(),
                        source,
                    })?;
                EventHubHandle::spawn_with_journal(journal, hub_options.mailbox)
            }
        };
        let layout = FileLayout {
            layer_ids: info.layer_ids.clone(),
            hidden_size: info.hidden_size,
            dtype: info.dtype,
            model: info.model_name.clone(),
        };
        let row_bytes = layout.row_bytes();
        let (release_tx, release_rx) = tokio::sync::mpsc::unbounded_channel();
        let pool = BlockPool::new(e.num_blocks, e.block_size, state_slots)
            .with_prefix_cache(e.prefix_cache_bytes);
        let pool = match has_recurrent {
            true => with_state_snapshots(pool, backend.as_mut(), e)?,
            false => pool,
        };
        let caching = pool.caches_prefixes();
        let blocks = BlockManagerHandle::spawn(pool, MAILBOX);
        let connector = ConnectorHandle::spawn_reporting(
            layout,
            ConnectorOptions {
                lock_files: cfg.output.lock_files,
                max_concurrent_writes: cfg.output.max_concurrent_writes,
                mailbox: MAILBOX,
            },
            events.clone(),
            Some(release_tx),
        )?;
        let (plan_tx, plan_rx) = flume::bounded(1);
        let limits = SchedulerLimits {
            max_num_batched_tokens: e.max_num_batched_tokens,
            max_num_seqs: e.max_num_seqs,
            max_waiting: e.max_waiting,
            max_model_len: info.max_model_len,
            vocab_size: info.vocab_size,
            kv_capacity_tokens: e.num_blocks * e.block_size,
            row_bytes,
            max_pending_bytes: e.max_pending_bytes,
        };
        let links = SchedulerLinks {
            blocks: blocks.clone(),
            runner: plan_tx,
            connector: connector.clone(),
            events: events.clone(),
            releases: Some(release_rx),
        };
        let scheduler = SchedulerHandle::spawn(SchedulerState::new(limits.clone()), links, MAILBOX);
        let shape = RowShape {
            layers: info.layer_ids.len(),
            hidden: info.hidden_size,
            dtype: info.dtype,
        };
        let runner_links = RunnerLinks {
            scheduler: scheduler.actor().clone(),
            connector: connector.clone(),
            blocks: caching.then(|| (blocks.clone(), e.block_size)),
        };
        let step_tokens = e.max_num_batched_tokens;
        let runner = model_runner::spawn(backend, shape, step_tokens, plan_rx, runner_links)
            .map_err(EngineError::Thread)?;
        Ok(Self {
            info,
            scheduler,
            blocks,
            connector,
            events,
            runner: std::sync::Mutex::new(Some(runner)),
            limits,
        })
    }

    /// The checks `submit` makes on a request's own content (empty, too long, token ids,
    /// cache size), without submitting it.
    pub fn validate(&self, req: &Request) -> Result<(), SubmitError> {
        self.limits.validate(req)
    }

    pub fn info(&self) -> &EngineInfo {
        &self.info
    }

    /// The final file name of a request id.
    pub fn output_path(&self, id: &RequestId) -> PathBuf {
        self.info.output_dir.join(format!("{id}.safetensors"))
    }

    /// Builds a request whose file goes to the output dir.
    pub fn request(&self, spec: RequestSpec) -> Result<Request, InvalidRequestId> {
        self.request_with_path(spec, None)
    }

    /// Builds a request whose file goes to `path` (checked by the caller), or to the output dir.
    pub fn request_with_path(
        &self,
        spec: RequestSpec,
        path: Option<PathBuf>,
    ) -> Result<Request, InvalidRequestId> {
        let id = RequestId::new(&spec.id)?;
        Ok(Request {
            path: path.unwrap_or_else(|| self.output_path(&id)),
            id,
            prompt: Arc::from(spec.token_ids),
            max_tokens: spec.max_tokens,
            include_output_tokens: spec.include_output_tokens,
            prefixes: Vec::new(),
        })
    }

    pub async fn submit(&self, req: Request) -> Result<(), SubmitError> {
        self.scheduler.submit(req).await
    }

    pub async fn abort(&self, id: RequestId) {
        self.scheduler.abort(id).await
    }

    /// Live events; with `Some(seq)`, first every kept event numbered after `seq`.
    pub async fn subscribe(&self, from_seq: Option<u64>) -> Subscription {
        self.events.subscribe(from_seq).await
    }

    pub async fn status(&self) -> Option<SchedulerStats> {
        self.scheduler.status().await
    }

    /// Host memory held by the connector.
    pub async fn connector_stats(&self) -> Option<ConnectorStats> {
        self.connector.stats().await.ok()
    }

    /// KV blocks and state slots in use.
    pub async fn block_stats(&self) -> Option<PoolStats> {
        self.blocks.stats().await
    }

    /// The event hub's last seq and subscribers.
    pub async fn event_stats(&self) -> Option<HubStats> {
        self.events.stats().await
    }

    /// Stops accepting work, lets queued and running requests finish and their files be
    /// written, then stops every actor and the runner thread. Later calls return at once.
    pub async fn shutdown(&self) {
        self.scheduler.stop_accepting().await;
        while let Some(s) = self.scheduler.status().await {
            if s.waiting == 0 && s.running == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let _ = self.connector.flush().await;
        self.scheduler.stop().await;
        let runner = self.runner.lock().map(|mut r| r.take()).unwrap_or(None);
        if let Some(runner) = runner {
            let _ = tokio::task::spawn_blocking(move || runner.join()).await;
        }
        let _ = self.connector.stop().await;
        self.blocks.stop().await;
        self.events.stop().await;
    }
}

/// Why a LongRoPE model's requests stop at `original_max_position_embeddings`.
const LONGROPE_LIMIT: &str = "; LongRoPE: hsx runs its short factors, which transformers uses up \
                              to there (past it, the long ones)";

fn engine_info(
    cfg: &Config,
    spec: &ModelSpec,
    layer_ids: Vec<usize>,
) -> Result<EngineInfo, EngineError> {
    let weights = match spec.dtype {
        WeightDtype::F32 => OutputDtype::F32,
        WeightDtype::Bf16 => OutputDtype::Bf16,
        WeightDtype::F16 => OutputDtype::F16,
    };
    let model_max = spec.max_position_embeddings;
    let (limit, note) = match spec.longrope.is_some() {
        true => ("original_max_position_embeddings", LONGROPE_LIMIT),
        false => ("max_position_embeddings", ""),
    };
    if !note.is_empty() {
        tracing::warn!("requests up to {model_max} tokens{note}");
    }
    let max_model_len = match cfg.engine.max_model_len {
        0 => model_max,
        n if n > model_max => {
            return Err(EngineError::MaxModelLen {
                asked: n,
                model_max,
                limit,
                note,
            });
        }
        n => n,
    };
    Ok(EngineInfo {
        model_name: spec.name.clone(),
        num_layers: spec.num_layers,
        hidden_size: spec.stream_width(),
        vocab_size: spec.vocab_size,
        layer_ids,
        dtype: cfg.engine.dtype.resolve(weights),
        max_model_len,
        output_dir: cfg.output.dir.clone(),
        max_waiting: cfg.engine.max_waiting,
        model_dir: cfg.model.path.clone(),
        device: String::new(),
    })
}

async fn load_backend(
    cfg: &Config,
    spec: ModelSpec,
    layer_ids: &[usize],
    dtype: OutputDtype,
) -> Result<Box<dyn crate::kernels::Backend>, EngineError> {
    let choice = DeviceChoice::parse(&cfg.model.device)?;
    let device = match choice {
        DeviceChoice::Cpu => None,
        DeviceChoice::Cuda(n) => Some(n),
        DeviceChoice::Auto => auto_device(&spec),
    };
    match device {
        // `auto` falls back to the CPU on any CUDA start-up failure (kernel compile, memory,
        // driver), not only a missing library.
        Some(ordinal) if choice == DeviceChoice::Auto => {
            match load_cuda(cfg, spec.clone(), layer_ids, ordinal, dtype).await {
                Ok(backend) => Ok(backend),
                Err(e) => {
                    tracing::warn!(
                        "model.device = auto: CUDA failed to start ({e}), using the CPU"
                    );
                    load_cpu(cfg, spec, layer_ids, dtype).await
                }
            }
        }
        Some(ordinal) => load_cuda(cfg, spec, layer_ids, ordinal, dtype).await,
        None => load_cpu(cfg, spec, layer_ids, dtype).await,
    }
}

/// `device = "auto"`: CUDA device 0 when it is usable and runs this architecture, else CPU.
fn auto_device(spec: &ModelSpec) -> Option<usize> {
    match cuda::probe(0) {
        Ok(info) if cuda_supports(spec) => {
            tracing::info!(device = %info.name, "model.device = auto: using CUDA device 0");
            Some(0)
        }
        Ok(_) => {
            tracing::info!(
                "model.device = auto: {} does not run on CUDA yet, using the CPU",
                spec.architecture.hf_name()
            );
            None
        }
        Err(why) => {
            tracing::info!("model.device = auto: using the CPU ({why})");
            None
        }
    }
}

/// Hybrid models' prefix reuse: snapshot slots for the recurrent state at block boundaries,
/// as many as `prefix_cache_bytes` holds (at most one per KV block), made on the backend.
fn with_state_snapshots(
    pool: BlockPool,
    backend: &mut dyn crate::kernels::Backend,
    e: &crate::config::EngineSection,
) -> Result<BlockPool, EngineError> {
    let bytes = backend.state_slot_bytes();
    let count = match bytes {
        0 => 0,
        _ => (e.prefix_cache_bytes / bytes).min(e.num_blocks),
    };
    if count == 0 {
        if e.prefix_cache_bytes > 0 {
            tracing::warn!(
                state_bytes = bytes,
                "engine.prefix_cache_bytes holds no recurrent-state snapshot: no prefix reuse"
            );
        }
        return Ok(pool);
    }
    let first = (backend.add_snapshot_slots(count))
        .map_err(|err| EngineError::Load(format!("prefix cache snapshot slots: {err}")))?;
    let slots = SnapshotSlots {
        first: first as u32,
        count,
        bytes,
    };
    Ok(pool.with_hybrid_prefix_cache(e.prefix_cache_bytes, slots))
}

async fn load_cuda(
    cfg: &Config,
    spec: ModelSpec,
    layer_ids: &[usize],
    ordinal: usize,
    dtype: OutputDtype,
) -> Result<Box<dyn crate::kernels::Backend>, EngineError> {
    // Fails at start with the probe's reason (no feature, no driver, no device...).
    cuda::probe(ordinal)
        .map_err(|e| EngineError::Load(format!("model.device cuda:{ordinal}: {e}")))?;
    let dir: PathBuf = cfg.model.path.clone();
    let opts = CudaOptions {
        capture_layers: layer_ids.to_vec(),
        num_blocks: cfg.engine.num_blocks,
        block_size: cfg.engine.block_size,
        num_state_slots: cfg.engine.max_num_seqs,
        max_num_batched_tokens: cfg.engine.max_num_batched_tokens,
        device: ordinal,
        output_dtype: dtype,
        reject_bad_states: cfg.engine.reject_bad_states,
        host_tables_above: cuda::limits::HOST_TABLE_BYTES,
    };
    tokio::task::spawn_blocking(move || load_on_cuda(Path::new(&dir), spec, opts))
        .await
        .map_err(|e| EngineError::Load(e.to_string()))?
        .map_err(EngineError::from)
}

async fn load_cpu(
    cfg: &Config,
    spec: ModelSpec,
    layer_ids: &[usize],
    dtype: OutputDtype,
) -> Result<Box<dyn crate::kernels::Backend>, EngineError> {
    let dir: PathBuf = cfg.model.path.clone();
    let opts = CpuOptions {
        capture_layers: layer_ids.to_vec(),
        num_blocks: cfg.engine.num_blocks,
        block_size: cfg.engine.block_size,
        threads: cfg.model.threads,
        num_state_slots: cfg.engine.max_num_seqs,
        output_dtype: dtype,
        reject_bad_states: cfg.engine.reject_bad_states,
        bf16_kernel: cfg.model.cpu_bf16_kernel,
    };
    let loaded = tokio::task::spawn_blocking(move || CpuBackend::load(Path::new(&dir), spec, opts))
        .await
        .map_err(|e| EngineError::Load(e.to_string()))??;
    Ok(Box::new(loaded))
}
