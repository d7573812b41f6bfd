//! The Unix socket frontend: binding (stale socket files, mode), the accept loop and one task per
//! connection speaking the JSON-lines protocol of [`super::protocol`].

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::task::TaskTracker;

use super::protocol::{self, ClientOp, SubmitOp};
use super::{Rejection, Shared};
use crate::actors::events::Subscription;
use crate::actors::messages::RequestId;
use crate::chat::RenderOptions;
use crate::engine::RequestSpec;

/// A client that does not take a line within this time is disconnected (a subscriber then
/// resumes with `from_seq`).
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Binds the socket at `path` with file mode `mode`. A socket file left by a daemon that died
/// is removed; if a daemon still answers on it, or the path is not a socket, it is an error.
pub fn bind_unix(path: &Path, mode: u32) -> anyhow::Result<UnixListener> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                bail!(
                    "another daemon is listening on {} (stop it or choose another --socket)",
                    path.display()
                );
            }
            tracing::info!(path = %path.display(), "removing stale socket file");
            std::fs::remove_file(path)
                .with_context(|| format!("removing stale socket {}", path.display()))?;
        }
        Ok(_) => bail!("{} exists and is not a socket", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("checking {}", path.display())),
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating socket directory {}", dir.display()))?;
    }
    let listener = UnixListener::bind(path)
        .with_context(|| format!("binding Unix socket {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting mode {mode:o} on {}", path.display()))?;
    Ok(listener)
}

/// Accepts connections until shutdown. At most `max_connections` are served at once; one more
/// gets a `too_many_connections` error line and is closed (it is not left waiting unanswered).
pub(crate) async fn accept_loop(listener: UnixListener, shared: Arc<Shared>, tracker: TaskTracker) {
    let max = shared.options().max_connections;
    let limit = Arc::new(Semaphore::new(max));
    loop {
        let stream = tokio::select! {
            _ = shared.cancel().cancelled() => return,
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    // Out of file descriptors and the like: keep serving the others.
                    tracing::warn!("socket accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        match limit.clone().try_acquire_owned() {
            Ok(permit) => {
                tracker.spawn(serve_connection(stream, shared.clone(), permit));
            }
            Err(_) => refuse(stream, max),
        }
    }
}

/// Tells a client over the connection limit why, and drops its connection.
fn refuse(stream: UnixStream, max: usize) {
    metrics::counter!("hsx_socket_connections_refused_total").increment(1);
    let mut line = json!({
        "event": "error",
        "reason": "too_many_connections",
        "message": format!(
            "too many connections: {max} are open (socket.max_connections); try again later"
        ),
    })
    .to_string();
    line.push('\n');
    // A fresh connection's send buffer is empty: the line fits without waiting (written
    // directly, since tokio may not have seen the new socket writable yet).
    let written = stream
        .into_std()
        .and_then(|s| std::io::Write::write_all(&mut &s, line.as_bytes()));
    if let Err(e) = written {
        tracing::debug!("refusing a socket connection: {e}");
    }
}

struct Conn {
    shared: Arc<Shared>,
    out: OwnedWriteHalf,
    sub: Option<Subscription>,
}

impl Conn {
    /// Sends one line; false when the client is gone or stopped reading.
    async fn send(&mut self, value: &Value) -> bool {
        let mut line = value.to_string();
        line.push('\n');
        matches!(
            tokio::time::timeout(WRITE_TIMEOUT, self.out.write_all(line.as_bytes())).await,
            Ok(Ok(()))
        )
    }
}

async fn serve_connection(stream: UnixStream, shared: Arc<Shared>, _permit: OwnedSemaphorePermit) {
    metrics::gauge!("hsx_socket_connections").increment(1);
    let send_buffer = shared.options().send_buffer_bytes;
    if send_buffer > 0
        && let Err(e) = socket2::SockRef::from(&stream).set_send_buffer_size(send_buffer)
    {
        tracing::debug!("cannot set the socket send buffer: {e}");
    }
    let max_line = shared.options().max_line_bytes;
    let (rd, out) = stream.into_split();
    let mut lines = LineReader::new(rd, max_line);
    let mut conn = Conn {
        shared,
        out,
        sub: None,
    };
    let mut reading = true;
    loop {
        let subscribed = conn.sub.is_some();
        tokio::select! {
            biased;
            _ = conn.shared.cancel().cancelled(), if reading => {
                // Stop taking commands; a subscriber still gets the events of the drain.
                reading = false;
                if !subscribed {
                    break;
                }
            }
            event = next_event(&mut conn.sub), if subscribed => {
                let line = match &event {
                    Some(e) => protocol::event(e),
                    None => end_line(&conn),
                };
                if !conn.send(&line).await || event.is_none() {
                    break;
                }
            }
            line = lines.next(), if reading => {
                let reply = match line {
                    // The client closed its side; a subscriber keeps receiving.
                    Line::Eof => {
                        reading = false;
                        if subscribed { continue } else { break }
                    }
                    Line::TooLong => protocol::error(&format!(
                        "line longer than {max_line} bytes (socket.max_line_bytes); ignored"
                    )),
                    Line::NotUtf8 => protocol::error("line is not valid UTF-8; ignored"),
                    Line::Failed(e) => {
                        tracing::debug!("socket read: {e}");
                        break;
                    }
                    Line::Text(line) if line.trim().is_empty() => continue,
                    Line::Text(line) => handle_line(&mut conn, &line).await,
                };
                if !conn.send(&reply).await {
                    break;
                }
            }
        }
    }
    metrics::gauge!("hsx_socket_connections").decrement(1);
}

enum Line {
    Text(String),
    TooLong,
    NotUtf8,
    Eof,
    Failed(std::io::Error),
}

/// Reads lines of at most `max` bytes; a longer line is skipped (never held in memory) and
/// reported once its newline arrives. Cancel-safe: partial lines live in `self`, so dropping
/// `next()` inside `select!` loses nothing.
struct LineReader<R> {
    inner: BufReader<R>,
    buf: Vec<u8>,
    max: usize,
    discarding: bool,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    fn new(inner: R, max: usize) -> Self {
        Self {
            inner: BufReader::new(inner),
            buf: Vec::new(),
            max,
            discarding: false,
        }
    }

    async fn next(&mut self) -> Line {
        loop {
            let available = match self.inner.fill_buf().await {
                Ok(b) => b,
                Err(e) => return Line::Failed(e),
            };
            if available.is_empty() {
                return Line::Eof;
            }
            let newline = available.iter().position(|&b| b == b'\n');
            let chunk = &available[..newline.unwrap_or(available.len())];
            if !self.discarding {
                if self.buf.len() + chunk.len() > self.max {
                    self.discarding = true;
                    self.buf = Vec::new();
                } else {
                    self.buf.extend_from_slice(chunk);
                }
            }
            let used = chunk.len() + usize::from(newline.is_some());
            self.inner.consume(used);
            if newline.is_some() {
                if std::mem::take(&mut self.discarding) {
                    return Line::TooLong;
                }
                return match String::from_utf8(std::mem::take(&mut self.buf)) {
                    Ok(s) => Line::Text(s),
                    Err(_) => Line::NotUtf8,
                };
            }
        }
    }
}

async fn next_event(
    sub: &mut Option<Subscription>,
) -> Option<crate::actors::messages::CompletionEvent> {
    match sub {
        Some(s) => s.next().await,
        None => std::future::pending().await,
    }
}

fn end_line(conn: &Conn) -> Value {
    let last_seq = conn.sub.as_ref().and_then(|s| s.last_seq());
    let reason = if conn.shared.cancel().is_cancelled() {
        "shutting_down"
    } else {
        "lagging"
    };
    json!({
        "event": "end",
        "reason": reason,
        "last_seq": last_seq,
        "message": "event stream ended; subscribe again with from_seq = last_seq to continue",
    })
}

async fn handle_line(conn: &mut Conn, line: &str) -> Value {
    let op = match protocol::parse_op(line) {
        Ok(op) => op,
        Err(msg) => return protocol::error(&msg),
    };
    let shared = conn.shared.clone();
    match op {
        ClientOp::Submit(s) => submit(&shared, s).await,
        ClientOp::Abort(a) => match RequestId::new(&a.id) {
            Ok(id) => {
                shared.abort(id).await;
                json!({"event": "abort_requested", "id": a.id})
            }
            Err(e) => protocol::error(&e.to_string()),
        },
        ClientOp::Status => shared.status().await,
        ClientOp::Subscribe(s) => {
            if conn.sub.is_some() {
                return protocol::error("already subscribed on this connection");
            }
            let sub = shared.engine().subscribe(s.from_seq).await;
            let last_seq = shared.engine().event_stats().await.map(|h| h.last_seq);
            let reply = json!({
                "event": "subscribed",
                "from_seq": s.from_seq,
                "last_seq": last_seq,
                "truncated": sub.truncated(),
            });
            conn.sub = Some(sub);
            reply
        }
    }
}

async fn submit(shared: &Arc<Shared>, s: SubmitOp) -> Value {
    let given = s.id.clone();
    let result = async {
        let given = [
            s.token_ids.is_some(),
            s.text.is_some(),
            s.messages.is_some(),
        ];
        match given.iter().filter(|&&g| g).count() {
            1 => {}
            0 => {
                return Err(Rejection::Invalid(
                    "missing \"token_ids\" (or \"text\" or \"messages\")".into(),
                ));
            }
            _ => {
                return Err(Rejection::Invalid(
                    "give exactly one of \"token_ids\", \"text\" or \"messages\"".into(),
                ));
            }
        }
        let token_ids = if let Some(ids) = s.token_ids {
            protocol::token_ids(&ids)?
        } else if let Some(text) = s.text {
            shared.tokenize(text).await?
        } else {
            let opts = RenderOptions {
                add_generation_prompt: s.add_generation_prompt,
                tools: s.tools,
                ..Default::default()
            };
            shared
                .render_chat(s.messages.unwrap_or_default(), opts)
                .await?
                .1
        };
        let spec = RequestSpec {
            id: s.id.unwrap_or_else(|| shared.new_id("req")),
            token_ids,
            max_tokens: s.max_tokens,
            include_output_tokens: s.include_output_tokens,
        };
        shared.submit(spec, None).await
    }
    .await;
    match result {
        Ok(req) => protocol::accepted(req.id.as_str(), &req.path),
        Err(r) => {
            shared.count_rejection(r.reason());
            protocol::rejected(given.as_deref(), &r)
        }
    }
}
