//! Chunked prefill and continuous batching never change a file: the seed's save race as a
//! test (64 requests, budget 37, a watcher on the output directory), budgets {7, 64, 4096},
//! and vLLM's own acceptance cases.

use crate::common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::*;
use hsx::engine::RequestSpec;

const LAYERS: [usize; 3] = [0, 2, 4];

/// Runs `reqs` with the given budget and returns each request's file.
async fn files(
    model: &str,
    budget: usize,
    seqs: usize,
    reqs: &[RequestSpec],
) -> HashMap<String, HsFile> {
    run_files(model, &LAYERS, budget, seqs, reqs).await
}

/// Each request alone: one at a time, one chunk.
async fn solo_files(model: &str, reqs: &[RequestSpec]) -> HashMap<String, HsFile> {
    files(model, 4096, 1, reqs).await
}

fn prompts(n: usize, max_len: usize, seed: u64) -> Vec<RequestSpec> {
    (0..n)
        .map(|i| {
            let len = 1 + (random_prompt(seed + i as u64, 1, 1 << 30)[0] as usize % max_len);
            spec(
                &format!("r{i:03}"),
                &random_prompt(seed * 1000 + i as u64, len, 512),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_7_64_4096_give_identical_files() {
    let reqs = prompts(12, 200, 7);
    let base = files("llama", 4096, 64, &reqs).await;
    for budget in [7, 64] {
        let got = files("llama", budget, 64, &reqs).await;
        for r in &reqs {
            let (a, b) = (&got[&r.id], &base[&r.id]);
            assert_eq!(a.shape, b.shape);
            assert!(a.raw == b.raw, "budget {budget}, {}: files differ", r.id);
        }
    }
}

/// Every final-name file seen while the engine runs must be complete.
fn watch(dir: &Path, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<(usize, Vec<String>)> {
    let dir = dir.to_owned();
    std::thread::spawn(move || {
        let mut checks = 0;
        let mut bad = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            for entry in std::fs::read_dir(&dir).unwrap().flatten() {
                let p = entry.path();
                if p.extension().is_some_and(|e| e == "safetensors") {
                    checks += 1;
                    let ok = std::panic::catch_unwind(|| HsFile::read(&p)).is_ok_and(|f| {
                        f.shape[0] == f.token_ids.len()
                            && f.raw.len() == f.shape.iter().product::<usize>() * 4
                    });
                    if !ok {
                        bad.push(p.display().to_string());
                    }
                }
            }
        }
        (checks, bad)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_race_64_requests_budget_37() {
    let reqs = prompts(64, 600, 42);
    let out = tempfile::tempdir().unwrap();
    let mut cfg = config("llama", out.path(), 37, Some(LAYERS.to_vec()));
    cfg.engine.max_num_seqs = 64;
    cfg.engine.num_blocks = 64 * 38;
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch(out.path(), stop.clone());
    let events = run_requests(&cfg, reqs.clone()).await;
    stop.store(true, Ordering::Relaxed);
    let (checks, bad) = watcher.join().unwrap();
    assert!(
        bad.is_empty(),
        "incomplete files under final names: {bad:?}"
    );
    assert!(checks > 0, "the watcher saw files");
    let solo = solo_files("llama", &reqs).await;
    for r in &reqs {
        let f = HsFile::read(&completed_path(&events[&r.id]));
        assert_eq!(f.shape, vec![r.token_ids.len(), 3, 64], "{}", r.id);
        let ids: Vec<u32> = f.token_ids.iter().map(|&t| t as u32).collect();
        assert_eq!(ids, r.token_ids, "{}", r.id);
        assert!(
            f.raw == solo[&r.id].raw,
            "{} differs from its solo run",
            r.id
        );
    }
    let leftovers: Vec<_> = std::fs::read_dir(out.path())
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_none_or(|x| x != "safetensors"))
        .collect();
    assert!(leftovers.is_empty(), "no temp files left: {leftovers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_repeated_prompt() {
    let p = random_prompt(5, 40, 512);
    let reqs = vec![spec("a", &p), spec("b", &p), spec("c", &p)];
    let got = files("llama", 32, 8, &reqs).await;
    assert!(got["a"].raw == got["b"].raw && got["b"].raw == got["c"].raw);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_long_prompt_under_small_budget_next_to_short_one() {
    let reqs = vec![
        spec("long", &random_prompt(1, 500, 512)),
        spec("short", &random_prompt(2, 9, 512)),
    ];
    let got = files("llama", 128, 8, &reqs).await;
    let solo = solo_files("llama", &reqs).await;
    for r in &reqs {
        assert_eq!(got[&r.id].shape[0], r.token_ids.len());
        assert!(got[&r.id].raw == solo[&r.id].raw, "{}", r.id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_unsorted_layer_ids_come_out_ascending() {
    let reference = Reference::load("llama");
    let out = tempfile::tempdir().unwrap();
    let cfg = config("llama", out.path(), 64, Some(vec![4, 0, 2]));
    let events = run_requests(&cfg, vec![spec("u", &reference.input_ids(2))]).await;
    let f = HsFile::read(&completed_path(&events["u"]));
    assert_eq!(f.metadata["layer_ids"], "[0,2,4]");
    for (k, id) in [0, 2, 4].iter().enumerate() {
        let err = max_rel(&f.layer(k), &reference.f32(&format!("p2.layer.{id}")));
        assert!(err <= 1e-4, "slot {k} must be layer {id}: {err:e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn include_output_tokens_captures_generated_rows() {
    let reference = Reference::load("llama");
    let prompt = reference.input_ids(1);
    let mut s = spec("g", &prompt);
    s.max_tokens = 3;
    s.include_output_tokens = true;
    let out = tempfile::tempdir().unwrap();
    let cfg = config("llama", out.path(), 4, Some(LAYERS.to_vec()));
    let events = run_requests(&cfg, vec![s]).await;
    let f = HsFile::read(&completed_path(&events["g"]));
    assert_eq!(f.shape[0], prompt.len() + 2);
    assert_eq!(f.token_ids[prompt.len()] as u32, reference.next_token(1));
    // The prompt rows are the prompt-only rows.
    let err = max_rel(
        &f.layer(2)[..prompt.len() * 64],
        &reference.f32("p1.layer.4"),
    );
    assert!(err <= 1e-4, "{err:e}");
    // A prompt extended by its generated tokens gives the same rows (prefix property).
    let full: Vec<u32> = f.token_ids.iter().map(|&t| t as u32).collect();
    let again = files("llama", 4096, 1, &[spec("x", &full)]).await;
    assert!(again["x"].raw == f.raw);
}
