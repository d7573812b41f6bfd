//! Chat templates render exactly as transformers' `apply_chat_template` (text and token ids),
//! for a Llama-3 template, a Qwen3-style template (tools, <think> handling, Python string
//! methods), one that raises on bad role order, and GLM-4.5's and MiniMax-M2's (tools through
//! `tojson(ensure_ascii=False)`, tool calls and responses, structured content, non-ASCII text).
//! Fixtures: tests/fixtures/make_chat_fixtures.py.

use crate::common;

use common::*;
use hsx::chat::ChatTemplate;
use serde_json::Value;

#[test]
fn renders_like_transformers() {
    let text = std::fs::read_to_string(fixture_dir().join("chat/cases.json")).unwrap();
    let fx: Value = serde_json::from_str(&text).unwrap();
    let tokenizer =
        tokenizers::Tokenizer::from_file(model_dir("llama").join("tokenizer.json")).unwrap();
    let mut specials = serde_json::Map::new();
    specials.insert("bos_token".into(), fx["bos_token"].clone());
    specials.insert("eos_token".into(), fx["eos_token"].clone());
    let cases = fx["cases"].as_array().unwrap();
    assert!(cases.len() >= 20);
    for case in cases {
        let name = format!(
            "{} / {} / gen={} / tools={}",
            case["template"],
            case["conversation"],
            case["add_generation_prompt"],
            !case["tools"].is_null()
        );
        let source = fx["templates"][case["template"].as_str().unwrap()]
            .as_str()
            .unwrap();
        let tmpl = ChatTemplate::new(source.to_owned(), specials.clone()).unwrap();
        let messages = &fx["conversations"][case["conversation"].as_str().unwrap()];
        let tools = (!case["tools"].is_null()).then_some(&case["tools"]);
        let got = tmpl.render(
            messages,
            case["add_generation_prompt"].as_bool().unwrap(),
            tools,
        );
        match case.get("error") {
            Some(err) => {
                let e = got.expect_err(&name).to_string();
                let own_words = case["raised_by_template"].as_bool().unwrap();
                assert!(
                    !own_words || e.contains(err.as_str().unwrap()),
                    "{name}: {e}"
                );
            }
            None => {
                let got = got.unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(got, case["text"].as_str().unwrap(), "{name}");
                let ids: Vec<u64> = tokenizer
                    .encode(got.as_str(), false)
                    .unwrap()
                    .get_ids()
                    .iter()
                    .map(|&i| i as u64)
                    .collect();
                let want: Vec<u64> = case["token_ids"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap())
                    .collect();
                assert_eq!(ids, want, "{name}: token ids");
            }
        }
    }
}

#[test]
fn model_dir_template_is_found() {
    let t = ChatTemplate::from_dir(&model_dir("llama"))
        .unwrap()
        .expect("llama has a template");
    let msgs = serde_json::json!([{"role": "user", "content": "hi"}]);
    let s = t.render(&msgs, true, None).unwrap();
    assert!(
        s.starts_with("<|begin_of_text|><|start_header_id|>user"),
        "{s}"
    );
    assert!(
        ChatTemplate::from_dir(&model_dir("qwen3"))
            .unwrap()
            .is_none()
    );
}

/// A directory saved by transformers 5 keeps its template in `chat_template.jinja` only: found,
/// and the conversation renders and encodes as `apply_chat_template` does.
#[test]
fn template_saved_by_transformers_5_is_found_in_its_jinja_file() {
    let dir = fixture_dir().join("chat/saved_by_transformers");
    let want: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let p = hsx::chat::Prompter::from_dir(&dir).unwrap();
    let opts = hsx::chat::RenderOptions {
        add_generation_prompt: true,
        ..Default::default()
    };
    let (text, ids) = p.encode_messages(&want["messages"], &opts).unwrap();
    assert_eq!(text, want["text"].as_str().unwrap());
    let want_ids: Vec<u32> = (want["input_ids"].as_array().unwrap().iter())
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(ids, want_ids);
}

/// `extract` takes `text` and `messages` lines: their files hold the token ids transformers
/// would produce (text with special tokens, conversations through the chat template).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extract_accepts_text_and_messages() {
    let fx: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture_dir().join("chat/cases.json")).unwrap(),
    )
    .unwrap();
    let case = fx["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| {
            c["template"] == "llama3"
                && c["conversation"] == "system_multi"
                && c["add_generation_prompt"] == true
        })
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    let lines = [
        serde_json::json!({"id": "chat", "messages": fx["conversations"]["system_multi"], "add_generation_prompt": true}),
        serde_json::json!({"id": "text", "text": "The quick brown fox"}),
    ];
    std::fs::write(
        &input,
        lines
            .iter()
            .map(|l| l.to_string())
            .collect::<Vec<_>>()
            .join("\n"),
    )
    .unwrap();
    let cfg = config("llama", &dir.path().join("out"), 64, Some(vec![4]));
    let engine = hsx::engine::Engine::start(&cfg).await.unwrap();
    let summary = hsx::extract::run(&engine, &input, false).await.unwrap();
    engine.shutdown().await;
    assert!(summary.ok(), "{}", summary.report());
    let chat = HsFile::read(&dir.path().join("out/chat.safetensors"));
    let want: Vec<i64> = case["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(chat.token_ids, want);
    let tokenizer =
        tokenizers::Tokenizer::from_file(model_dir("llama").join("tokenizer.json")).unwrap();
    let text_ids: Vec<i64> = tokenizer
        .encode("The quick brown fox", true)
        .unwrap()
        .get_ids()
        .iter()
        .map(|&i| i64::from(i))
        .collect();
    assert_eq!(
        HsFile::read(&dir.path().join("out/text.safetensors")).token_ids,
        text_ids
    );
}
