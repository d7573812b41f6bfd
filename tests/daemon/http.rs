//! The daemon's HTTP surface as speculators' client uses it (a drop-in for `vllm serve`).

use crate::common;
use crate::daemon_support;

use std::path::PathBuf;

use daemon_support::{TestDaemon, daemon_config, http_raw};
use serde_json::{Value, json};

fn file_of(v: &Value) -> PathBuf {
    PathBuf::from(v.as_str().unwrap_or_else(|| panic!("no path in {v}")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speculators_request_replayed_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(&daemon_config(dir.path())).await;
    assert_eq!(d.get("/health").await.0, 200);
    let (status, models) = d.get("/v1/models").await;
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&models).unwrap();
    let model = models["data"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(model, "llama");

    // What speculators' vllm_client sends: token ids, max_tokens=1, return_token_ids.
    let ids: Vec<u32> = common::random_prompt(11, 37, 512);
    let body = json!({"model": model, "prompt": ids, "max_tokens": 1, "return_token_ids": true});
    let (status, resp) = d.post("/v1/completions", &body).await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["object"], "text_completion");
    assert_eq!(resp["choices"][0]["prompt_token_ids"], json!(ids));
    assert_eq!(resp["choices"][0]["token_ids"].as_array().unwrap().len(), 1);
    let path = file_of(&resp["kv_transfer_params"]["hidden_states_path"]);
    assert!(
        path.is_absolute() && path.starts_with(&d.out),
        "{}",
        path.display()
    );
    // Complete when the response arrives, without any lock.
    let f = common::HsFile::read(&path);
    assert_eq!(f.shape, vec![37, 3, 64]);
    assert_eq!(
        f.token_ids,
        ids.iter().map(|&t| t as i64).collect::<Vec<_>>()
    );
    assert!(!path.with_extension("safetensors.lock").exists());
    assert_eq!(resp["usage"]["prompt_tokens"], 37);

    // A batch: one file per prompt, each choice echoing its ids.
    let batch = vec![vec![1u32, 2, 3], vec![4, 5], vec![6]];
    let body = json!({"model": model, "prompt": batch, "max_tokens": 2, "return_token_ids": true,
                      "kv_transfer_params": {"include_output_tokens": true}});
    let (status, resp) = d.post("/v1/completions", &body).await;
    assert_eq!(status, 200, "{resp}");
    let choices = resp["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["prompt_token_ids"], json!(batch[i]));
        let out = c["token_ids"].as_array().unwrap();
        assert_eq!(out.len(), 2);
        let f = common::HsFile::read(&file_of(&c["kv_transfer_params"]["hidden_states_path"]));
        // include_output_tokens: the prompt plus every generated token but the last.
        assert_eq!(f.shape[0], batch[i].len() + 1);
        assert_eq!(f.token_ids.last().copied(), out[0].as_i64());
    }
    assert_eq!(
        resp["kv_transfer_params"]["hidden_states_path"],
        choices[0]["kv_transfer_params"]["hidden_states_path"]
    );

    // vLLM's default max_tokens is 16; without return_token_ids no ids come back.
    let (status, resp) = d.post("/v1/completions", &json!({"prompt": [7, 8]})).await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["usage"]["completion_tokens"], 16);
    assert_eq!(resp["choices"][0]["prompt_token_ids"], Value::Null);

    // A text prompt goes through tokenizer.json.
    let (status, resp) = d
        .post(
            "/v1/completions",
            &json!({"prompt": "Hello world!", "max_tokens": 1, "return_token_ids": true}),
        )
        .await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(
        resp["choices"][0]["prompt_token_ids"],
        json!([327, 285, 282, 268, 348, 1])
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_openai_shaped_with_the_right_codes() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = daemon_config(dir.path());
    cfg.engine.max_model_len = 64;
    cfg.engine.max_waiting = 2;
    let d = TestDaemon::start(&cfg).await;
    let cases = [
        (json!({"prompt": [1, 512]}), 400, "out of range"),
        (json!({"prompt": [1, -1]}), 400, "out of range"),
        (json!({"prompt": []}), 400, "empty"),
        (json!({"prompt": {"a": 1}}), 400, "prompt must be"),
        (
            json!({"prompt": [1], "max_tokens": "x"}),
            400,
            "invalid request",
        ),
        (json!({"max_tokens": 1}), 400, "prompt"),
        (
            json!({"prompt": [1], "model": "gpt-9"}),
            404,
            "does not exist",
        ),
        (
            json!({"prompt": vec![1; 60], "max_tokens": 10}),
            413,
            "max_model_len",
        ),
        (json!({"prompt": [[1], [2], [3]]}), 503, "max_waiting"),
        (
            json!({"prompt": [1], "kv_transfer_params": {"hidden_states_path": "x.safetensors"}}),
            400,
            "not allowed",
        ),
    ];
    for (body, code, text) in cases {
        let (status, resp) = d.post("/v1/completions", &body).await;
        assert_eq!(status, code, "{body} -> {resp}");
        assert_eq!(resp["error"]["code"], code, "{resp}");
        assert!(resp["error"]["type"].is_string());
        let msg = resp["error"]["message"].as_str().unwrap();
        assert!(msg.contains(text), "{body} -> {msg}");
    }
    let (status, text) = http_raw(d.http, "POST", "/v1/completions", b"{nope").await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("\"error\""));
    let big = vec![b' '; 2 << 20];
    let (status, _) = http_raw(d.http, "POST", "/v1/completions", &big).await;
    assert_eq!(status, 413);
    assert_eq!(d.get("/nowhere").await.0, 404);
    // Still serving.
    let (status, resp) = d
        .post(
            "/v1/completions",
            &json!({"prompt": [1, 2], "max_tokens": 1}),
        )
        .await;
    assert_eq!(status, 200, "{resp}");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_paths_only_inside_the_output_root() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = daemon_config(dir.path());
    cfg.output.allow_custom_paths = true;
    cfg.output.lock_files = true;
    let d = TestDaemon::start(&cfg).await;
    let outside = dir.path().join("elsewhere");
    std::fs::create_dir(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, d.out.join("escape")).unwrap();

    let ask = |path: String| {
        json!({"prompt": [1, 2, 3], "max_tokens": 1,
                                     "kv_transfer_params": {"hidden_states_path": path}})
    };
    let (status, resp) = d
        .post("/v1/completions", &ask("runs/a/x.safetensors".into()))
        .await;
    assert_eq!(status, 200, "{resp}");
    let path = file_of(&resp["kv_transfer_params"]["hidden_states_path"]);
    assert_eq!(path, d.out.join("runs/a/x.safetensors"));
    assert_eq!(common::HsFile::read(&path).shape[0], 3);
    // lock_files: vLLM's lock file exists and is free (the write is over).
    let lock = std::fs::File::open(path.with_extension("safetensors.lock")).unwrap();
    lock.try_lock().expect("lock released");

    let inside_abs = d.out.join("abs.safetensors");
    let (status, _) = d
        .post("/v1/completions", &ask(inside_abs.display().to_string()))
        .await;
    assert_eq!(status, 200);
    assert!(inside_abs.exists());

    let refused = [
        "../x.safetensors".to_owned(),
        "runs/../../x.safetensors".to_owned(),
        outside.join("x.safetensors").display().to_string(),
        "/tmp/x.safetensors".to_owned(),
        "escape/x.safetensors".to_owned(),
    ];
    for p in refused {
        let (status, resp) = d.post("/v1/completions", &ask(p.clone())).await;
        assert_eq!(status, 400, "{p}: {resp}");
        assert!(
            resp["error"]["message"]
                .as_str()
                .unwrap()
                .contains("refused"),
            "{resp}"
        );
    }
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_that_goes_away_gets_its_request_aborted() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(&daemon_config(dir.path())).await;
    let mut events = daemon_support::subscriber(&d, None).await;
    let body = json!({"prompt": [1], "max_tokens": 1800}).to_string();
    let mut s = tokio::net::TcpStream::connect(d.http).await.unwrap();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    drop(s);
    let e = daemon_support::recv_within(&mut events, 30).await.unwrap();
    assert_eq!(e["event"], "failed", "{e}");
    assert_eq!(e["error"], "aborted");
    d.stop().await;
}
