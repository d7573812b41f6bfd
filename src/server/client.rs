//! Clients of the socket protocol behind `hsx subscribe` and `hsx submit`.

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

/// A JSON-lines connection to the daemon.
pub struct Connection {
    lines: Lines<BufReader<OwnedReadHalf>>,
    out: OwnedWriteHalf,
}

impl Connection {
    pub async fn connect(socket: &Path) -> anyhow::Result<Self> {
        let stream = UnixStream::connect(socket)
            .await
            .with_context(|| format!("connecting to {}", socket.display()))?;
        let (rd, out) = stream.into_split();
        Ok(Self {
            lines: BufReader::new(rd).lines(),
            out,
        })
    }

    pub async fn send(&mut self, value: &Value) -> anyhow::Result<()> {
        self.send_raw(&value.to_string()).await
    }

    /// Sends one line as is (a newline is added).
    pub async fn send_raw(&mut self, line: &str) -> anyhow::Result<()> {
        self.out.write_all(line.as_bytes()).await?;
        self.out.write_all(b"\n").await?;
        Ok(())
    }

    /// The next line from the daemon, parsed; `None` when it closed the connection.
    pub async fn recv(&mut self) -> anyhow::Result<Option<Value>> {
        match self.lines.next_line().await? {
            Some(line) => Ok(Some(
                serde_json::from_str(&line).with_context(|| format!("bad line {line:?}"))?,
            )),
            None => Ok(None),
        }
    }

    /// Sends a request and returns the reply line.
    pub async fn request(&mut self, value: &Value) -> anyhow::Result<Value> {
        self.send(value).await?;
        self.recv()
            .await?
            .context("the daemon closed the connection")
    }
}

/// `hsx subscribe`: prints every event as a JSON line until the daemon ends the stream.
/// With `reconnect`, resumes after a lagging disconnect from the last seq printed.
pub async fn subscribe(
    socket: &Path,
    from_seq: Option<u64>,
    count: Option<usize>,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let mut from = from_seq;
    let mut printed = 0usize;
    loop {
        let mut conn = Connection::connect(socket).await?;
        let reply = conn
            .request(&json!({"op": "subscribe", "from_seq": from}))
            .await?;
        if reply["event"] != "subscribed" {
            bail!("subscribe refused: {reply}");
        }
        if reply["truncated"] == true {
            eprintln!("hsx: warning: some events after seq {from:?} are no longer journaled");
        }
        loop {
            if count.is_some_and(|n| printed >= n) {
                return Ok(());
            }
            let Some(line) = conn.recv().await? else {
                return Ok(());
            };
            match line["event"].as_str() {
                Some("end") if line["reason"] == "lagging" => {
                    // Fell behind: resume from what was printed, losing nothing.
                    from = line["last_seq"].as_u64().or(from);
                    break;
                }
                Some("end") => return Ok(()),
                _ => {
                    if let Some(seq) = line["seq"].as_u64() {
                        from = Some(seq);
                    }
                    writeln!(out, "{line}")?;
                    out.flush()?;
                    printed += 1;
                }
            }
        }
    }
}

/// What `hsx submit` did.
#[derive(Debug, Default)]
pub struct SubmitSummary {
    pub accepted: usize,
    pub rejected: usize,
    pub completed: usize,
    pub failed: usize,
}

/// `hsx submit`: sends each line of a JSONL file as a `submit` (adding `"op"`), printing the
/// replies; with `wait`, also waits for and prints every accepted request's event.
pub async fn submit_file(
    socket: &Path,
    file: &Path,
    wait: bool,
    out: &mut impl Write,
) -> anyhow::Result<SubmitSummary> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let mut summary = SubmitSummary::default();
    let mut events = None;
    if wait {
        let mut conn = Connection::connect(socket).await?;
        let status = conn.request(&json!({"op": "status"})).await?;
        let from = status["last_seq"].as_u64().unwrap_or(0);
        let reply = conn
            .request(&json!({"op": "subscribe", "from_seq": from}))
            .await?;
        if reply["event"] != "subscribed" {
            bail!("subscribe refused: {reply}");
        }
        events = Some(conn);
    }
    let mut conn = Connection::connect(socket).await?;
    let mut pending = HashSet::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let reply = match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(mut map)) => {
                map.entry("op").or_insert_with(|| json!("submit"));
                conn.request(&Value::Object(map)).await?
            }
            _ => json!({"event": "error", "line": n + 1, "message": "not a JSON object"}),
        };
        if reply["event"] == "accepted" {
            summary.accepted += 1;
            if let Some(id) = reply["id"].as_str() {
                pending.insert(id.to_owned());
            }
        } else {
            summary.rejected += 1;
        }
        writeln!(out, "{reply}")?;
    }
    if let Some(mut events) = events {
        while !pending.is_empty() {
            let Some(event) = events.recv().await? else {
                bail!(
                    "the daemon ended the event stream with {} requests pending",
                    pending.len()
                );
            };
            let Some(id) = event["id"].as_str() else {
                continue;
            };
            if !pending.remove(id) {
                continue;
            }
            match event["event"].as_str() {
                Some("completed") => summary.completed += 1,
                _ => summary.failed += 1,
            }
            writeln!(out, "{event}")?;
        }
    }
    out.flush()?;
    Ok(summary)
}
