//! Conversations through the daemon: `/v1/chat/completions`, `/v1/chat/completions/render`
//! (what speculators' `prepare_data.py` calls) and socket `submit` with `messages`, all rendered
//! exactly as transformers' `apply_chat_template` (fixtures: make_chat_fixtures.py).

use crate::common;
use crate::daemon_support;

use std::path::PathBuf;

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
