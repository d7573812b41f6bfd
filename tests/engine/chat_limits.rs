//! Chat templates are bounded (`[chat]`): the template comes with the model and runs at every
//! request, so one that loops without end, recurses without end or builds a huge text is
//! stopped quickly with an error for that request alone (`ChatError::Limit`), through
//! `ChatTemplate`, `Prompter` and `hsx extract` (a bad line).

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use hsx::chat::{ChatError, ChatTemplate, Prompter, RenderLimits, RenderOptions};
use serde_json::{Value, json};

/// Nested loops: 10^10 iterations (minijinja caps one `range` at 100k items).
const LOOP: &str =
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
/// A macro calling itself twice, 60 deep: 2^60 calls (the recursion depth limit never trips).
const RECURSE: &str = "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}\
                       {% endmacro %}{{ f(60) }}";
/// 10 GB of output, 100 kB at a time.
const HUGE_OUTPUT: &str = "{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}";
/// One 100 MB string (minijinja's own cap on `*`), written at once.
const HUGE_VALUE: &str = "{{ 'x' * 100000000 }}";
/// `tojson` (hsx's own filter) asked for a terabyte of indentation.
const HUGE_JSON: &str = "{{ messages | tojson(indent=1000000000000) }}";

/// The template of [`runaway_model`]: runs away when the first message says so.
const RUNAWAY: &str = "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}\
    {% endmacro %}{% set c = messages[0].content %}\
    {% if c == 'loop' %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}\
    {% endfor %}{% elif c == 'recurse' %}{{ f(60) }}\
    {% elif c == 'huge' %}{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}\
    {% else %}{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}\
    <|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endfor %}{% endif %}";

/// The llama fixture (linked) with [`RUNAWAY`] as its chat template, in `dir`.
pub fn runaway_model(dir: &Path) -> PathBuf {
    let model = dir.join("runaway");
    std::fs::create_dir_all(&model).unwrap();
    for entry in std::fs::read_dir(model_dir("llama")).unwrap() {
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

fn user(content: &str) -> Value {
    json!([{"role": "user", "content": content}])
}

/// Renders `source` under `limits`: the error, and how long the render took to stop.
fn stop(source: &str, limits: RenderLimits) -> (ChatError, Duration) {
    let mut t = ChatTemplate::new(source.into(), Default::default()).unwrap();
    t.set_limits(limits);
    let start = Instant::now();
    let e = t.render(&user("hi"), true, None).expect_err(source);
    (e, start.elapsed())
}

#[test]
fn runaway_templates_are_stopped_quickly() {
    let cases = [
        (LOOP, "max_render_fuel"),
        (RECURSE, "max_render_fuel"),
        (HUGE_OUTPUT, "max_render_bytes"),
        (HUGE_VALUE, "max_render_bytes"),
        (HUGE_JSON, "max_render_bytes"),
    ];
    for (source, limit) in cases {
        let (e, took) = stop(source, RenderLimits::default());
        eprintln!("stopped in {took:?}: {source}\n  {e}");
        assert!(matches!(e, ChatError::Limit(_)), "{source}: {e}");
        assert!(e.to_string().contains(limit), "{source}: {e}");
        assert!(took < Duration::from_secs(30), "{source}: {took:?}");
    }
    // Errors of the template itself are not limits.
    let (e, _) = stop(
        "{{ raise_exception('max_render_fuel') }}",
        Default::default(),
    );
    assert!(matches!(e, ChatError::Render(_)), "{e}");
}

#[test]
fn limits_are_configurable_and_real_templates_fit_the_defaults() {
    let fx: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture_dir().join("chat/cases.json")).unwrap(),
    )
    .unwrap();
    let mut t = ChatTemplate::from_dir(&model_dir("llama"))
        .unwrap()
        .unwrap();
    assert_eq!(t.limits(), RenderLimits::default());
    let msgs = &fx["conversations"]["system_multi"];
    let want = t.render(msgs, true, None).unwrap();
    t.set_limits(RenderLimits {
        max_fuel: 10,
        ..Default::default()
    });
    let e = t.render(msgs, true, None).unwrap_err().to_string();
    assert!(
        e.contains("more than 10 steps (chat.max_render_fuel)"),
        "{e}"
    );
    t.set_limits(RenderLimits {
        max_bytes: want.len() - 1,
        ..Default::default()
    });
    let e = t.render(msgs, true, None).unwrap_err().to_string();
    assert!(e.contains("chat.max_render_bytes"), "{e}");
    t.set_limits(RenderLimits {
        max_bytes: want.len(),
        ..Default::default()
    });
    assert_eq!(
        t.render(msgs, true, None).unwrap(),
        want,
        "exactly at the bound"
    );
    // A `tojson` bigger than the bound is stopped inside the filter, output or not.
    let source = "{% set j = tools | tojson(indent=2) %}{{ j | length }}";
    let mut q = ChatTemplate::new(source.into(), Default::default()).unwrap();
    let tools = &fx["tools"];
    let len: usize = q.render(msgs, true, Some(tools)).unwrap().parse().unwrap();
    q.set_limits(RenderLimits {
        max_bytes: len - 1,
        ..Default::default()
    });
    let e = q.render(msgs, true, Some(tools)).unwrap_err().to_string();
    assert!(e.contains("tojson wrote over"), "{e}");
}

#[test]
fn prompter_stops_a_runaway_model_template() {
    let dir = tempfile::tempdir().unwrap();
    let p = Prompter::from_dir(&runaway_model(dir.path()))
        .unwrap()
        .with_limits(RenderLimits {
            max_fuel: 1_000_000,
            ..Default::default()
        });
    let opts = RenderOptions::default();
    for (content, limit) in [
        ("loop", "more than 1000000 steps"),
        ("recurse", "more than 1000000 steps"),
        ("huge", "max_render_bytes"),
    ] {
        let start = Instant::now();
        let e = p.encode_messages(&user(content), &opts).unwrap_err();
        eprintln!("{content}: stopped in {:?}: {e}", start.elapsed());
        assert!(e.to_string().contains(limit), "{content}: {e}");
    }
    let (text, ids) = p.encode_messages(&user("hello"), &opts).unwrap();
    assert!(
        text.starts_with("<|begin_of_text|><|start_header_id|>user"),
        "{text}"
    );
    assert!(!ids.is_empty());
}

/// `hsx extract`: each runaway line is a bad line naming the limit; the others are written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extract_counts_runaway_lines_as_bad() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    let lines: Vec<String> = ["hello", "loop", "recurse", "huge", "bye"]
        .iter()
        .map(|c| json!({"id": c, "messages": user(c)}).to_string())
        .collect();
    std::fs::write(&input, lines.join("\n")).unwrap();
    let mut cfg = config("llama", &dir.path().join("out"), 64, Some(vec![4]));
    cfg.model.path = runaway_model(dir.path());
    cfg.chat.max_render_fuel = 2_000_000;
    let engine = hsx::engine::Engine::start(&cfg).await.unwrap();
    let opts = hsx::extract::ExtractOptions {
        render_limits: cfg.chat.render_limits(),
        ..Default::default()
    };
    let start = Instant::now();
    let summary = hsx::extract::run_with(&engine, &input, &opts)
        .await
        .unwrap();
    eprintln!("extract with 3 runaway lines took {:?}", start.elapsed());
    engine.shutdown().await;
    assert!(!summary.ok());
    let bad: Vec<_> = summary.bad_lines.iter().map(|(l, _)| *l).collect();
    assert_eq!(bad, [2, 3, 4], "{}", summary.report());
    assert!(summary.bad_lines[0].1.contains("more than 2000000 steps"));
    assert!(summary.bad_lines[2].1.contains("max_render_bytes"));
    for id in ["hello", "bye"] {
        assert!(
            dir.path().join(format!("out/{id}.safetensors")).exists(),
            "{id}"
        );
    }
}
