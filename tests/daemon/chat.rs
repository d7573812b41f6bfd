//! Conversations through the daemon: `/v1/chat/completions`, `/v1/chat/completions/render`
//! (what speculators' `prepare_data.py` calls) and socket `submit` with `messages`, all rendered
//! exactly as transformers' `apply_chat_template` (fixtures: make_chat_fixtures.py).

use crate::common;
use crate::daemon_support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use daemon_support::{TestDaemon, daemon_config, subscriber};
use serde_json::{Value, json};

/// The transformers rendering of the Llama-3 template for a conversation.
fn expected(conversation: &str, add_generation_prompt: bool) -> (Value, Vec<i64>) {
    let text = std::fs::read_to_string(common::fixture_dir().join("chat/cases.json")).unwrap();
    let fx: Value = serde_json::from_str(&text).unwrap();
    let case = fx["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| {
            c["template"] == "llama3"
                && c["conversation"] == conversation
                && c["add_generation_prompt"] == add_generation_prompt
        })
        .unwrap()
        .clone();
    let ids = case["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    (fx["conversations"][conversation].clone(), ids)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_render_and_completions_match_transformers() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(&daemon_config(dir.path())).await;
    let (messages, want) = expected("system_multi", true);

    let (status, resp) = d
        .post(
            "/v1/chat/completions/render",
            &json!({"messages": messages, "add_generation_prompt": true}),
        )
        .await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["token_ids"], json!(want));

    let body =
        json!({"model": "llama", "messages": messages, "max_tokens": 1, "return_token_ids": true});
    let (status, resp) = d.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["object"], "chat.completion");
    assert_eq!(resp["prompt_token_ids"], json!(want));
    assert_eq!(resp["choices"][0]["token_ids"].as_array().unwrap().len(), 1);
    let path = PathBuf::from(
        resp["kv_transfer_params"]["hidden_states_path"]
            .as_str()
            .unwrap(),
    );
    let f = common::HsFile::read(&path);
    assert_eq!(
        f.token_ids, want,
        "the file holds the rendered conversation"
    );

    // Errors: a template that raises, and malformed messages, are 400s.
    let bad = json!({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": true, "continue_final_message": true});
    assert_eq!(d.post("/v1/chat/completions/render", &bad).await.0, 400);
    assert_eq!(
        d.post("/v1/chat/completions", &json!({"messages": "hi"}))
            .await
            .0,
        400
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_submit_accepts_messages() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(&daemon_config(dir.path())).await;
    let (messages, want) = expected("single", false);
    let mut sub = subscriber(&d, None).await;
    let mut c = d.connect().await;
    let reply = c
        .request(&json!({"op": "submit", "id": "conv", "messages": messages}))
        .await
        .unwrap();
    assert_eq!(reply["event"], "accepted", "{reply}");
    let ev = daemon_support::recv_within(&mut sub, 30).await.unwrap();
    let tokens: Vec<u32> = want.iter().map(|&t| t as u32).collect();
    daemon_support::check_file(&ev, &tokens);
    let reply = c
        .request(&json!({"op": "submit", "messages": messages, "token_ids": [1]}))
        .await
        .unwrap();
    assert_eq!(reply["event"], "rejected", "{reply}");
    d.stop().await;
}

/// The llama fixture (linked) in `dir` with a chat template that runs away when the first
/// message says so: "loop" (10^10 iterations), "recurse" (2^60 macro calls), "huge" (10 GB of
/// output); any other conversation renders normally.
fn runaway_model(dir: &Path) -> PathBuf {
    const RUNAWAY: &str = "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}\
        {% endmacro %}{% set c = messages[0].content %}\
        {% if c == 'loop' %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}\
        {% endfor %}{% elif c == 'recurse' %}{{ f(60) }}\
        {% elif c == 'huge' %}{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}\
        {% else %}{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}\
        <|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endfor %}{% endif %}";
    let model = dir.join("runaway");
    std::fs::create_dir_all(&model).unwrap();
    for entry in std::fs::read_dir(common::model_dir("llama")).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != "tokenizer_config.json" {
            std::os::unix::fs::symlink(entry.path(), model.join(entry.file_name())).unwrap();
        }
    }
    let cfg = json!({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                     "chat_template": RUNAWAY});
    std::fs::write(model.join("tokenizer_config.json"), cfg.to_string()).unwrap();
    model
}

/// A runaway chat template (issue 17) is stopped under the default `[chat]` limits: that
/// request gets a 400 (HTTP) or a `rejected` reply (socket) naming the limit, and the daemon
/// goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runaway_chat_templates_are_stopped_and_the_daemon_serves_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = daemon_config(dir.path());
    cfg.model.path = runaway_model(dir.path());
    let d = TestDaemon::start(&cfg).await;
    let user = |c: &str| json!([{"role": "user", "content": c}]);
    let cases = [
        ("/v1/chat/completions/render", "loop", "max_render_fuel"),
        ("/v1/chat/completions", "recurse", "max_render_fuel"),
        ("/v1/chat/completions", "huge", "max_render_bytes"),
    ];
    for (path, content, limit) in cases {
        let start = Instant::now();
        let (status, resp) = d
            .post(path, &json!({"messages": user(content), "max_tokens": 1}))
            .await;
        let took = start.elapsed();
        eprintln!("{path} {content}: {status} in {took:?}: {resp}");
        assert_eq!(status, 400, "{content}: {resp}");
        let msg = resp["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("chat template stopped") && msg.contains(limit),
            "{msg}"
        );
        assert!(took < Duration::from_secs(30), "{content}: {took:?}");
    }
    let mut c = d.connect().await;
    let reply = c
        .request(&json!({"op": "submit", "id": "r", "messages": user("loop")}))
        .await
        .unwrap();
    assert_eq!(reply["event"], "rejected", "{reply}");
    assert_eq!(reply["reason"], "chat_template", "{reply}");

    assert_eq!(d.get("/health").await.0, 200);
    let (status, resp) = d
        .post(
            "/v1/chat/completions",
            &json!({"messages": user("hello"), "max_tokens": 1}),
        )
        .await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["choices"][0]["finish_reason"], "length", "{resp}");
    d.stop().await;
}
