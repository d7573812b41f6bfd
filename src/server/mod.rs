//! `hsx serve`: the engine behind a Unix socket (JSON lines: submit, abort, subscribe, status),
//! an OpenAI-compatible HTTP listener (the subset speculators calls) and Prometheus `/metrics`.
//!
//! [`run`] takes the listeners, the engine and a shutdown future (mini-redis' `run(listener,
//! shutdown)`), so integration tests start the real daemon on a temporary socket and port 0.
//! Shutdown: stop accepting, let queued and running requests finish (their events go out, HTTP
//! clients get their responses), then stop the engine and remove the socket file.

mod chat_http;
mod dispatch;
mod http;
mod metrics;
pub mod paths;
pub mod protocol;
mod socket;
mod submit;

pub mod client;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use tokio::net::{TcpListener, UnixListener};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::engine::Engine;

pub use chat_http::parse_chat_body;
pub use dispatch::Dispatcher;
pub use http::{ParsedBody, parse_completion_body};
pub use socket::bind_unix;
pub use submit::{Rejection, Shared};

/// The file name of the disk event journal inside the output directory.
pub const JOURNAL_FILE: &str = "hsx-events.jsonl";

/// How long shutdown waits for connections that do not end on their own (a client that stopped
/// reading its events) before it gives up on them.
const CLOSE_GRACE: Duration = Duration::from_secs(10);

/// [`ServerOptions::http_read_timeout`] (hyper's and nginx's default header timeouts: 30 s, 60 s).
pub const HTTP_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// What the frontends need from the config.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Longest socket request line in bytes.
    pub max_line_bytes: usize,
    /// Socket connections served at once.
    pub max_connections: usize,
    /// Kernel send buffer per socket connection (0: OS default).
    pub send_buffer_bytes: usize,
    /// HTTP clients may choose `kv_transfer_params.hidden_states_path` (inside the output dir).
    pub allow_custom_paths: bool,
    /// Largest HTTP request body.
    pub max_body_bytes: usize,
    /// An HTTP request head, and then its body, must arrive within this time; an idle
    /// keep-alive connection is closed after it (slow or stalled clients hold nothing for long).
    pub http_read_timeout: Duration,
    /// Serve `/metrics`.
    pub metrics: bool,
    /// The model directory (for `tokenizer.json`).
    pub model_dir: PathBuf,
    /// Bounds on each chat template render (`[chat]`).
    pub render_limits: crate::chat::RenderLimits,
}

impl ServerOptions {
    pub fn from_config(cfg: &Config) -> Self {
        Self {
            max_line_bytes: cfg.socket.max_line_bytes,
            max_connections: cfg.socket.max_connections,
            send_buffer_bytes: cfg.socket.send_buffer_bytes,
            allow_custom_paths: cfg.output.allow_custom_paths,
            max_body_bytes: cfg.http.as_ref().map_or(32 << 20, |h| h.max_body_bytes),
            http_read_timeout: HTTP_READ_TIMEOUT,
            metrics: cfg.metrics.enabled,
            model_dir: cfg.model.path.clone(),
            render_limits: cfg.chat.render_limits(),
        }
    }
}

/// The daemon's listening sockets.
pub struct Listeners {
    pub unix: UnixListener,
    /// Removed at shutdown (the socket file bound by [`bind_unix`]).
    pub unix_path: PathBuf,
    pub http: Option<TcpListener>,
}

impl Listeners {
    /// Binds the socket (handling a stale socket file) and the HTTP address of the config.
    pub async fn bind(cfg: &Config) -> anyhow::Result<Self> {
        let unix = bind_unix(&cfg.socket.path, cfg.socket.mode)?;
        let http = match &cfg.http {
            None => None,
            Some(h) => match TcpListener::bind(&h.address).await {
                Ok(l) => Some(l),
                Err(e) => {
                    let _ = std::fs::remove_file(&cfg.socket.path);
                    return Err(e).with_context(|| format!("binding HTTP address {}", h.address));
                }
            },
        };
        Ok(Self {
            unix,
            unix_path: cfg.socket.path.clone(),
            http,
        })
    }
}

/// Starts the engine of `cfg` with its disk journal under the output directory, which is made
/// absolute first (clients get absolute file paths).
pub async fn start_engine(cfg: &Config) -> anyhow::Result<Engine> {
    let mut cfg = cfg.clone();
    let dir = &cfg.output.dir;
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating output directory {}", dir.display()))?;
    cfg.output.dir = std::fs::canonicalize(dir)
        .with_context(|| format!("resolving output directory {}", dir.display()))?;
    remove_stale_tmp_files(&cfg.output.dir);
    let journal = cfg.output.dir.join(JOURNAL_FILE);
    Engine::start_with_journal(&cfg, Some(&journal))
        .await
        .context("starting the engine")
}

/// Removes `*.safetensors.tmp` files under the output directory (not following symlinks,
/// at most 16 levels deep): writes a previous daemon left half done when it was killed. Their
/// requests never got a `completed` event, so clients resubmit them; the final names were
/// never touched (tmp, fsync, rename).
pub fn remove_stale_tmp_files(dir: &Path) -> usize {
    fn walk(dir: &Path, depth: usize, removed: &mut usize) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let path = entry.path();
            if kind.is_dir() && depth < 16 {
                walk(&path, depth + 1, removed);
            } else if kind.is_file()
                && path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.ends_with(".safetensors.tmp"))
            {
                match std::fs::remove_file(&path) {
                    Ok(()) => *removed += 1,
                    Err(e) => {
                        tracing::warn!(path = %path.display(), "cannot remove stale tmp file: {e}")
                    }
                }
            }
        }
    }
    let mut removed = 0;
    walk(dir, 0, &mut removed);
    if removed > 0 {
        tracing::info!(removed, dir = %dir.display(), "removed stale tmp files of an interrupted run");
    }
    removed
}

/// Serves until `shutdown` completes, then drains in-flight work and stops the engine.
pub async fn run(
    engine: Engine,
    listeners: Listeners,
    options: ServerOptions,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let prompter = load_prompter(&options.model_dir)?.with_limits(options.render_limits);
    let metrics = options.metrics.then(metrics::install);
    let cancel = CancellationToken::new();
    let shared = Shared::new(engine, options, prompter, metrics, cancel.clone()).await;
    let tracker = TaskTracker::new();

    let sampler = tracker.spawn(submit::sample_rates(shared.clone(), cancel.clone()));
    let unix_path = listeners.unix_path.clone();
    let unix_task = tracker.spawn(socket::accept_loop(
        listeners.unix,
        shared.clone(),
        tracker.clone(),
    ));
    let http_task = match listeners.http {
        Some(listener) => {
            let addr = listener.local_addr().ok();
            tracing::info!(?addr, "HTTP listening");
            Some(tokio::spawn(http::serve(listener, shared.clone())))
        }
        None => None,
    };
    tracing::info!(socket = %unix_path.display(), "hsx daemon ready");

    shutdown.await;
    tracing::info!("shutting down: finishing in-flight requests");
    cancel.cancel();
    let _ = unix_task.await;
    shared.engine().shutdown().await;
    shared.dispatcher().stopped().await;
    if let Some(task) = http_task {
        match tokio::time::timeout(CLOSE_GRACE, task).await {
            Ok(Ok(Err(e))) => tracing::warn!("HTTP server: {e}"),
            Ok(_) => {}
            Err(_) => tracing::warn!("HTTP connections still open after shutdown; closing"),
        }
    }
    let _ = sampler.await;
    tracker.close();
    if tokio::time::timeout(CLOSE_GRACE, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!("socket connections still open after shutdown; closing");
    }
    remove_socket_file(&unix_path);
    tracing::info!("hsx daemon stopped");
    Ok(())
}

/// The tokenizer and chat template of the model directory, each when present.
pub fn load_prompter(model_dir: &Path) -> anyhow::Result<crate::chat::Prompter> {
    let prompter = crate::chat::Prompter::from_dir(model_dir)?;
    if !prompter.has_tokenizer() {
        tracing::info!("no tokenizer.json in the model directory: text prompts are rejected");
    }
    Ok(prompter)
}

fn remove_socket_file(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(path = %path.display(), "cannot remove the socket file: {e}"),
    }
}

/// Resolves on SIGINT or SIGTERM.
pub async fn signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cannot listen for SIGTERM: {e}");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
