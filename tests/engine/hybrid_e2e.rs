//! Hybrid models through the whole engine (scheduler, block pool with state slots, runner,
//! connector): files against transformers, vLLM's hybrid smoke case, chunked prefill and
//! continuous batching byte-identical to solo runs, abort + state-slot reuse.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use hsx::actors::messages::{EventKind, RequestId};
use hsx::engine::{Engine, RequestSpec};

/// (fixture, capture ids: 0, a recurrent layer, an attention layer, L)
const MODELS: [(&str, [usize; 4]); 4] = [
    ("qwen3_5", [0, 1, 3, 4]),
    ("qwen3_next", [0, 2, 3, 4]),
    ("nemotron_h", [0, 1, 3, 6]),
    // Every layer both: Mamba-2 beside attention.
    ("falcon_h1", [0, 1, 2, 4]),
];

/// Every captured layer of every reference prompt within 1e-4 of transformers (ids cover
/// embeddings, a Gated DeltaNet / Mamba-2 layer, an attention layer and L), id L != HF's last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_match_transformers() {
    for (name, layers) in MODELS {
        let reference = Reference::load(name);
        let reqs: Vec<_> = (0..reference.num_prompts())
            .map(|j| spec(&format!("p{j}"), &reference.input_ids(j)))
            .collect();
        let got = run_files(name, &layers, 61, 8, &reqs).await;
        for j in 0..reference.num_prompts() {
            let f = &got[&format!("p{j}")];
            assert_eq!(f.shape, vec![reference.input_ids(j).len(), 4, 64]);
            for (k, id) in layers.iter().enumerate() {
                let err = max_rel(&f.layer(k), &reference.f32(&format!("p{j}.layer.{id}")));
                assert!(err <= 1e-4, "{name} p{j} id {id}: {err:e}");
            }
            let hf_last = reference.f32(&format!("p{j}.hf_last"));
            assert!(
                max_rel(&f.layer(3), &hf_last) > 1e-2,
                "{name}: id L is pre-norm"
            );
        }
    }
}

/// vLLM's hybrid smoke test with values: three layer ids, shape [N, 3, H], every row non-zero
/// and finite, and equal to the reference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_hybrid_smoke_three_layers() {
    for (name, layers) in MODELS {
        let three = [layers[1], layers[2], layers[3]];
        let reference = Reference::load(name);
        let ids = reference.input_ids(3);
        let got = run_files(name, &three, 4096, 4, &[spec("smoke", &ids)]).await;
        let f = &got["smoke"];
        assert_eq!(f.shape, vec![ids.len(), 3, 64]);
        let v = f.values();
        assert!(v.iter().all(|x| x.is_finite()), "{name}: non-finite values");
        for row in v.chunks_exact(64) {
            assert!(row.iter().any(|&x| x != 0.0), "{name}: an all-zero row");
        }
        for (k, id) in three.iter().enumerate() {
            let err = max_rel(&f.layer(k), &reference.f32(&format!("p3.layer.{id}")));
            assert!(err <= 1e-4, "{name} id {id}: {err:e}");
        }
    }
}

fn random_reqs(n: usize, max_len: usize, seed: u64) -> Vec<RequestSpec> {
    (0..n)
        .map(|i| {
            let len = 1 + random_prompt(seed + i as u64, 1, 1 << 30)[0] as usize % max_len;
            spec(
                &format!("r{i:02}"),
                &random_prompt(seed * 1000 + i as u64, len, 512),
            )
        })
        .collect()
}

/// Budgets 7, 61 and 4096 with 32 concurrent requests of random lengths: every file is
/// byte-identical to the request's solo run (one request at a time, one chunk).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_prefill_and_batching_are_byte_identical() {
    for (name, layers) in MODELS {
        let reqs = random_reqs(32, 160, 11);
        let solo = run_files(name, &layers, 4096, 1, &reqs).await;
        for budget in [7, 61, 4096] {
            let got = run_files(name, &layers, budget, 32, &reqs).await;
            for r in &reqs {
                let (a, b) = (&got[&r.id], &solo[&r.id]);
                assert_eq!(a.shape, b.shape, "{name} budget {budget} {}", r.id);
                assert!(a.raw == b.raw, "{name} budget {budget}: {} differs", r.id);
            }
        }
    }
}

/// With one state slot (max_num_seqs = 1), a request aborted mid-prefill hands its slot to
/// the next request, whose file equals its solo run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_mid_prefill_then_slot_reuse() {
    for (name, layers) in MODELS {
        let b = random_prompt(77, 150, 512);
        let solo = run_files(name, &layers, 4096, 1, &[spec("b", &b)]).await;
        let out = tempfile::tempdir().unwrap();
        let mut cfg = config(name, out.path(), 7, Some(layers.to_vec()));
        cfg.engine.max_num_seqs = 1;
        let engine = Engine::start(&cfg).await.unwrap();
        let mut sub = engine.subscribe(None).await;
        // A long prompt: 1500 tokens at 7 per step keep it in prefill for a while.
        let a = random_prompt(78, 1500, 512);
        engine
            .submit(engine.request(spec("a", &a)).unwrap())
            .await
            .unwrap();
        engine
            .submit(engine.request(spec("b", &b)).unwrap())
            .await
            .unwrap();
        // Abort once a's prefill is under way (some, not all, of its tokens computed).
        loop {
            let st = engine.status().await.unwrap();
            if st.prompt_tokens_computed >= 70 {
                assert!(
                    st.prompt_tokens_computed < a.len() as u64,
                    "{name}: too late"
                );
                break;
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        engine.abort(RequestId::new("a").unwrap()).await;
        let mut got = HashMap::new();
        while got.len() < 2 {
            let ev = tokio::time::timeout(Duration::from_secs(60), sub.next())
                .await
                .expect("events arrive")
                .expect("stream open");
            got.insert(ev.id.to_string(), ev);
        }
        engine.shutdown().await;
        assert!(
            matches!(got["a"].kind, EventKind::Failed { .. }),
            "{name}: a was aborted mid-prefill: {:?}",
            got["a"].kind
        );
        let f = HsFile::read(&completed_path(&got["b"]));
        assert!(
            f.raw == solo["b"].raw,
            "{name}: b differs from its solo run"
        );
        assert!(!out.path().join("a.safetensors").exists());
    }
}

/// A bf16-weight hybrid through the engine, bf16 output: within bf16 rounding of the reference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bf16_hybrid_within_tolerance() {
    let reference = Reference::load("qwen3_5_bf16");
    let out = tempfile::tempdir().unwrap();
    let mut cfg = config("qwen3_5_bf16", out.path(), 61, Some(vec![0, 1, 3, 4]));
    cfg.engine.dtype = hsx::config::DtypeChoice::Auto;
    let events = run_requests(&cfg, vec![spec("x", &reference.input_ids(3))]).await;
    let f = HsFile::read(&completed_path(&events["x"]));
    assert_eq!(f.dtype, safetensors::Dtype::BF16);
    for (k, id) in [0, 1, 3, 4].iter().enumerate() {
        let err = max_rel(&f.layer(k), &reference.f32(&format!("p3.layer.{id}")));
        assert!(err <= 8e-3, "id {id}: {err:e}");
    }
}
