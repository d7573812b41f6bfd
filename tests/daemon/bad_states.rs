//! Bad data is never silent through the daemon (issue 17): on a model with a NaN in one
//! embedding row, a completion whose prompt holds that token answers 500 naming the layer id
//! and token position, a socket subscriber sees `failed`, no file appears; the daemon keeps
//! serving the other requests.

use crate::common::{HsFile, poisoned_llama};
use crate::daemon_support::{TestDaemon, daemon_config, recv_within, submit, subscriber};

use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_states_fail_the_request_and_the_daemon_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = daemon_config(dir.path());
    cfg.model.path = poisoned_llama(dir.path(), 7);
    let d = TestDaemon::start(&cfg).await;
    let bad = json!({"model": "llama-nan", "prompt": [1, 2, 7, 3], "max_tokens": 1});
    let (status, resp) = d.post("/v1/completions", &bad).await;
    assert_eq!(status, 500, "{resp}");
    let msg = resp["error"]["message"].as_str().unwrap_or("");
    assert!(
        msg.contains("layer 0 of token position 2 holds NaN"),
        "{resp}"
    );
    let good = json!({"model": "llama-nan", "prompt": [1, 2, 3], "max_tokens": 1});
    let (status, resp) = d.post("/v1/completions", &good).await;
    assert_eq!(status, 200, "{resp}");
    let path = resp["kv_transfer_params"]["hidden_states_path"]
        .as_str()
        .unwrap();
    assert!(
        HsFile::read(path.as_ref())
            .values()
            .iter()
            .all(|v| v.is_finite())
    );

    let mut events = subscriber(&d, None).await;
    let mut conn = d.connect().await;
    assert_eq!(
        submit(&mut conn, "sock-bad", &[7, 7]).await["event"],
        "accepted"
    );
    loop {
        let e = recv_within(&mut events, 30).await.expect("an event");
        if e["id"] == "sock-bad" {
            assert_eq!(e["event"], "failed", "{e}");
            assert!(e["error"].as_str().unwrap().contains("position 0"), "{e}");
            break;
        }
    }
    assert!(!d.out.join("sock-bad.safetensors").exists());
    assert_eq!(d.get("/health").await.0, 200);
    d.stop().await;
}
