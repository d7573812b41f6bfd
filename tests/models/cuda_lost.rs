//! A sticky CUDA error (an illegal address and the like) on the emulated device: every request
//! in flight or waiting fails with it, the engine admits nothing more and says so, instead of
//! failing each later step the same way. Emulated device 1 is used by this test alone, so the
//! planted fault cannot hit another test's device.
#![cfg(feature = "cuda-emu")]

use crate::common;

use common::{completed_path, config, random_prompt, spec};
use hsx::actors::messages::EventKind;
use hsx::actors::scheduler::SubmitError;
use hsx::engine::Engine;
use hsx::kernels::cuda;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cuda_sticky_error_fails_the_requests_and_stops_admission() {
    let out = tempfile::tempdir().unwrap();
    let mut cfg = config("llama", out.path(), 64, Some(vec![1, 4]));
    cfg.model.device = "cuda:1".into();
    cfg.validate().unwrap();
    let engine = Engine::start(&cfg)
        .await
        .expect("engine starts on emulated device 1");
    let mut sub = engine.subscribe(None).await;
    let submit = |id: &str, seed: u64| {
        let req = engine
            .request(spec(id, &random_prompt(seed, 50, 256)))
            .unwrap();
        engine.submit(req)
    };

    submit("before", 1).await.unwrap();
    let ev = sub.next().await.unwrap();
    let done = completed_path(&ev);

    // Three requests of 50 tokens, budget 64: two share the faulting step, one waits.
    cuda::fault_next_launch(1, "add_rms_norm_f32");
    for (i, id) in ["a", "b", "c"].iter().enumerate() {
        submit(id, 10 + i as u64).await.unwrap();
    }
    for _ in 0..3 {
        let ev = sub.next().await.unwrap();
        let EventKind::Failed { error } = &ev.kind else {
            panic!("{}: {:?}", ev.id, ev.kind);
        };
        assert!(
            error.contains("device is lost") && error.contains("illegal memory access"),
            "{}: {error}",
            ev.id
        );
    }
    let refused = submit("after", 20).await.unwrap_err();
    assert!(matches!(refused, SubmitError::DeviceLost(_)), "{refused}");
    assert!(
        refused.to_string().contains("illegal memory access"),
        "{refused}"
    );
    let stats = engine.status().await.unwrap();
    assert!(stats.device_lost);
    assert_eq!((stats.running, stats.waiting), (0, 0));
    engine.shutdown().await;

    // Only the file finished before the fault exists: nothing partial, no stray tmp files.
    let files: Vec<_> = walk(out.path());
    assert_eq!(files, vec![done], "{files:?}");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
