//! `engine.max_pending_bytes`: host memory for hidden states stays under the configured bound
//! however many requests come (admission waits for the connector to release bytes), the files
//! are the same as without the bound, and a request that could never fit is refused.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use common::*;
use hsx::actors::scheduler::SubmitError;
use hsx::engine::{Engine, RequestSpec};

const LAYERS: [usize; 3] = [0, 2, 4];
/// The fixture llama: K = 3 layers × H = 64 × f32.
const ROW_BYTES: usize = 3 * 64 * 4;

fn prompts(n: usize) -> Vec<RequestSpec> {
    (0..n)
        .map(|i| {
            let len = 20 + (random_prompt(90 + i as u64, 1, 1 << 30)[0] as usize % 180);
            spec(
                &format!("m{i:03}"),
                &random_prompt(500 + i as u64, len, 512),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_bound_waits_for_releases_and_writes_identical_files() {
    let reqs = prompts(40);
    let unbounded = run_files("llama", &LAYERS, 64, 64, &reqs).await;

    // Room for two of the longest requests at most.
    let bound = 400 * ROW_BYTES;
    let out = tempfile::tempdir().unwrap();
    let mut cfg = config("llama", out.path(), 64, Some(LAYERS.to_vec()));
    cfg.engine.max_pending_bytes = bound;
    let engine = Arc::new(Engine::start(&cfg).await.unwrap());

    // What the connector really holds (rows being captured + files being written), sampled.
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicUsize::new(0));
    let sampler = {
        let (engine, stop, peak) = (engine.clone(), stop.clone(), peak.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if let Some(c) = engine.connector_stats().await {
                    peak.fetch_max(c.pending_bytes + c.writing_bytes, Ordering::Relaxed);
                }
                tokio::task::yield_now().await;
            }
        })
    };

    let mut sub = engine.subscribe(None).await;
    for r in &reqs {
        engine
            .submit(engine.request(r.clone()).unwrap())
            .await
            .unwrap();
    }
    let mut paths = std::collections::HashMap::new();
    while paths.len() < reqs.len() {
        let ev = sub.next().await.unwrap();
        paths.insert(ev.id.to_string(), completed_path(&ev));
    }
    stop.store(true, Ordering::Relaxed);
    sampler.await.unwrap();
    // The last release may still be on its way once the last event is out.
    let mut st = engine.status().await.unwrap();
    for _ in 0..500 {
        if st.pending_hidden_bytes == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        st = engine.status().await.unwrap();
    }
    engine.shutdown().await;

    assert!(st.memory_waits > 0, "admission never waited: {st:?}");
    assert!(st.peak_pending_hidden_bytes <= bound, "{st:?}");
    assert!(
        st.peak_pending_hidden_bytes > bound / 2,
        "the bound was not used: {st:?}"
    );
    assert_eq!(st.pending_hidden_bytes, 0, "every byte released: {st:?}");
    let seen = peak.load(Ordering::Relaxed);
    assert!(seen <= bound, "connector held {seen} bytes > bound {bound}");
    for r in &reqs {
        let got = HsFile::read(&paths[&r.id]);
        let want = &unbounded[&r.id];
        assert_eq!(got.shape, want.shape, "{}", r.id);
        assert!(
            got.raw == want.raw,
            "{}: file differs under the bound",
            r.id
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_larger_than_the_bound_is_refused_and_others_run() {
    let out = tempfile::tempdir().unwrap();
    let mut cfg = config("llama", out.path(), 64, Some(LAYERS.to_vec()));
    cfg.engine.max_pending_bytes = 100 * ROW_BYTES;
    let engine = Engine::start(&cfg).await.unwrap();
    let big = engine
        .request(spec("big", &random_prompt(1, 101, 512)))
        .unwrap();
    let e = engine.validate(&big).unwrap_err();
    assert_eq!(
        e,
        SubmitError::TooLargeForHostMemory {
            rows: 101,
            bytes: 101 * ROW_BYTES,
            max: 100 * ROW_BYTES
        }
    );
    assert_eq!(engine.submit(big).await.unwrap_err(), e);
    let mut sub = engine.subscribe(None).await;
    for i in 0..3 {
        let fits = spec(&format!("fits{i}"), &random_prompt(2 + i, 100, 512));
        engine.submit(engine.request(fits).unwrap()).await.unwrap();
    }
    for _ in 0..3 {
        let ev = sub.next().await.unwrap();
        assert_eq!(HsFile::read(&completed_path(&ev)).shape, vec![100, 3, 64]);
    }
    engine.shutdown().await;
}
