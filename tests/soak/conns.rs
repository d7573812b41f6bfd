//! `soak conns N`: against the release binary (default `http_read_timeout` 30 s), N idle HTTP
//! connections plus N/10 that send half a request head and stall, all held at once: `/health`
//! and a completion latency meanwhile, the daemon's RSS (VmRSS, VmHWM), then how long until the
//! daemon has closed them all. Then 300 Unix socket connections against the cap of 256: how
//! many are served, how many refused with the error line, and whether a freed slot is reused.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpStream, UnixStream};

use super::{config_with_http, crash, hsx_bin, long_prompt};

fn proc_kib(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// One request on its own connection: (status line, elapsed).
async fn http_once(addr: &str, req: String) -> (String, Duration) {
    let t = Instant::now();
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf).await;
    let text = String::from_utf8_lossy(&buf);
    (text.lines().next().unwrap_or("").to_owned(), t.elapsed())
}

/// Connects and sends `status`: Ok(connection) if served, Err(the line it got instead).
async fn status_on_new(socket: &Path) -> Result<UnixStream, Value> {
    let mut s = UnixStream::connect(socket).await.unwrap();
    let _ = s.write_all(b"{\"op\":\"status\"}\n").await;
    let mut line = String::new();
    let mut r = BufReader::new(&mut s);
    let _ = tokio::time::timeout(Duration::from_secs(30), r.read_line(&mut line)).await;
    let v: Value = serde_json::from_str(&line).unwrap_or_default();
    if v["event"] == "status" {
        Ok(s)
    } else {
        Err(v)
    }
}

pub fn run(n: usize) {
    let dir = tempfile::tempdir().unwrap();
    let addr = config_with_http(dir.path(), 1024);
    let child = crash::start(&hsx_bin(), dir.path());
    let pid = child.id();
    let socket = dir.path().join("d.sock");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let body = serde_json::json!({"prompt": long_prompt(0), "max_tokens": 1}).to_string();
        let completion = format!(
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let health = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_owned();
        let (first, cold) = http_once(&addr, completion.clone()).await;
        let (_, warm) = http_once(&addr, completion.clone()).await;
        let rss_idle = proc_kib(pid, "VmRSS:");
        println!(
            "conns: daemon pid {pid}, RSS {:.1} MiB idle; a completion {warm:?} ({first}, \
             first {cold:?})",
            mib(rss_idle)
        );

        let started = Instant::now();
        let (mut conns, mut failed) = (Vec::with_capacity(n + n / 10), 0);
        for i in 0..n + n / 10 {
            match TcpStream::connect(&addr).await {
                Ok(mut s) => {
                    if i >= n {
                        let head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Pad: ";
                        let _ = s.write_all(head).await;
                        let _ = s.write_all(&[b'a'; 16 << 10]).await;
                    }
                    conns.push(s);
                }
                Err(e) => {
                    if failed == 0 {
                        println!("  connect failed: {e}");
                    }
                    failed += 1;
                }
            }
        }
        let opened = started.elapsed();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (h, health_t) = http_once(&addr, health.clone()).await;
        let (c, complete_t) = http_once(&addr, completion.clone()).await;
        let (rss_held, hwm_held) = (proc_kib(pid, "VmRSS:"), proc_kib(pid, "VmHWM:"));
        println!(
            "  {} HTTP connections held ({n} idle, {} with 16 KiB of a head; {failed} failed to \
             connect) in {opened:.1?}\n  meanwhile: /health {health_t:.1?} ({h}), a completion \
             {complete_t:.1?} ({c})\n  daemon RSS {:.1} MiB (+{:.1} MiB, {:.1} KiB per \
             connection), peak {:.1} MiB",
            conns.len(),
            n / 10,
            mib(rss_held),
            mib(rss_held.saturating_sub(rss_idle)),
            rss_held.saturating_sub(rss_idle) as f64 / conns.len().max(1) as f64,
            mib(hwm_held),
        );

        // The socket cap meanwhile.
        let (mut served, mut refused, mut other) = (Vec::new(), 0, 0);
        for _ in 0..300 {
            match status_on_new(&socket).await {
                Ok(s) => served.push(s),
                Err(v) if v["reason"] == "too_many_connections" => refused += 1,
                Err(v) => {
                    other += 1;
                    println!("  socket: {v}");
                }
            }
        }
        let first = served.len();
        served.truncate(first.saturating_sub(10));
        let t = Instant::now();
        let mut reused = 0;
        while reused < 10 && t.elapsed() < Duration::from_secs(10) {
            match status_on_new(&socket).await {
                Ok(s) => {
                    served.push(s);
                    reused += 1;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        println!(
            "  socket: 300 connections: {first} served, {refused} refused with too_many_connections, \
             {other} other; 10 closed: {reused} new ones served"
        );
        drop(served);

        // How long until the daemon has closed them all (its read timeout is 30 s).
        let mut tasks = tokio::task::JoinSet::new();
        for mut s in conns {
            tasks.spawn(async move {
                let mut buf = Vec::new();
                let r = tokio::time::timeout(Duration::from_secs(120), s.read_to_end(&mut buf));
                r.await.is_ok()
            });
        }
        let mut closed = 0;
        while let Some(r) = tasks.join_next().await {
            closed += usize::from(r.unwrap_or(false));
        }
        println!(
            "  closed by the daemon: {closed}, {:.1?} after they were opened; daemon RSS then \
             {:.1} MiB, peak {:.1} MiB",
            started.elapsed(),
            mib(proc_kib(pid, "VmRSS:")),
            mib(proc_kib(pid, "VmHWM:")),
        );
        let (h, _) = http_once(&addr, health).await;
        println!("  /health afterwards: {h}");
    });
    crash::sigkill(child);
}
