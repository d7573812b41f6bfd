//! The `hsx extract` command as a user runs it: the shipped config, resume, bad input.

use crate::common;

use std::path::Path;
use std::process::{Command, Output};

use common::*;

fn hsx(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hsx"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("hsx runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn shipped_config_runs_and_resumes() {
    let out = tempfile::tempdir().unwrap();
    let o = out.path().to_str().unwrap();
    let args = [
        "extract",
        "--config",
        "config.toml",
        "--input",
        "tests/fixtures/prompts.jsonl",
        "--output",
        o,
        "--quiet",
    ];
    let first = hsx(&args);
    assert!(first.status.success(), "{}", stderr(&first));
    let names = files_in(out.path());
    assert_eq!(names.len(), 12, "{names:?}");
    assert!(names.iter().all(|n| n.ends_with(".safetensors")));
    let f = HsFile::read(&out.path().join("demo-01.safetensors"));
    assert_eq!(f.shape, vec![5, 3, 64]);
    let second = hsx(&args);
    assert!(second.status.success(), "{}", stderr(&second));
    assert!(
        stderr(&second).contains("skipped (already present) 12"),
        "{}",
        stderr(&second)
    );
}

#[test]
fn bad_lines_are_reported_and_the_rest_is_processed() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    let long: Vec<String> = (0..2100).map(|i| (i % 500).to_string()).collect();
    let lines = [
        r#"{"id": "ok1", "token_ids": [1, 2, 3]}"#.to_string(),
        "{not json".to_string(),
        r#"{"id": "empty", "token_ids": []}"#.to_string(),
        r#"{"id": "vocab", "token_ids": [1, 512]}"#.to_string(),
        format!(r#"{{"id": "long", "token_ids": [{}]}}"#, long.join(",")),
        r#"{"id": "../evil", "token_ids": [1]}"#.to_string(),
        r#"{"id": "neg", "token_ids": [-1]}"#.to_string(),
        r#"{"id": "ok2", "token_ids": [4, 5]}"#.to_string(),
    ];
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let out = dir.path().join("out");
    let o = hsx(&[
        "extract",
        "--config",
        "config.toml",
        "--quiet",
        "--input",
        input.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
    ]);
    let err = stderr(&o);
    assert!(!o.status.success(), "bad lines make the exit code non-zero");
    assert!(
        err.contains("line 2:") && err.contains("invalid JSON"),
        "{err}"
    );
    assert!(
        err.contains("line 3") && err.contains("empty prompt"),
        "{err}"
    );
    assert!(
        err.contains("line 4") && err.contains("out of range"),
        "{err}"
    );
    assert!(
        err.contains("line 5") && err.contains("max_model_len"),
        "{err}"
    );
    assert!(
        err.contains("line 6:") && err.contains("invalid request id"),
        "{err}"
    );
    assert!(err.contains("line 7:") && err.contains("-1"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(files_in(&out), vec!["ok1.safetensors", "ok2.safetensors"]);
    assert!(!dir.path().join("evil.safetensors").exists());
}

#[test]
fn missing_model_dir_is_a_clear_error() {
    let out = tempfile::tempdir().unwrap();
    let o = hsx(&[
        "extract",
        "--config",
        "config.toml",
        "--quiet",
        "--input",
        "tests/fixtures/prompts.jsonl",
        "--model",
        "/nonexistent/model",
        "--output",
        out.path().to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("/nonexistent/model"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(files_in(out.path()).is_empty());
}

#[test]
fn unknown_config_key_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        "[model]\npath = \"m\"\n[engine]\nmax_num_batched_tokenz = 8\n",
    )
    .unwrap();
    let o = hsx(&[
        "extract",
        "--config",
        cfg.to_str().unwrap(),
        "--input",
        "x.jsonl",
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("max_num_batched_tokenz"),
        "{}",
        stderr(&o)
    );
}

/// `hsx extract` of the bundled prompts with the shipped config edited by `edit` (from a temp
/// dir: the model path made absolute): its output and the files it wrote.
fn extract_with_config(edit: impl Fn(&str) -> String) -> (Output, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    let shipped = std::fs::read_to_string("config.toml").unwrap();
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/llama");
    let edited = edit(&shipped);
    assert_ne!(edited, shipped, "the edit changes the shipped config");
    let edited = edited.replace("\"tests/fixtures/models/llama\"", &format!("{model:?}"));
    std::fs::write(&cfg, edited).unwrap();
    let out = dir.path().join("out");
    let o = hsx(&[
        "extract",
        "--config",
        cfg.to_str().unwrap(),
        "--quiet",
        "--input",
        "tests/fixtures/prompts.jsonl",
        "--output",
        out.to_str().unwrap(),
    ]);
    (o, files_in(&out))
}

#[test]
fn max_model_len_past_the_models_positions_is_refused_at_start() {
    // The bundled model has max_position_embeddings 2048.
    let (o, files) =
        extract_with_config(|c| c.replace("max_model_len = 0", "max_model_len = 2049"));
    assert_refused(&o, &files, &["max_model_len 2049", "2048"]);
}

/// `hsx` refused to start: it failed, its error names each of `needles`, and it wrote nothing.
fn assert_refused(o: &Output, files: &[String], needles: &[&str]) {
    assert!(!o.status.success());
    let err = stderr(o);
    assert!(needles.iter().all(|n| err.contains(n)), "{err}");
    assert!(files.is_empty(), "{files:?}");
}

/// A LongRoPE model (Phi-3's 128k scaling) runs requests up to its
/// `original_max_position_embeddings` (256 in the fixture; its `max_position_embeddings` is
/// 1024).
#[test]
fn a_longrope_model_runs_up_to_its_original_context() {
    runs_up_to_256(
        "phi3_longrope",
        &["original_max_position_embeddings 256", "LongRoPE"],
    );
}

/// A DeepSeek Sparse Attention model (DeepSeek-V3.2 / GLM-5) runs the README's extract past its
/// `index_topk` (24 in the fixture): every demo prompt (5 to 300 tokens) completes, its queries
/// from position 24 on attending over the keys the indexer picks.
#[test]
fn a_sparse_attention_model_runs_past_its_index_topk() {
    let model =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/deepseek_v32_sparse");
    let (o, files) = extract_with_config(|c| {
        c.replace("\"tests/fixtures/models/llama\"", &format!("{model:?}"))
    });
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(files.len(), 12, "{files:?}");
}

/// Qwen4-Exp with QSA past 19 keys (n-gram embeddings, hyper-connections) runs the README's
/// extract: every demo prompt (up to 300 tokens) past its dense length, also with a
/// `max_model_len` of 1024 (the indexer no longer caps requests).
#[test]
fn a_qwen4_exp_model_runs_past_its_indexers_dense_length() {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/qwen4_exp_qsa");
    let to_model = |c: &str| c.replace("\"tests/fixtures/models/llama\"", &format!("{model:?}"));
    let (o, files) =
        extract_with_config(|c| to_model(c).replace("max_model_len = 0", "max_model_len = 1024"));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(files.len(), 12, "{files:?}");
}

/// The README's extract on `fixture`, whose requests stop at 256 tokens below its
/// `max_position_embeddings`: the demo prompt of 300 tokens (demo-03) fails alone, naming the
/// limit, the other 11 (up to 256) complete; a `max_model_len` of 300 is refused at start, the
/// error naming each of `why`.
fn runs_up_to_256(fixture: &str, why: &[&str]) {
    let model = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/models")
        .join(fixture);
    let to_model = |c: &str| c.replace("\"tests/fixtures/models/llama\"", &format!("{model:?}"));
    let (o, files) = extract_with_config(to_model);
    assert!(!o.status.success(), "a request failed: exit code 1");
    let err = stderr(&o);
    let failed = "line 4 (id demo-03): request of 300 tokens (prompt + max_tokens) exceeds \
                  max_model_len 256";
    assert!(
        err.contains("completed 11") && err.contains(failed),
        "{err}"
    );
    assert_eq!(files.len(), 11, "{files:?}");
    assert!(!files.iter().any(|f| f.contains("demo-03")), "{files:?}");
    let (o, files) =
        extract_with_config(|c| to_model(c).replace("max_model_len = 0", "max_model_len = 300"));
    let needles: Vec<&str> = ["max_model_len 300"].iter().chain(why).copied().collect();
    assert_refused(&o, &files, &needles);
}

/// Naming the `amx` path: refused at start, naming it and the paths this CPU has, where the
/// CPU has no AMX (and the build no `amx-emu`); a normal run where it can.
#[test]
fn a_bf16_path_the_cpu_lacks_is_refused_at_start() {
    let (o, files) = extract_with_config(|c| {
        c.replace("cpu_bf16_kernel = \"auto\"", "cpu_bf16_kernel = \"amx\"")
    });
    if hsx::kernels::Bf16Kernel::Amx.available() {
        println!("amx runs here (AMX, or the amx-emu build): the run must succeed");
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(files.len(), 12);
        return;
    }
    assert_refused(
        &o,
        &files,
        &["cpu_bf16_kernel = \"amx\"", "does not have it"],
    );
}

#[test]
fn bad_layer_flag_is_a_clear_error() {
    let out = tempfile::tempdir().unwrap();
    let o = hsx(&[
        "extract",
        "--config",
        "config.toml",
        "--quiet",
        "--input",
        "tests/fixtures/prompts.jsonl",
        "--layers",
        "0,9",
        "--output",
        out.path().to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("out of range"), "{}", stderr(&o));
    let o = hsx(&[
        "extract",
        "--config",
        "config.toml",
        "--input",
        "x",
        "--layers",
        "1,1",
    ]);
    assert!(stderr(&o).contains("twice"), "{}", stderr(&o));
}

#[test]
fn inspect_reports_good_and_bad_files() {
    let out = tempfile::tempdir().unwrap();
    let o = out.path().to_str().unwrap();
    let run = hsx(&[
        "extract",
        "--config",
        "config.toml",
        "--input",
        "tests/fixtures/prompts.jsonl",
        "--output",
        o,
        "--quiet",
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
    let good = hsx(&["inspect", o]);
    let text = String::from_utf8_lossy(&good.stdout).into_owned();
    assert!(good.status.success(), "{text}");
    assert!(text.contains("files 12  tokens 1296"), "{text}");
    assert!(text.contains("hidden_states: F32 [5, 3, 64]"), "{text}");
    // Zero one layer row of a copy, truncate another: both are bad, named, exit code 1.
    let f = out.path().join("demo-01.safetensors");
    let mut bytes = std::fs::read(&f).unwrap();
    let n = bytes.len();
    bytes[n - 64 * 4..].fill(0);
    std::fs::write(out.path().join("zero.safetensors"), &bytes).unwrap();
    std::fs::write(out.path().join("short.safetensors"), &bytes[..n / 2]).unwrap();
    let bad = hsx(&["inspect", "--summary", o]);
    let text = String::from_utf8_lossy(&bad.stdout).into_owned();
    assert!(!bad.status.success());
    assert!(text.contains("bad 2"), "{text}");
    assert!(
        text.contains("zero.safetensors: layer slot 2: 1 all-zero rows"),
        "{text}"
    );
    assert!(
        text.contains("short.safetensors: not a valid safetensors file"),
        "{text}"
    );
}
