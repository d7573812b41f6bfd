//! Issue 6.1, crash consistency: the real `hsx serve` binary, 200 requests, SIGKILL at a random
//! moment, restart, resume. 10 trials here; `cargo run --release --example soak -- crash 100`
//! runs the long version (tests/soak/).

use crate::crash;

use std::path::{Path, PathBuf};

#[test]
fn sigkill_at_random_moments_never_leaves_partial_files_and_resume_finishes_all() {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_hsx"));
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/llama");
    let seed: u64 = std::env::var("HSX_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6);
    let mut killed_mid_run = 0;
    for trial in 0..10 {
        let dir = tempfile::tempdir().unwrap();
        // 200 short requests take ~100-150 ms here: kills within 40 ms of the first submit land
        // mid-run even on a faster machine (the long soak run spreads them wider).
        let t = crash::run_trial(&bin, &model, dir.path(), 200, seed * 1000 + trial, 40);
        eprintln!("trial {trial}: {t:?}");
        assert!(t.ok(), "trial {trial} (seed {seed}): {t:?}");
        assert!(t.tmp_after_kill >= 1);
        if t.completed_before_kill < 200 {
            killed_mid_run += 1;
        }
    }
    assert!(killed_mid_run >= 3, "kills must land mid-run");
}
