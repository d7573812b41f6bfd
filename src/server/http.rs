//! The HTTP frontend: the subset of vLLM's OpenAI server that speculators calls (DESIGN.md §1.3)
//! plus `/metrics`. A completion is answered only once its file has been renamed into place.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::task::TaskTracker;

use super::dispatch::Dispatcher;
use super::{Rejection, Shared, paths, protocol};
use crate::actors::messages::{EventKind, RequestId};
use crate::engine::RequestSpec;

/// vLLM's default when a request gives no `max_tokens`.
pub(super) const DEFAULT_MAX_TOKENS: u32 = 16;

/// Longest request line + headers (a longer head gets 431 and the connection is closed).
const MAX_HEAD_BYTES: usize = 64 << 10;

pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>) -> std::io::Result<()> {
    let cancel = shared.cancel().clone();
    let read_timeout = shared.options().http_read_timeout;
    let mut app = Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route(
            "/v1/chat/completions",
            post(super::chat_http::chat_completions),
        )
        .route(
            "/v1/chat/completions/render",
            post(super::chat_http::render),
        );
    if shared.metrics().is_some() {
        app = app.route("/metrics", get(metrics));
    }
    let app = app.fallback(not_found).with_state(shared);
    // hyper directly rather than `axum::serve`, which sets no timer: without one a connection
    // that never finishes its request head (idle, or a slowloris sending a header byte now and
    // then) is held forever with its buffer. Here a head must arrive within `read_timeout`
    // (idle keep-alive connections are closed after it too) and is at most MAX_HEAD_BYTES.
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(read_timeout)
        .max_header_size(MAX_HEAD_BYTES);
    let connections = TaskTracker::new();
    loop {
        let stream = tokio::select! {
            _ = cancel.cancelled() => break,
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    // Out of file descriptors and the like: keep serving the others.
                    tracing::warn!("HTTP accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let conn =
            http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let cancel = cancel.clone();
        connections.spawn(async move {
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!("HTTP connection: {e}");
                    }
                    return;
                }
                // Finish the request in progress (if any), then close.
                _ = cancel.cancelled() => conn.as_mut().graceful_shutdown(),
            }
            if let Err(e) = conn.await {
                tracing::debug!("HTTP connection: {e}");
            }
        });
    }
    drop(listener);
    connections.close();
    connections.wait().await;
    Ok(())
}

/// An OpenAI-style error: `{"error": {"message", "type", "param", "code"}}`.
pub struct ApiError {
    status: StatusCode,
    message: String,
    /// Counted as a rejected request (`None`: the request had been accepted, or is no request).
    rejection: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            rejection: Some("invalid_request"),
        }
    }

    /// An error about a request that was accepted (it failed, or the daemon stopped).
    fn after_accept(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            rejection: None,
            ..Self::new(status, message)
        }
    }

    /// Why the request was rejected, when it was (for the rejection counter).
    pub(super) fn rejection(&self) -> Option<&'static str> {
        self.rejection
    }

    /// What the client is told.
    pub(super) fn message(self) -> String {
        self.message
    }

    pub(super) fn bad(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
}

impl From<Rejection> for ApiError {
    fn from(r: Rejection) -> Self {
        let status = match r {
            Rejection::Overloaded(_) | Rejection::ShuttingDown | Rejection::DeviceLost(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Rejection::TooLong(_) => StatusCode::PAYLOAD_TOO_LARGE,
            _ => StatusCode::BAD_REQUEST,
        };
        Self {
            rejection: Some(r.reason()),
            ..Self::new(status, r.to_string())
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = match self.status {
            StatusCode::BAD_REQUEST => "BadRequestError",
            StatusCode::NOT_FOUND => "NotFoundError",
            StatusCode::PAYLOAD_TOO_LARGE => "RequestTooLargeError",
            StatusCode::REQUEST_TIMEOUT => "RequestTimeoutError",
            StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailableError",
            _ => "InternalServerError",
        };
        let body = json!({"error": {
            "message": protocol::clip(&self.message),
            "type": kind,
            "param": null,
            "code": self.status.as_u16(),
        }});
        (self.status, axum::Json(body)).into_response()
    }
}

/// 503 while shutting down, and for good once the device is lost (the daemon then only
/// answers status and finished files: a supervisor should restart it).
async fn health(State(shared): State<Arc<Shared>>) -> StatusCode {
    if shared.cancel().is_cancelled() {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    match shared.engine().status().await {
        Some(stats) if !stats.device_lost => StatusCode::OK,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    }
}

async fn models(State(shared): State<Arc<Shared>>) -> axum::Json<Value> {
    let info = shared.engine().info();
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": info.model_name,
            "object": "model",
            "created": unix_now(),
            "owned_by": "hsx",
            "root": info.model_name,
            "parent": null,
            "max_model_len": info.max_model_len,
        }],
    }))
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    let Some(handle) = shared.metrics() else {
        return not_found().await.into_response();
    };
    let text = super::metrics::render(&shared, handle).await;
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not found")
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Prompt {
    Tokens(Vec<i64>),
    Batch(Vec<Vec<i64>>),
    Text(String),
    Texts(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct KvTransferParams {
    pub hidden_states_path: Option<String>,
    #[serde(default)]
    pub include_output_tokens: bool,
}

/// Fields of vLLM's completion request that matter here; the other OpenAI fields (sampling
/// settings and the like) are accepted and ignored: generation is greedy.
#[derive(Debug, Deserialize)]
struct CompletionRequest {
    model: Option<String>,
    prompt: Value,
    max_tokens: Option<u32>,
    #[serde(default)]
    return_token_ids: bool,
    kv_transfer_params: Option<KvTransferParams>,
    #[serde(default)]
    stream: bool,
    n: Option<u32>,
}

fn parse_request(bytes: &[u8]) -> Result<CompletionRequest, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::bad(format!("invalid request: {e}")))
}

/// A generation request body as the HTTP handlers parse it, up to where they need the engine
/// (tokenizing, rendering a conversation, submitting); for the reliability suite's fuzz test.
#[derive(Debug, Default)]
pub struct ParsedBody {
    /// Token-id prompts, converted as the handler does; `None`: text prompts or a conversation.
    pub token_prompts: Option<Vec<Vec<u32>>>,
    /// Text prompts (`/v1/completions` with a string or a list of strings).
    pub text_prompts: Option<Vec<String>>,
    /// The conversation and how it is rendered (the chat endpoints).
    pub conversation: Option<(Value, crate::chat::RenderOptions)>,
    /// `kv_transfer_params.hidden_states_path`, unchecked (see [`paths::resolve_custom_path`]).
    pub hidden_states_path: Option<String>,
    pub max_tokens: u32,
}

/// Parses a `/v1/completions` body as the handler does. `Err`: the message a client gets.
pub fn parse_completion_body(bytes: &[u8]) -> Result<ParsedBody, String> {
    let req = parse_request(bytes).map_err(|e| e.message)?;
    let prompt: Prompt = serde_json::from_value(req.prompt).map_err(|e| e.to_string())?;
    let mut out = ParsedBody {
        hidden_states_path: req.kv_transfer_params.and_then(|k| k.hidden_states_path),
        max_tokens: req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        ..Default::default()
    };
    let tokens = |ids: &[i64]| protocol::token_ids(ids).map_err(|e| e.to_string());
    let n = match prompt {
        Prompt::Tokens(ids) => out.token_prompts.insert(vec![tokens(&ids)?]).len(),
        Prompt::Batch(batch) => out
            .token_prompts
            .insert(
                batch
                    .iter()
                    .map(|ids| tokens(ids))
                    .collect::<Result<_, _>>()?,
            )
            .len(),
        Prompt::Text(text) => out.text_prompts.insert(vec![text]).len(),
        Prompt::Texts(texts) => out.text_prompts.insert(texts).len(),
    };
    if n == 0 {
        return Err("prompt is an empty batch".into());
    }
    Ok(out)
}

async fn completions(State(shared): State<Arc<Shared>>, body: Body) -> Result<Response, ApiError> {
    let result = complete(&shared, body).await;
    if let Err(ApiError {
        rejection: Some(reason),
        ..
    }) = &result
    {
        shared.count_rejection(reason);
    }
    result
}

async fn complete(shared: &Arc<Shared>, body: Body) -> Result<Response, ApiError> {
    let bytes = read_body(shared, body).await?;
    let req = parse_request(&bytes)?;
    let info = shared.engine().info();
    check_common(shared, req.model.as_deref(), req.stream, req.n)?;
    let prompts = prompts(shared, req.prompt).await?;
    let kv = req.kv_transfer_params.unwrap_or_default();
    let custom_path = custom_path(shared, kv.hidden_states_path.as_deref(), prompts.len())?;
    let max_tokens = req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
    let base = shared.new_id("cmpl");
    let job = Job {
        base: &base,
        max_tokens,
        include_output_tokens: kv.include_output_tokens,
        custom_path,
    };
    let done = run_prompts(shared, &prompts, job).await?;
    let mut choices = Vec::with_capacity(prompts.len());
    for (i, d) in done.iter().enumerate() {
        let ids = |v: &[u32]| req.return_token_ids.then(|| json!(v));
        choices.push(json!({
            "index": i,
            "text": shared.detokenize(&d.output),
            "logprobs": null,
            "finish_reason": "length",
            "stop_reason": null,
            "prompt_logprobs": null,
            "prompt_token_ids": ids(&prompts[i]),
            "token_ids": ids(&d.output),
            "kv_transfer_params": {"hidden_states_path": &d.path},
        }));
    }
    Ok(axum::Json(json!({
        "id": base,
        "object": "text_completion",
        "created": unix_now(),
        "model": info.model_name,
        "choices": choices,
        "usage": usage(&prompts, &done),
        "kv_transfer_params": {"hidden_states_path": done.first().map(|d| &d.path)},
    }))
    .into_response())
}

/// What every prompt of one HTTP request shares.
pub(super) struct Job<'a> {
    /// Request ids are `{base}-{i}`.
    pub base: &'a str,
    pub max_tokens: u32,
    pub include_output_tokens: bool,
    pub custom_path: Option<PathBuf>,
}

/// A prompt's finished file.
pub(super) struct Done {
    pub path: PathBuf,
    pub output: Vec<u32>,
}

/// Submits every prompt and waits until each file is renamed into place (or failed).
pub(super) async fn run_prompts(
    shared: &Arc<Shared>,
    prompts: &[Vec<u32>],
    job: Job<'_>,
) -> Result<Vec<Done>, ApiError> {
    // Held until the response: no other request may write this file meanwhile.
    let _claim = match &job.custom_path {
        Some(p) => Some(shared.claim_path(p.clone())?),
        None => None,
    };
    let mut waiting = Vec::with_capacity(prompts.len());
    for (i, token_ids) in prompts.iter().enumerate() {
        let id = format!("{}-{i}", job.base);
        let rid = RequestId::new(&id).map_err(|e| ApiError::bad(e.to_string()))?;
        let rx = shared.dispatcher().register(rid.clone());
        // Dropping the guard (client gone, or a later prompt rejected) aborts the request.
        let guard = Dispatcher::guard(shared, rid);
        let spec = RequestSpec {
            id,
            token_ids: token_ids.clone(),
            max_tokens: job.max_tokens,
            include_output_tokens: job.include_output_tokens,
        };
        shared.submit(spec, job.custom_path.clone()).await?;
        waiting.push((rx, guard));
    }
    let mut done = Vec::with_capacity(prompts.len());
    for (rx, guard) in waiting {
        let event = rx
            .await
            .map_err(|_| ApiError::from(Rejection::ShuttingDown))?;
        guard.disarm();
        match event.kind {
            EventKind::Completed {
                path,
                output_token_ids,
                ..
            } => done.push(Done {
                path,
                output: output_token_ids,
            }),
            EventKind::Failed { error } => {
                return Err(ApiError::after_accept(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("request {} failed: {error}", event.id),
                ));
            }
        }
    }
    Ok(done)
}

/// The body, up to `http.max_body_bytes`, within `http_read_timeout`.
pub(super) async fn read_body(shared: &Shared, body: Body) -> Result<axum::body::Bytes, ApiError> {
    let limit = shared.options().max_body_bytes;
    let timeout = shared.options().http_read_timeout;
    match tokio::time::timeout(timeout, to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        // `to_bytes` fails for a body over the limit, or one that cannot be read (the client
        // sent less than its Content-Length, broken chunks): only the first is a 413.
        Ok(Err(e)) if over_limit(&e) => Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body larger than {limit} bytes (http.max_body_bytes)"),
        )),
        Ok(Err(e)) => Err(ApiError::bad(format!("cannot read the request body: {e}"))),
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "request body not received within {} s",
                timeout.as_secs_f64()
            ),
        )),
    }
}

/// Whether a `to_bytes` error is its length limit (http-body-util's `LengthLimitError`).
fn over_limit(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.to_string() == "length limit exceeded" {
            return true;
        }
        source = err.source();
    }
    false
}

/// The checks every generation endpoint makes: the model name, no streaming, n = 1.
pub(super) fn check_common(
    shared: &Shared,
    model: Option<&str>,
    stream: bool,
    n: Option<u32>,
) -> Result<(), ApiError> {
    let name = &shared.engine().info().model_name;
    if let Some(model) = model
        && model != name
    {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("The model `{model}` does not exist (this server runs `{name}`)."),
        ));
    }
    if stream {
        return Err(ApiError::bad("stream=true is not supported"));
    }
    if n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad("only n=1 is supported"));
    }
    Ok(())
}

pub(super) fn usage(prompts: &[Vec<u32>], done: &[Done]) -> Value {
    let prompt_tokens: usize = prompts.iter().map(Vec::len).sum();
    let completion_tokens: usize = done.iter().map(|d| d.output.len()).sum();
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    })
}

/// The token ids of each prompt: ids as sent (never a BOS added), or tokenized text.
async fn prompts(shared: &Arc<Shared>, prompt: Value) -> Result<Vec<Vec<u32>>, ApiError> {
    let prompt: Prompt = serde_json::from_value(prompt).map_err(|_| {
        ApiError::bad(
            "prompt must be a list of token ids, a list of such lists, a string or a list of strings",
        )
    })?;
    let out = match prompt {
        Prompt::Tokens(ids) => vec![protocol::token_ids(&ids)?],
        Prompt::Batch(batch) => batch
            .iter()
            .map(|ids| protocol::token_ids(ids))
            .collect::<Result<_, _>>()?,
        Prompt::Text(text) => vec![shared.tokenize(text).await?],
        Prompt::Texts(texts) => {
            let mut out = Vec::with_capacity(texts.len());
            for t in texts {
                out.push(shared.tokenize(t).await?);
            }
            out
        }
    };
    if out.is_empty() {
        return Err(ApiError::bad("prompt is an empty batch"));
    }
    let max_batch = shared.engine().info().max_waiting;
    if out.len() > max_batch {
        return Err(ApiError::from(Rejection::Overloaded(format!(
            "a batch of {} prompts exceeds engine.max_waiting ({max_batch})",
            out.len()
        ))));
    }
    Ok(out)
}

/// The checked custom file path, if the request names one.
pub(super) fn custom_path(
    shared: &Shared,
    requested: Option<&str>,
    batch: usize,
) -> Result<Option<PathBuf>, ApiError> {
    let Some(requested) = requested else {
        return Ok(None);
    };
    if !shared.options().allow_custom_paths {
        return Err(Rejection::InvalidPath(
            "kv_transfer_params.hidden_states_path is not allowed (output.allow_custom_paths = false)"
                .into(),
        )
        .into());
    }
    if batch != 1 {
        return Err(ApiError::bad(
            "kv_transfer_params.hidden_states_path needs a single prompt, not a batch",
        ));
    }
    let root = &shared.engine().info().output_dir;
    paths::resolve_custom_path(root, requested)
        .map(Some)
        .map_err(|e| Rejection::InvalidPath(e).into())
}

pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
