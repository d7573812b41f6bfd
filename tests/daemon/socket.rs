//! The daemon's Unix socket protocol, against the real server on a temporary socket.

use crate::common;
use crate::daemon_support;

use std::collections::HashMap;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::time::{Duration, Instant};

use daemon_support::{TestDaemon, check_file, daemon_config, recv_within, submit, subscriber};
use serde_json::json;

fn prompt(i: usize) -> Vec<u32> {
    common::random_prompt(i as u64, 3 + i % 17, 512)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_requests_fifty_events_and_late_replay() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(&daemon_config(dir.path())).await;
    let mode = std::fs::metadata(&d.socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "socket mode {mode:o}");

    let mut events = subscriber(&d, None).await;
    let mut conn = d.connect().await;
    let mut prompts = HashMap::new();
    for i in 0..50 {
        let id = format!("r{i:02}");
        let reply = submit(&mut conn, &id, &prompt(i)).await;
        assert_eq!(reply["event"], "accepted", "{reply}");
        assert_eq!(reply["id"], id.as_str());
        prompts.insert(id, prompt(i));
    }
    let mut seqs = Vec::new();
    for _ in 0..50 {
        let e = recv_within(&mut events, 60).await.expect("event");
        // The file is complete when its event arrives.
        check_file(&e, &prompts[e["id"].as_str().unwrap()]);
        assert_eq!(e["layer_ids"], json!([0, 2, 4]));
        seqs.push(e["seq"].as_u64().unwrap());
    }
    assert_eq!(seqs, (1..=50).collect::<Vec<_>>());

    let status = conn.request(&json!({"op": "status"})).await.unwrap();
    assert_eq!(status["event"], "status", "{status}");
    assert_eq!(status["last_seq"], 50);
    assert_eq!(status["waiting"], 0);
    assert!(status["tokens_computed"].as_u64().unwrap() > 0);
    assert!(status.get("tokens_per_s").is_some() && status.get("running").is_some());

    let mut late = subscriber(&d, Some(0)).await;
    let mut ids = Vec::new();
    for _ in 0..50 {
        let e = recv_within(&mut late, 10).await.unwrap();
        ids.push(e["id"].as_str().unwrap().to_owned());
    }
    ids.sort();
    let mut want: Vec<String> = prompts.keys().cloned().collect();
    want.sort();
    assert_eq!(ids, want);
    d.stop().await;
    assert!(!dir.path().join("hsx.sock").exists(), "socket removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_errors_and_the_connection_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = daemon_config(dir.path());
    cfg.socket.max_line_bytes = 1024;
    cfg.engine.max_model_len = 100;
    let d = TestDaemon::start(&cfg).await;
    let mut c = d.connect().await;
    let huge = format!(
        "{{\"op\":\"submit\",\"token_ids\":[{}]}}",
        vec!["1"; 2000].join(",")
    );
    let cases: Vec<(String, &str, &str)> = vec![
        ("{not json".into(), "error", "invalid JSON"),
        (r#"{"op":"explode"}"#.into(), "error", "unknown op"),
        (
            r#"{"op":"submit","token_ids":"1 2"}"#.into(),
            "error",
            "invalid type",
        ),
        (
            r#"{"op":"submit","token_ids":[1],"x":1}"#.into(),
            "error",
            "unknown field",
        ),
        (
            r#"{"op":"subscribe","from_seq":"a"}"#.into(),
            "error",
            "invalid type",
        ),
        (huge, "error", "longer than 1024"),
        (
            r#"{"op":"submit","token_ids":[1,512]}"#.into(),
            "token_out_of_range",
            "512",
        ),
        (
            r#"{"op":"submit","token_ids":[-3]}"#.into(),
            "token_out_of_range",
            "-3",
        ),
        (
            r#"{"op":"submit","token_ids":[]}"#.into(),
            "empty_prompt",
            "empty",
        ),
        (
            r#"{"op":"submit","token_ids":[1],"max_tokens":200}"#.into(),
            "too_long",
            "max_model_len",
        ),
        (
            r#"{"op":"submit","id":"../x","token_ids":[1]}"#.into(),
            "invalid_id",
            "invalid request id",
        ),
        (r#"{"op":"submit"}"#.into(), "invalid_request", "missing"),
    ];
    for (line, kind, text) in cases {
        c.send_raw(&line).await.unwrap();
        let reply = recv_within(&mut c, 10).await.unwrap();
        let got = reply["reason"]
            .as_str()
            .unwrap_or(reply["event"].as_str().unwrap());
        assert_eq!(got, kind, "{line}: {reply}");
        let msg = reply["message"].as_str().unwrap();
        assert!(msg.contains(text), "{line}: {reply}");
    }
    let reply = submit(&mut c, "fine", &[1, 2, 3]).await;
    assert_eq!(reply["event"], "accepted", "{reply}");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_queue_is_rejected_as_overloaded_without_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = daemon_config(dir.path());
    cfg.engine.max_waiting = 1;
    cfg.engine.max_num_seqs = 1;
    cfg.engine.max_num_batched_tokens = 16;
    let d = TestDaemon::start(&cfg).await;
    let mut c = d.connect().await;
    let long = common::random_prompt(7, 400, 512);
    let started = Instant::now();
    let mut overloaded = 0;
    for i in 0..6 {
        let reply = tokio::time::timeout(
            Duration::from_secs(5),
            submit(&mut c, &format!("q{i}"), &long),
        )
        .await
        .expect("a reply, never a hang");
        if reply["event"] == "rejected" {
            assert_eq!(reply["reason"], "overloaded", "{reply}");
            overloaded += 1;
        }
    }
    assert!(overloaded >= 3, "{overloaded} overloaded rejections");
    assert!(started.elapsed() < Duration::from_secs(5));
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_fails_the_request_and_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = daemon_config(dir.path());
    cfg.engine.max_num_batched_tokens = 8;
    let d = TestDaemon::start(&cfg).await;
    let mut events = subscriber(&d, None).await;
    let mut c = d.connect().await;
    let long = common::random_prompt(3, 1500, 512);
    assert_eq!(submit(&mut c, "long", &long).await["event"], "accepted");
    let reply = c
        .request(&json!({"op": "abort", "id": "long"}))
        .await
        .unwrap();
    assert_eq!(reply["event"], "abort_requested", "{reply}");
    let e = recv_within(&mut events, 30).await.unwrap();
    assert_eq!(
        (e["event"].as_str(), e["id"].as_str()),
        (Some("failed"), Some("long"))
    );
    assert!(e["error"].as_str().unwrap().contains("aborted"), "{e}");
    assert!(!d.out.join("long.safetensors").exists());
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journal_survives_restart_and_stale_socket_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = daemon_config(dir.path());
    // A socket file nobody listens on (a daemon that was killed).
    drop(std::os::unix::net::UnixListener::bind(&cfg.socket.path).unwrap());
    assert!(
        std::fs::metadata(&cfg.socket.path)
            .unwrap()
            .file_type()
            .is_socket()
    );
    let d = TestDaemon::start(&cfg).await;
    // A live daemon on the path: a second one refuses to start.
    let err = hsx::server::bind_unix(&cfg.socket.path, 0o600).unwrap_err();
    assert!(
        err.to_string().contains("another daemon is listening"),
        "{err}"
    );
    let mut events = subscriber(&d, None).await;
    let mut c = d.connect().await;
    for i in 0..3 {
        submit(&mut c, &format!("j{i}"), &prompt(i)).await;
        recv_within(&mut events, 30).await.unwrap();
    }
    drop((c, events));
    d.stop().await;

    let d = TestDaemon::start(&cfg).await;
    let mut replay = subscriber(&d, Some(1)).await;
    for seq in [2, 3] {
        let e = recv_within(&mut replay, 10).await.unwrap();
        assert_eq!(e["seq"], seq, "{e}");
        check_file(&e, &prompt(seq as usize - 1));
    }
    let mut c = d.connect().await;
    submit(&mut c, "after", &[1, 2]).await;
    let e = recv_within(&mut replay, 30).await.unwrap();
    assert_eq!(
        (e["seq"].as_u64(), e["id"].as_str()),
        (Some(4), Some("after"))
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_subscriber_is_dropped_and_resumes_losing_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = daemon_config(dir.path());
    cfg.events.subscriber_buffer = 16;
    cfg.engine.max_num_seqs = 4;
    cfg.socket.send_buffer_bytes = 4096;
    let d = TestDaemon::start(&cfg).await;
    let mut stuck = subscriber(&d, None).await;
    let mut fast = subscriber(&d, None).await;
    let mut c = d.connect().await;
    let n = 120;
    let started = Instant::now();
    // The fast subscriber reads each event before the next request is submitted: it never
    // lags, however slowly this test's tasks are scheduled (a reader task running beside the
    // submissions fell 16 events behind on a loaded 2-core machine and was dropped too).
    for i in 0..n {
        let reply = submit(&mut c, &format!("s{i:03}"), &[1 + i as u32 % 500]).await;
        assert_eq!(reply["event"], "accepted", "{reply}");
        let e = recv_within(&mut fast, 30).await.unwrap();
        assert_eq!(e["seq"], i as u64 + 1, "{e}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "engine was not slowed"
    );
    // The stuck one now reads: what fitted in its buffers, then the end of its stream.
    let mut seen = Vec::new();
    let last = loop {
        let e = recv_within(&mut stuck, 10).await.expect("an end line");
        if e["event"] == "end" {
            assert_eq!(e["reason"], "lagging", "{e}");
            break e["last_seq"].as_u64().unwrap();
        }
        seen.push(e["seq"].as_u64().unwrap());
    };
    assert!(seen.len() < n, "it was dropped before the end");
    let mut again = subscriber(&d, Some(last)).await;
    while seen.len() < n {
        let e = recv_within(&mut again, 10).await.unwrap();
        seen.push(e["seq"].as_u64().unwrap());
    }
    assert_eq!(seen, (1..=n as u64).collect::<Vec<_>>());
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_prompts_use_the_tokenizer_or_are_rejected_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(&daemon_config(dir.path())).await;
    let mut events = subscriber(&d, None).await;
    let mut c = d.connect().await;
    let reply = c
        .request(&json!({"op": "submit", "id": "t", "text": "Hello world!"}))
        .await
        .unwrap();
    assert_eq!(reply["event"], "accepted", "{reply}");
    let e = recv_within(&mut events, 30).await.unwrap();
    // The ids the Python tokenizers library gives for this text.
    check_file(&e, &[327, 285, 282, 268, 348, 1]);
    d.stop().await;

    let dir = tempfile::tempdir().unwrap();
    let mut cfg = daemon_config(dir.path());
    cfg.model.path = common::model_dir("mistral");
    let d = TestDaemon::start(&cfg).await;
    let mut c = d.connect().await;
    let reply = c
        .request(&json!({"op": "submit", "text": "Hello"}))
        .await
        .unwrap();
    assert_eq!(reply["reason"], "no_tokenizer", "{reply}");
    assert!(
        reply["message"]
            .as_str()
            .unwrap()
            .contains("tokenizer.json")
    );
    d.stop().await;
}
