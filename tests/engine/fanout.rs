//! Prefix fan-out computed once: rows that are prefixes of another row of the same run get
//! files sliced from the longer row's states, identical to computing them separately, and only
//! the longest rows go through the model.

use crate::common;

use common::*;
use hsx::engine::Engine;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_dataset_matches_separate_runs_and_computes_longest_rows_only() {
    // Two conversations, one row per assistant turn (each a prefix of the next), plus an
    // unrelated row and a duplicate of a turn.
    let conv_a = random_prompt(11, 300, 512);
    let conv_b = random_prompt(12, 120, 512);
    let other = random_prompt(13, 50, 512);
    let rows: Vec<(String, Vec<u32>)> = vec![
        ("a1".into(), conv_a[..40].to_vec()),
        ("b2".into(), conv_b.clone()),
        ("a3".into(), conv_a.clone()),
        ("x".into(), other.clone()),
        ("a2".into(), conv_a[..170].to_vec()),
        ("b1".into(), conv_b[..33].to_vec()),
        ("a2-again".into(), conv_a[..170].to_vec()),
    ];
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    let lines: Vec<String> = rows
        .iter()
        .map(|(id, t)| serde_json::json!({"id": id, "token_ids": t}).to_string())
        .collect();
    std::fs::write(&input, lines.join("\n")).unwrap();

    let out = dir.path().join("out");
    let cfg = config("llama", &out, 64, Some(vec![0, 2, 4]));
    let engine = Engine::start(&cfg).await.unwrap();
    let summary = hsx::extract::run(&engine, &input, false).await.unwrap();
    engine.shutdown().await;
    assert!(summary.ok(), "{}", summary.report());
    assert_eq!(summary.completed, rows.len());
    let written: usize = rows.iter().map(|(_, t)| t.len()).sum();
    assert_eq!(summary.tokens, written as u64);
    let longest = conv_a.len() + conv_b.len() + other.len();
    assert_eq!(
        summary.tokens_computed, longest as u64,
        "only the longest rows are computed"
    );

    // The same rows computed one by one, each alone.
    let reqs: Vec<_> = rows.iter().map(|(id, t)| spec(id, t)).collect();
    let solo_out = dir.path().join("solo");
    let mut solo_cfg = config("llama", &solo_out, 4096, Some(vec![0, 2, 4]));
    solo_cfg.engine.max_num_seqs = 1;
    run_requests(&solo_cfg, reqs).await;
    for (id, t) in &rows {
        let name = format!("{id}.safetensors");
        let a = HsFile::read(&out.join(&name));
        let b = HsFile::read(&solo_out.join(&name));
        assert_eq!(a.shape, vec![t.len(), 3, 64], "{id}");
        assert_eq!(a.token_ids, b.token_ids, "{id}");
        assert!(
            a.raw == b.raw,
            "{id}: sliced file differs from computing it separately"
        );
    }

    // Resume: nothing left to do.
    let engine = Engine::start(&cfg).await.unwrap();
    let again = hsx::extract::run(&engine, &input, false).await.unwrap();
    engine.shutdown().await;
    assert_eq!((again.skipped, again.tokens_computed), (rows.len(), 0));

    // A missing sliced file alone is recomputed through its root.
    std::fs::remove_file(out.join("a2.safetensors")).unwrap();
    let engine = Engine::start(&cfg).await.unwrap();
    let third = hsx::extract::run(&engine, &input, false).await.unwrap();
    engine.shutdown().await;
    assert!(third.ok(), "{}", third.report());
    assert_eq!(third.tokens_computed, conv_a.len() as u64);
    let a2 = HsFile::read(&out.join("a2.safetensors"));
    assert!(a2.raw == HsFile::read(&solo_out.join("a2.safetensors")).raw);
}
