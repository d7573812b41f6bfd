//! What both frontends share: the engine, the event dispatcher, the tokenizer, request ids,
//! submission with typed rejections, and `status`.

use crate::chat::{ChatError, Prompter, RenderOptions};
use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{Dispatcher, ServerOptions};
use crate::actors::messages::{Request, RequestId};
use crate::actors::scheduler::SubmitError;
use crate::engine::{Engine, RequestSpec};

/// Why a request was not queued. `reason()` is the stable machine-readable word.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("{0}")]
    Overloaded(String),
    #[error("{0}")]
    TooLong(String),
    #[error("{0}")]
    TokenOutOfRange(String),
    #[error("{0}")]
    EmptyPrompt(String),
    #[error("{0}")]
    DuplicateId(String),
    #[error("{0}")]
    InvalidId(String),
    #[error("text prompts need a tokenizer: the model directory has no tokenizer.json")]
    NoTokenizer,
    #[error("{0}")]
    Chat(String),
    #[error("{0}")]
    InvalidPath(String),
    #[error("{0}")]
    Invalid(String),
    #[error("the daemon is shutting down")]
    ShuttingDown,
    #[error("{0}")]
    DeviceLost(String),
}

impl Rejection {
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Overloaded(_) => "overloaded",
            Self::TooLong(_) => "too_long",
            Self::TokenOutOfRange(_) => "token_out_of_range",
            Self::EmptyPrompt(_) => "empty_prompt",
            Self::DuplicateId(_) => "duplicate_id",
            Self::InvalidId(_) => "invalid_id",
            Self::NoTokenizer => "no_tokenizer",
            Self::Chat(_) => "chat_template",
            Self::InvalidPath(_) => "invalid_path",
            Self::Invalid(_) => "invalid_request",
            Self::ShuttingDown => "shutting_down",
            Self::DeviceLost(_) => "device_lost",
        }
    }
}

impl From<SubmitError> for Rejection {
    fn from(e: SubmitError) -> Self {
        let msg = e.to_string();
        match e {
            SubmitError::Overloaded(_) => Self::Overloaded(msg),
            SubmitError::TooLong { .. }
            | SubmitError::TooLargeForCache { .. }
            | SubmitError::TooLargeForHostMemory { .. } => Self::TooLong(msg),
            SubmitError::TokenOutOfRange { .. } => Self::TokenOutOfRange(msg),
            SubmitError::EmptyPrompt => Self::EmptyPrompt(msg),
            SubmitError::DuplicateId(_) => Self::DuplicateId(msg),
            SubmitError::ShuttingDown => Self::ShuttingDown,
            SubmitError::DeviceLost(_) => Self::DeviceLost(msg),
        }
    }
}

/// State shared by every connection (behind an `Arc`).
pub struct Shared {
    engine: Engine,
    options: ServerOptions,
    prompter: Prompter,
    metrics: Option<PrometheusHandle>,
    dispatcher: Arc<Dispatcher>,
    cancel: CancellationToken,
    /// Random per daemon run, so generated ids do not repeat across restarts.
    id_prefix: String,
    next_id: AtomicU64,
    /// Tokens per second over the last sampling period (f64 bits).
    tokens_per_s: AtomicU64,
    /// Custom file paths of requests in flight (two requests must not write one file).
    claimed_paths: Mutex<HashSet<PathBuf>>,
}

/// A custom path reserved for one request; released when dropped.
pub struct PathClaim {
    shared: Arc<Shared>,
    path: PathBuf,
}

impl Drop for PathClaim {
    fn drop(&mut self) {
        let mut claimed = self
            .shared
            .claimed_paths
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        claimed.remove(&self.path);
    }
}

impl Shared {
    pub(crate) async fn new(
        engine: Engine,
        options: ServerOptions,
        prompter: Prompter,
        metrics: Option<PrometheusHandle>,
        cancel: CancellationToken,
    ) -> Arc<Self> {
        // Subscribed before any request can be submitted: no completion can be missed.
        let start_seq = engine.event_stats().await.map_or(0, |s| s.last_seq);
        let subscription = engine.subscribe(Some(start_seq)).await;
        let dispatcher = Arc::new(Dispatcher::default());
        let random = RandomState::new().hash_one(std::process::id()) as u32;
        let shared = Arc::new(Self {
            engine,
            options,
            prompter,
            metrics,
            dispatcher: dispatcher.clone(),
            cancel,
            id_prefix: format!("{random:08x}"),
            next_id: AtomicU64::new(0),
            tokens_per_s: AtomicU64::new(0f64.to_bits()),
            claimed_paths: Mutex::new(HashSet::new()),
        });
        tokio::spawn(dispatcher.run(shared.clone(), subscription, start_seq));
        shared
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn options(&self) -> &ServerOptions {
        &self.options
    }

    pub fn dispatcher(&self) -> &Dispatcher {
        &self.dispatcher
    }

    pub fn metrics(&self) -> Option<&PrometheusHandle> {
        self.metrics.as_ref()
    }

    pub fn cancel(&self) -> &CancellationToken {
        &self.cancel
    }

    pub fn prompter(&self) -> &Prompter {
        &self.prompter
    }

    /// A fresh id: `{kind}-{random}-{counter}`.
    pub fn new_id(&self, kind: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{kind}-{}{n:06x}", self.id_prefix)
    }

    /// Token ids of `text` (special tokens added as the tokenizer's post-processor says).
    pub async fn tokenize(self: &Arc<Self>, text: String) -> Result<Vec<u32>, Rejection> {
        self.blocking(move |p| p.encode_text(&text)).await
    }

    /// A conversation rendered with the model's chat template, and its token ids.
    pub async fn render_chat(
        self: &Arc<Self>,
        messages: serde_json::Value,
        opts: RenderOptions,
    ) -> Result<(String, Vec<u32>), Rejection> {
        self.blocking(move |p| p.encode_messages(&messages, &opts))
            .await
    }

    /// Runs tokenizer work off the async workers.
    async fn blocking<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Prompter) -> Result<T, ChatError> + Send + 'static,
    ) -> Result<T, Rejection> {
        let me = self.clone();
        match tokio::task::spawn_blocking(move || f(&me.prompter)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(ChatError::NoTokenizer)) => Err(Rejection::NoTokenizer),
            Ok(Err(e)) => Err(Rejection::Chat(e.to_string())),
            Err(e) => Err(Rejection::Invalid(format!("tokenizer failed: {e}"))),
        }
    }

    /// Text of generated tokens ("" without a tokenizer).
    pub fn detokenize(&self, ids: &[u32]) -> String {
        self.prompter.decode(ids)
    }

    /// Reserves a custom file path for one request, unless another one in flight holds it.
    pub fn claim_path(self: &Arc<Self>, path: PathBuf) -> Result<PathClaim, Rejection> {
        let mut claimed = self.claimed_paths.lock().unwrap_or_else(|p| p.into_inner());
        if !claimed.insert(path.clone()) {
            return Err(Rejection::InvalidPath(format!(
                "{} is being written by another request",
                path.display()
            )));
        }
        Ok(PathClaim {
            shared: self.clone(),
            path,
        })
    }

    /// Builds and queues a request (counted as accepted; frontends count their rejections
    /// with [`Self::count_rejection`], since some happen before this call).
    pub async fn submit(
        &self,
        spec: RequestSpec,
        path: Option<PathBuf>,
    ) -> Result<Request, Rejection> {
        let result = self.try_submit(spec, path).await;
        if result.is_ok() {
            metrics::counter!("hsx_requests_total", "state" => "accepted").increment(1);
        }
        result
    }

    pub fn count_rejection(&self, reason: &'static str) {
        metrics::counter!("hsx_requests_total", "state" => "rejected").increment(1);
        metrics::counter!("hsx_requests_rejected_total", "reason" => reason).increment(1);
    }

    async fn try_submit(
        &self,
        spec: RequestSpec,
        path: Option<PathBuf>,
    ) -> Result<Request, Rejection> {
        if self.cancel.is_cancelled() {
            return Err(Rejection::ShuttingDown);
        }
        let req = self
            .engine
            .request_with_path(spec, path)
            .map_err(|e| Rejection::InvalidId(e.to_string()))?;
        self.engine.submit(req.clone()).await?;
        Ok(req)
    }

    pub async fn abort(&self, id: RequestId) {
        self.engine.abort(id).await
    }

    /// Queue depths, running requests, throughput, events, host memory, KV blocks.
    pub async fn status(&self) -> serde_json::Value {
        let e = &self.engine;
        let (sched, conn, blocks, hub) = tokio::join!(
            e.status(),
            e.connector_stats(),
            e.block_stats(),
            e.event_stats()
        );
        let s = sched.unwrap_or_default();
        let c = conn.unwrap_or_default();
        let hub = hub.unwrap_or_default();
        let tps = f64::from_bits(self.tokens_per_s.load(Ordering::Relaxed));
        json!({
            "event": "status",
            "model": e.info().model_name,
            "waiting": s.waiting,
            "max_waiting": e.info().max_waiting,
            "running": s.running,
            "steps": s.steps,
            "tokens_computed": s.tokens_computed,
            "tokens_per_s": (tps * 10.0).round() / 10.0,
            "last_seq": hub.last_seq,
            "subscribers": hub.subscribers,
            "pending_requests": c.pending_requests,
            "pending_bytes": c.pending_bytes + c.writing_bytes,
            "writes_in_flight": c.writes_in_flight,
            "kv_blocks_total": blocks.map_or(0, |b| b.total),
            "kv_blocks_used": blocks.map_or(0, |b| b.total - b.free),
            "prefix_cache_hit_tokens": blocks.map_or(0, |b| b.prefix.hit_tokens),
            "prefix_cache_waited_tokens": blocks.map_or(0, |b| b.prefix.waited_tokens),
            "prefix_cache_blocks": blocks.map_or(0, |b| b.prefix.cached_blocks),
            "prefix_cache_bytes": blocks.map_or(0, |b| b.prefix.bytes),
            "prefix_cache_snapshots": blocks.map_or(0, |b| b.prefix.snapshots),
            "shutting_down": self.cancel.is_cancelled(),
        })
    }
}

/// Samples throughput once a second (for `status`) and runs the metrics upkeep.
pub(crate) async fn sample_rates(shared: Arc<Shared>, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last: Option<(Instant, u64)> = None;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let Some(stats) = shared.engine.status().await else {
            return;
        };
        let now = Instant::now();
        if let Some((t, tokens)) = last {
            let dt = now.duration_since(t).as_secs_f64().max(1e-3);
            let rate = stats.tokens_computed.saturating_sub(tokens) as f64 / dt;
            shared.tokens_per_s.store(rate.to_bits(), Ordering::Relaxed);
        }
        last = Some((now, stats.tokens_computed));
        if let Some(m) = &shared.metrics {
            m.run_upkeep();
        }
    }
}
