//! Long reliability runs by hand (issue 6); the short versions run in CI as
//! tests/reliability_*.rs. Build and run:
//!
//! ```text
//! cargo build --release && cargo run --release --example soak -- crash 100
//! cargo run --release --example soak -- fuzz --cases 1000000 [--seed S]
//! cargo run --release --example soak -- model-dirs --cases 100000 [--seed S]
//! cargo run --release --example soak -- subscribers 1000
//! cargo run --release --example soak -- load 10000
//! cargo run --release --example soak -- conns 10000
//! ```
//! The daemon is `target/release/hsx` next to this binary (or `$HSX_BIN`); the model is the
//! llama fixture (or `$HSX_MODEL`).

#[path = "conns.rs"]
mod conns;
#[path = "crash.rs"]
mod crash;
#[path = "fuzz.rs"]
mod fuzz;
#[path = "model_dirs.rs"]
mod model_dirs;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

fn hsx_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("HSX_BIN") {
        return p.into();
    }
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().join("hsx")
}

fn model() -> PathBuf {
    std::env::var_os("HSX_MODEL").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/llama"),
        PathBuf::from,
    )
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    match args.first().map(String::as_str) {
        Some("crash") => crash_runs(
            n.max(1),
            args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1500),
        ),
        Some("fuzz") => fuzz_run(&args),
        Some("model-dirs") => model_dirs_run(&args),
        Some("subscribers") => subscribers(n.max(1) as usize),
        Some("load") => load(n.max(1) as usize),
        Some("conns") => conns::run(n.max(1) as usize),
        _ => eprintln!(
            "usage: soak crash N [max_kill_ms] | fuzz --cases N [--seed S] | model-dirs --cases N \
             [--seed S] | subscribers N | load N | conns N"
        ),
    }
}

fn crash_runs(trials: u64, max_kill_ms: u64) {
    let (bin, model) = (hsx_bin(), model());
    let mut total = crash::Trial::default();
    let mut failed = 0;
    let mut mid_run = 0;
    let started = Instant::now();
    for i in 0..trials {
        let dir = tempfile::tempdir().unwrap();
        let t = crash::run_trial(&bin, &model, dir.path(), 200, 0x6000 + i, max_kill_ms);
        if !t.ok() {
            failed += 1;
            eprintln!("FAILED trial {i}: {t:?}");
        }
        if t.completed_before_kill < t.requests {
            mid_run += 1;
        }
        total.requests += t.requests;
        total.completed_before_kill += t.completed_before_kill;
        total.partial_or_corrupt += t.partial_or_corrupt;
        total.completed_missing_or_wrong += t.completed_missing_or_wrong;
        total.tmp_after_kill += t.tmp_after_kill;
        total.tmp_after_restart += t.tmp_after_restart;
        total.finished_after_restart += t.finished_after_restart;
        total.torn_journal_lines += t.torn_journal_lines;
    }
    println!(
        "crash: {trials} trials ({mid_run} killed mid-run), {failed} failed, {:.0}s\n{total:#?}",
        started.elapsed().as_secs_f64()
    );
}

/// `fuzz N` or `fuzz --cases N [--seed S]`: N proptest cases (tests/soak/fuzz.rs).
/// `--cases N` (or N as the first argument; `default` without) and `--seed S` (or the clock).
fn cases_and_seed(args: &[String], default: u64) -> (u32, u64) {
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse::<u64>().ok())
    };
    let cases = flag("--cases")
        .or_else(|| args.get(1).and_then(|s| s.parse().ok()))
        .unwrap_or(default);
    let seed = flag("--seed").unwrap_or_else(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        t.map_or(0x6006, |d| d.as_nanos() as u64)
    });
    let cases = u32::try_from(cases).expect("at most u32::MAX cases");
    (cases, seed)
}

/// Hostile model directories (issue 17.2): alone in this process, so the bound on one
/// allocation is tight: 4 MiB beyond four times the directory's size.
fn model_dirs_run(args: &[String]) {
    let (cases, seed) = cases_and_seed(args, 100_000);
    let started = Instant::now();
    match model_dirs::run(cases, seed, 4 << 20) {
        Ok(s) => println!(
            "model-dirs (proptest, seed {seed}): {} cases, 0 panics, 0 property failures, {:.1}s\n  \
             model: {} loaded and ran, refused {} at the config, {} at load, {} at the forward\n  \
             tokenizer + template: {} encoded a conversation, {} refused\n  \
             longest refusal message {} bytes, largest single allocation {} bytes (model), {} \
             bytes (tokenizer + template)",
            s.cases,
            started.elapsed().as_secs_f64(),
            s.ran,
            s.refused_config,
            s.refused_load,
            s.refused_forward,
            s.chat_ok,
            s.chat_refused,
            s.longest_message,
            s.largest_alloc,
            s.largest_chat_alloc,
        ),
        Err(e) => {
            println!(
                "model-dirs (proptest, seed {seed}): FAILED after {:.1}s\n{e}",
                started.elapsed().as_secs_f64()
            );
            std::process::exit(1);
        }
    }
}

fn fuzz_run(args: &[String]) {
    let (cases, seed) = cases_and_seed(args, 1_000_000);
    let started = Instant::now();
    match fuzz::run(cases, seed) {
        Ok(s) => println!(
            "fuzz (proptest, seed {seed}): {} cases, 0 panics, 0 property failures, {:.1}s\n  \
             socket lines: {} accepted, {} refused\n  HTTP bodies: {} accepted, {} refused\n  \
             custom paths: {} accepted (all confined), {} refused\n  longest refusal message: {} bytes (sent cut to 1 KiB)",
            s.cases,
            started.elapsed().as_secs_f64(),
            s.socket_ok,
            s.socket_err,
            s.http_ok,
            s.http_err,
            s.path_ok,
            s.path_err,
            s.max_error_len,
        ),
        Err(e) => {
            println!(
                "fuzz (proptest, seed {seed}): FAILED after {:.1}s\n{e}",
                started.elapsed().as_secs_f64()
            );
            std::process::exit(1);
        }
    }
}

/// Writes a config with HTTP on a free port; returns the HTTP address.
fn config_with_http(dir: &Path, max_waiting: usize) -> String {
    let cfg = crash::write_config(dir, &model(), max_waiting);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str(&format!("[http]\naddress = \"{addr}\"\n"));
    std::fs::write(&cfg, text).unwrap();
    addr
}

fn status(socket: &Path) -> Value {
    let mut c = crash::Client::connect(socket).unwrap();
    c.send(&json!({"op": "status"})).unwrap();
    c.recv().unwrap().unwrap()
}

fn vm_hwm_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn long_prompt(i: usize) -> Vec<u32> {
    (0..48)
        .map(|j| ((i * 31 + j * 7) % 500 + 1) as u32)
        .collect()
}

/// Throughput of `n` requests with no subscriber vs. with a stuck subscriber (never reads)
/// plus one that disconnects every few events and resumes with `from_seq`.
fn subscribers(n: usize) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut results: Vec<(&str, f64)> = Vec::new();
    for round in 0..2 {
        for with_subs in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            crash::write_config(dir.path(), &model(), n.max(1024));
            let child = crash::start(&hsx_bin(), dir.path());
            let socket = dir.path().join("d.sock");
            let secs = rt.block_on(async {
                let mut stuck = None;
                let mut resumer = None;
                if with_subs {
                    let mut s = tokio::net::UnixStream::connect(&socket).await.unwrap();
                    s.write_all(b"{\"op\":\"subscribe\",\"from_seq\":0}\n").await.unwrap();
                    stuck = Some(s);
                    let socket = socket.clone();
                    resumer = Some(tokio::spawn(async move { resume_loop(&socket, n).await }));
                }
                let started = Instant::now();
                // Replies are read while submitting (the daemon stops reading a client that
                // does not take its replies).
                let (lines, _) = submit_split(&socket, (0..n).map(|i| (format!("t{i}"), long_prompt(i))).collect()).await;
                assert_eq!(lines.len(), n);
                let mut c = hsx::server::client::Connection::connect(&socket).await.unwrap();
                loop {
                    let s = c.request(&json!({"op": "status"})).await.unwrap();
                    if s["last_seq"].as_u64().unwrap_or(0) >= n as u64 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let secs = started.elapsed().as_secs_f64();
                if let Some(r) = resumer {
                    let (events, distinct, reconnects) = r.await.unwrap();
                    println!(
                        "  resumed subscriber: {events} events, {distinct} distinct ids, {reconnects} reconnects"
                    );
                    assert_eq!((events, distinct), (n, n), "exactly once");
                }
                drop(stuck);
                secs
            });
            crash::sigkill(child);
            let label = if with_subs {
                "stuck+resuming subscribers"
            } else {
                "no subscriber"
            };
            println!(
                "round {round}: {label}: {n} requests in {secs:.2}s ({:.0} req/s)",
                n as f64 / secs
            );
            results.push((label, secs));
        }
    }
    let mean = |l: &str| {
        let v: Vec<f64> = results.iter().filter(|r| r.0 == l).map(|r| r.1).collect();
        v.iter().sum::<f64>() / v.len() as f64
    };
    let (a, b) = (mean("no subscriber"), mean("stuck+resuming subscribers"));
    println!(
        "mean: no subscriber {a:.2}s, with subscribers {b:.2}s: throughput ratio {:.3}",
        a / b
    );
}

/// Subscribes, reads 10 events, drops the connection, resumes from the last seq; returns
/// (events, distinct ids, reconnects).
async fn resume_loop(socket: &Path, n: usize) -> (usize, usize, usize) {
    let mut ids = std::collections::HashSet::new();
    let (mut events, mut last, mut reconnects) = (0, 0u64, 0);
    while events < n {
        let s = tokio::net::UnixStream::connect(socket).await.unwrap();
        let (rd, mut wr) = s.into_split();
        wr.write_all(format!("{{\"op\":\"subscribe\",\"from_seq\":{last}}}\n").as_bytes())
            .await
            .unwrap();
        let mut lines = BufReader::new(rd).lines();
        let mut taken = 0;
        while taken < 10 && events < n {
            let Some(line) = lines.next_line().await.unwrap() else {
                break;
            };
            let v: Value = serde_json::from_str(&line).unwrap();
            let Some(seq) = v["seq"].as_u64() else {
                continue;
            };
            assert!(seq > last, "no event twice");
            last = seq;
            ids.insert(v["id"].as_str().unwrap().to_owned());
            events += 1;
            taken += 1;
        }
        reconnects += 1;
    }
    (events, ids.len(), reconnects)
}

/// `n` requests at once, half over the socket (8 connections) and half over HTTP (one
/// connection each); reports accepted / overloaded, completion, peak RSS.
fn load(n: usize) {
    let dir = tempfile::tempdir().unwrap();
    let addr = config_with_http(dir.path(), 1024);
    let child = crash::start(&hsx_bin(), dir.path());
    let pid = child.id();
    let socket = dir.path().join("d.sock");
    let rss_idle = vm_hwm_kib(pid);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    let (sock_acc, sock_over, http_ok, http_over, http_other, completed) = rt.block_on(async {
        let http_ok = Arc::new(AtomicU64::new(0));
        let http_over = Arc::new(AtomicU64::new(0));
        let http_other = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for i in 0..n / 2 {
            let (addr, ok, over, other) = (addr.clone(), http_ok.clone(), http_over.clone(), http_other.clone());
            tasks.push(tokio::spawn(async move {
                let body = json!({"prompt": long_prompt(i), "max_tokens": 1}).to_string();
                let Ok(mut s) = tokio::net::TcpStream::connect(&addr).await else {
                    other.fetch_add(1, Ordering::Relaxed);
                    return;
                };
                let req = format!(
                    "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(req.as_bytes()).await;
                let mut buf = Vec::new();
                let _ = s.read_to_end(&mut buf).await;
                let text = String::from_utf8_lossy(&buf);
                let code = text.split(' ').nth(1).unwrap_or("");
                match code {
                    "200" => ok.fetch_add(1, Ordering::Relaxed),
                    "503" if text.contains("overloaded") => over.fetch_add(1, Ordering::Relaxed),
                    _ => {
                        if other.fetch_add(1, Ordering::Relaxed) < 3 {
                            eprintln!("http: {}", text.lines().last().unwrap_or(""));
                        }
                        0
                    }
                };
            }));
        }
        let mut sub = hsx::server::client::Connection::connect(&socket).await.unwrap();
        sub.request(&json!({"op": "subscribe", "from_seq": 0})).await.unwrap();
        let per_conn = (n - n / 2).div_ceil(8);
        let mut socks = Vec::new();
        for k in 0..8 {
            let socket = socket.clone();
            socks.push(tokio::spawn(async move {
                let ids: Vec<usize> = (k * per_conn..((k + 1) * per_conn).min(n - n / 2)).collect();
                let reqs = ids.iter().map(|&i| (format!("s{i}"), long_prompt(i))).collect();
                let (lines, _) = submit_split(&socket, reqs).await;
                let (mut acc, mut over) = (Vec::new(), 0u64);
                for v in lines {
                    match v["event"].as_str() {
                        Some("accepted") => acc.push(v["id"].as_str().unwrap().to_owned()),
                        _ if v["reason"] == "overloaded" => over += 1,
                        _ => eprintln!("socket: {v}"),
                    }
                }
                (acc, over)
            }));
        }
        let (mut accepted, mut over) = (std::collections::HashSet::new(), 0);
        for s in socks {
            let (a, o) = s.await.unwrap();
            accepted.extend(a);
            over += o;
        }
        let mut completed = 0;
        let mut seen = std::collections::HashSet::new();
        while seen.len() < accepted.len() {
            let v = sub.recv().await.unwrap().unwrap();
            if let Some(id) = v["id"].as_str()
                && accepted.contains(id)
                && seen.insert(id.to_owned())
                && v["event"] == "completed"
            {
                completed += 1;
            }
        }
        for t in tasks {
            let _ = t.await;
        }
        (
            accepted.len(),
            over,
            http_ok.load(Ordering::Relaxed),
            http_over.load(Ordering::Relaxed),
            http_other.load(Ordering::Relaxed),
            completed,
        )
    });
    let secs = started.elapsed().as_secs_f64();
    let peak = vm_hwm_kib(pid);
    let st = status(&socket);
    crash::sigkill(child);
    println!(
        "load: {n} requests at once ({} socket, {} HTTP) in {secs:.1}s\n  socket: {sock_acc} accepted, {sock_over} overloaded; {completed}/{sock_acc} accepted completed\n  HTTP: {http_ok} completed (200), {http_over} overloaded (503), {http_other} other\n  peak RSS {:.1} MiB (idle {:.1} MiB); end: waiting {} running {} pending_bytes {}",
        n - n / 2,
        n / 2,
        peak as f64 / 1024.0,
        rss_idle as f64 / 1024.0,
        st["waiting"],
        st["running"],
        st["pending_bytes"],
    );
}

/// Submits on one connection with a concurrent reader; returns the replies in order.
async fn submit_split(socket: &Path, reqs: Vec<(String, Vec<u32>)>) -> (Vec<Value>, ()) {
    let s = tokio::net::UnixStream::connect(socket).await.unwrap();
    let (rd, mut wr) = s.into_split();
    let n = reqs.len();
    let reader = tokio::spawn(async move {
        let mut lines = BufReader::new(rd).lines();
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let Ok(Some(line)) = lines.next_line().await else {
                break;
            };
            out.push(serde_json::from_str::<Value>(&line).unwrap());
        }
        out
    });
    for (id, tokens) in reqs {
        let mut line = json!({"op": "submit", "id": id, "token_ids": tokens}).to_string();
        line.push('\n');
        wr.write_all(line.as_bytes()).await.unwrap();
    }
    (reader.await.unwrap(), ())
}
