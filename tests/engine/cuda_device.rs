//! `model.device` selection, in any build: `cuda` fails at start with a clear reason where the
//! CUDA backend cannot run (no feature, no driver, no device), `auto` falls back to the CPU.

use crate::common;

use common::{config, run_requests, spec};
use hsx::engine::Engine;
use hsx::kernels::cuda;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_cuda_without_a_usable_gpu_fails_at_start_with_the_reason() {
    let reason = match cuda::probe(0) {
        Ok(info) => {
            eprintln!("skipping: a CUDA device is usable here ({})", info.name);
            return;
        }
        Err(e) => e.to_string(),
    };
    let out = tempfile::tempdir().unwrap();
    let mut cfg = config("llama", out.path(), 64, Some(vec![1, 4]));
    cfg.model.device = "cuda".into();
    cfg.validate().unwrap();
    let err = match Engine::start(&cfg).await {
        Ok(_) => panic!("device = \"cuda\" must not start without a usable GPU"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains(&reason), "{err} (probe: {reason})");
    if !cfg!(feature = "cuda") {
        assert!(err.contains("built without the `cuda` feature"), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_auto_falls_back_to_the_cpu() {
    if let Ok(info) = cuda::probe(0) {
        eprintln!("note: CUDA device {} is usable: auto runs on it", info.name);
    }
    let out = tempfile::tempdir().unwrap();
    let mut cfg = config("llama", out.path(), 64, Some(vec![1, 4]));
    cfg.model.device = "auto".into();
    cfg.validate().unwrap();
    let events = run_requests(&cfg, vec![spec("auto-1", &[1, 2, 3, 4, 5])]).await;
    let path = common::completed_path(&events["auto-1"]);
    assert!(path.is_file(), "{}", path.display());
}

#[test]
fn bad_device_names_are_config_errors() {
    let out = tempfile::tempdir().unwrap();
    let mut cfg = config("llama", out.path(), 64, None);
    for bad in ["gpu", "cuda:x", "cuda:"] {
        cfg.model.device = bad.into();
        let e = cfg.validate().unwrap_err().to_string();
        assert!(e.contains("model.device"), "{bad}: {e}");
    }
    for good in ["cpu", "cuda", "cuda:1", "auto"] {
        cfg.model.device = good.into();
        cfg.validate().unwrap();
    }
}
