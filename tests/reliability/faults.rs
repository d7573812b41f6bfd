//! Issue 6.2-6.6 against the real daemon (in process): disk full / I/O errors (through the
//! writer fault hook of src/faults.rs), hostile input (property fuzzing + socket-level cases not
//! covered by tests/daemon_*.rs; the proptest fuzzing of tests/soak/fuzz.rs), lost subscribers resuming exactly once, a small load run
//! through both frontends, and a model-runner fault on one step.

use crate::daemon_support;
use crate::fuzz;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use daemon_support::{TestDaemon, check_file, daemon_config, recv_within, submit, subscriber};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

fn prompt(i: usize) -> Vec<u32> {
    (0..2 + i % 9)
        .map(|j| ((i * 31 + j * 7) % 500 + 1) as u32)
        .collect()
}

/// Events for `ids` from a subscriber, keyed by id.
async fn events_for(
    sub: &mut hsx::server::client::Connection,
    ids: &[String],
) -> HashMap<String, Value> {
    let want: HashSet<&String> = ids.iter().collect();
    let mut got = HashMap::new();
    while got.len() < want.len() {
        let v = recv_within(sub, 60).await.expect("event stream open");
        if let Some(id) = v["id"].as_str().filter(|id| want.contains(&id.to_string())) {
            got.insert(id.to_owned(), v);
        }
    }
    got
}

async fn quiet(d: &TestDaemon) -> Value {
    let mut c = d.connect().await;
    for _ in 0..200 {
        let s = c.request(&json!({"op": "status"})).await.unwrap();
        if s["waiting"] == 0
            && s["running"] == 0
            && s["pending_requests"] == 0
            && s["writes_in_flight"] == 0
        {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("engine did not go idle");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_full_fails_each_request_with_the_os_error_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = daemon_config(dir.path());
    let d = TestDaemon::start(&cfg).await;
    let full = Arc::new(AtomicBool::new(true));
    let (flag, root) = (full.clone(), d.out.clone());
    hsx::faults::set_write_fault(Some(Arc::new(move |p: &std::path::Path| {
        (p.starts_with(&root) && flag.load(Ordering::SeqCst))
            .then(|| std::io::Error::from_raw_os_error(28))
    })));
    let mut sub = subscriber(&d, None).await;
    let mut c = d.connect().await;
    let ids: Vec<String> = (0..6).map(|i| format!("full{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(submit(&mut c, id, &prompt(i)).await["event"], "accepted");
    }
    let got = events_for(&mut sub, &ids).await;
    for (id, ev) in &got {
        assert_eq!(ev["event"], "failed", "{ev}");
        let err = ev["error"].as_str().unwrap();
        assert!(
            err.contains("No space left on device") && err.contains("os error 28"),
            "{err}"
        );
        assert!(!d.out.join(format!("{id}.safetensors")).exists());
    }
    // HTTP while full: an OpenAI-shaped 500 naming the OS error.
    let (status, resp) = d
        .post(
            "/v1/completions",
            &json!({"prompt": [1, 2, 3], "max_tokens": 1}),
        )
        .await;
    assert_eq!(status, 500, "{resp}");
    assert!(
        resp["error"]["message"]
            .as_str()
            .unwrap()
            .contains("No space left"),
        "{resp}"
    );
    let stray: Vec<_> = std::fs::read_dir(&d.out)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp") || n.ends_with(".safetensors"))
        .collect();
    assert!(stray.is_empty(), "no partial or tmp files: {stray:?}");

    // Space returns: the same daemon succeeds again.
    full.store(false, Ordering::SeqCst);
    let ids2: Vec<String> = (0..6).map(|i| format!("ok{i}")).collect();
    for (i, id) in ids2.iter().enumerate() {
        assert_eq!(submit(&mut c, id, &prompt(i)).await["event"], "accepted");
    }
    let got = events_for(&mut sub, &ids2).await;
    for (i, id) in ids2.iter().enumerate() {
        assert_eq!(got[id]["event"], "completed", "{}", got[id]);
        check_file(&got[id], &prompt(i));
    }
    let (status, _) = d
        .post(
            "/v1/completions",
            &json!({"prompt": [1, 2, 3], "max_tokens": 1}),
        )
        .await;
    assert_eq!(status, 200);
    hsx::faults::set_write_fault(None);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_fault_on_one_step_fails_its_requests_frees_blocks_and_engine_continues() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = daemon_config(dir.path());
    let d = TestDaemon::start(&cfg).await;
    // Fail the first step that computes a `boom` request; remember which requests it held.
    let fired = Arc::new(AtomicBool::new(false));
    let victims: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let (f, v) = (fired.clone(), victims.clone());
    hsx::faults::set_step_fault(Some(Arc::new(
        move |plan: &hsx::actors::messages::StepPlan| {
            let ids: Vec<String> = plan.chunks.iter().map(|c| c.id.to_string()).collect();
            if ids.iter().any(|i| i.starts_with("boom")) && !f.swap(true, Ordering::SeqCst) {
                *v.lock().unwrap() = ids;
                return Some("injected device fault (test hook)".into());
            }
            None
        },
    )));
    let mut sub = subscriber(&d, None).await;
    let mut c = d.connect().await;
    let mut ids = Vec::new();
    for i in 0..12 {
        let id = if i == 5 {
            "boom".to_owned()
        } else {
            format!("calm{i}")
        };
        // Long enough prompts to be chunked over several steps (budget 64).
        let tokens: Vec<u32> = (0..40 + i as u32).map(|t| t % 400 + 1).collect();
        assert_eq!(submit(&mut c, &id, &tokens).await["event"], "accepted");
        ids.push(id);
    }
    let got = events_for(&mut sub, &ids).await;
    let victims = victims.lock().unwrap().clone();
    assert!(victims.contains(&"boom".to_owned()));
    for (id, ev) in &got {
        if victims.contains(id) {
            assert_eq!(ev["event"], "failed", "{ev}");
            assert!(
                ev["error"]
                    .as_str()
                    .unwrap()
                    .contains("injected device fault"),
                "{ev}"
            );
            assert!(!d.out.join(format!("{id}.safetensors")).exists());
        } else {
            assert_eq!(ev["event"], "completed", "{ev}");
        }
    }
    let s = quiet(&d).await;
    assert_eq!(s["kv_blocks_used"], 0, "every block returned: {s}");
    assert!(s["kv_blocks_total"].as_u64().unwrap() > 0);
    // And the engine keeps going.
    assert_eq!(
        submit(&mut c, "after", &[1, 2, 3]).await["event"],
        "accepted"
    );
    let got = events_for(&mut sub, &["after".to_owned()]).await;
    check_file(&got["after"], &[1, 2, 3]);
    hsx::faults::set_step_fault(None);
    d.stop().await;
}

/// The short CI run of the proptest fuzzing (tests/soak/fuzz.rs; the soak example runs 1M+).
/// `HSX_FUZZ_CASES` and `HSX_FUZZ_SEED` override the case count and the seed.
#[test]
fn fuzzed_protocol_and_http_bodies_never_panic() {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let cases = env("HSX_FUZZ_CASES").map_or(50_000, |n| n as u32);
    let seed = env("HSX_FUZZ_SEED").unwrap_or(6);
    let started = std::time::Instant::now();
    let stats = fuzz::run(cases, seed).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    eprintln!(
        "{cases} cases in {:.1}s: {stats:?}",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(stats.cases, u64::from(cases));
    // Every kind of outcome is reached: the strategies are not stuck on one side.
    assert!(stats.socket_ok > 0 && stats.socket_err > 0, "{stats:?}");
    assert!(stats.http_ok > 0 && stats.http_err > 0, "{stats:?}");
    assert!(stats.path_ok > 0 && stats.path_err > 0, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_socket_bytes_get_errors_and_the_daemon_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(&daemon_config(dir.path())).await;
    let mut c = d.connect().await;
    let deep = format!(
        "{{\"op\":\"submit\",\"token_ids\":{}1{}}}",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"{\"op\":\"status\xff\xfe\"}".to_vec(), "not valid UTF-8"),
        (deep.into_bytes(), "recursion limit"),
        (
            format!(
                "{{\"op\":\"submit\",\"token_ids\":{}1{}}}",
                "[".repeat(200),
                "]".repeat(200)
            )
            .into_bytes(),
            "recursion limit",
        ),
        (
            br#"{"op":"submit","token_ids":[1,99999999999999999999999]}"#.to_vec(),
            "invalid",
        ),
        (
            br#"{"op":"submit","token_ids":[1,9223372036854775807]}"#.to_vec(),
            "out of range",
        ),
        (
            br#"{"op":"submit","token_ids":[1,4294967296]}"#.to_vec(),
            "out of range",
        ),
        (br#"{"op":"submit","token_ids":[1.5]}"#.to_vec(), "invalid"),
        (
            br#"{"op":"submit","id":"/etc/passwd","token_ids":[1]}"#.to_vec(),
            "invalid request id",
        ),
        (b"\x00\x01\x02".to_vec(), "invalid JSON"),
    ];
    for (line, text) in cases {
        let mut s = tokio::net::UnixStream::connect(&d.socket).await.unwrap();
        s.write_all(&line).await.unwrap();
        s.write_all(b"\n").await.unwrap();
        let mut r = tokio::io::BufReader::new(s);
        let mut reply = String::new();
        tokio::time::timeout(
            Duration::from_secs(20),
            tokio::io::AsyncBufReadExt::read_line(&mut r, &mut reply),
        )
        .await
        .unwrap()
        .unwrap();
        let v: Value = serde_json::from_str(&reply).unwrap();
        assert!(
            v["message"].as_str().unwrap().contains(text),
            "{}: {v}",
            String::from_utf8_lossy(&line[..line.len().min(60)])
        );
    }
    assert_eq!(submit(&mut c, "still", &[1, 2]).await["event"], "accepted");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriber_that_disconnects_and_resumes_gets_every_event_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(&daemon_config(dir.path())).await;
    // A subscriber that never reads, for the whole run.
    let _stuck = subscriber(&d, None).await;
    let n = 40;
    let mut c = d.connect().await;
    let submitter = {
        let socket = d.socket.clone();
        tokio::spawn(async move {
            let mut c = hsx::server::client::Connection::connect(&socket)
                .await
                .unwrap();
            for i in 0..n {
                submit(&mut c, &format!("s{i}"), &prompt(i)).await;
            }
        })
    };
    let mut seen: Vec<(u64, String)> = Vec::new();
    let mut last = 0u64;
    let mut reconnects = 0;
    while seen.len() < n {
        let mut sub = subscriber(&d, Some(last)).await;
        // Take a few events, then drop the connection without warning.
        for _ in 0..3 {
            let v = recv_within(&mut sub, 60).await.expect("open");
            let seq = v["seq"].as_u64().unwrap();
            assert!(seq > last, "events in order, none repeated");
            last = seq;
            seen.push((seq, v["id"].as_str().unwrap().to_owned()));
            if seen.len() == n {
                break;
            }
        }
        reconnects += 1;
    }
    submitter.await.unwrap();
    let ids: HashSet<&String> = seen.iter().map(|(_, id)| id).collect();
    assert_eq!(
        ids.len(),
        n,
        "every event exactly once over {reconnects} connections"
    );
    assert_eq!(submit(&mut c, "late", &[1]).await["event"], "accepted");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_over_socket_and_http_is_bounded_and_every_accepted_request_completes() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = daemon_config(dir.path());
    cfg.engine.max_waiting = 32;
    let d = Arc::new(TestDaemon::start(&cfg).await);
    let mut sub = subscriber(&d, None).await;
    let accepted_http = Arc::new(AtomicU64::new(0));
    let overloaded_http = Arc::new(AtomicU64::new(0));
    let mut http = Vec::new();
    for i in 0..40 {
        let (d, a, o) = (d.clone(), accepted_http.clone(), overloaded_http.clone());
        http.push(tokio::spawn(async move {
            let (status, resp) = d
                .post(
                    "/v1/completions",
                    &json!({"prompt": prompt(i), "max_tokens": 1}),
                )
                .await;
            match status {
                200 => a.fetch_add(1, Ordering::SeqCst),
                503 => {
                    assert!(
                        resp["error"]["message"]
                            .as_str()
                            .unwrap()
                            .contains("max_waiting")
                            || resp.to_string().contains("overloaded"),
                        "{resp}"
                    );
                    o.fetch_add(1, Ordering::SeqCst)
                }
                s => panic!("{s}: {resp}"),
            };
        }));
    }
    let mut c = d.connect().await;
    let n = 300;
    for i in 0..n {
        c.send(&json!({"op": "submit", "id": format!("b{i}"), "token_ids": prompt(i)}))
            .await
            .unwrap();
    }
    let mut accepted = Vec::new();
    let mut overloaded = 0;
    for _ in 0..n {
        let v = recv_within(&mut c, 60).await.unwrap();
        match v["event"].as_str() {
            Some("accepted") => accepted.push(v["id"].as_str().unwrap().to_owned()),
            _ => {
                assert_eq!(v["reason"], "overloaded", "{v}");
                overloaded += 1;
            }
        }
    }
    assert!(overloaded > 0, "the queue bound was hit");
    let got = events_for(&mut sub, &accepted).await;
    assert!(got.values().all(|e| e["event"] == "completed"));
    for h in http {
        h.await.unwrap();
    }
    eprintln!(
        "socket: {} accepted, {overloaded} overloaded; http: {} ok, {} overloaded",
        accepted.len(),
        accepted_http.load(Ordering::SeqCst),
        overloaded_http.load(Ordering::SeqCst)
    );
    let d = Arc::try_unwrap(d).ok().expect("sole owner");
    d.stop().await;
}
