//! `extract --input DIR` on a Hugging Face `datasets` directory (speculators' preprocessed
//! layout): `hs_{row}.safetensors` per row, sharded runs whose union is the unsharded run.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;

use common::*;
use hsx::engine::Engine;
use hsx::extract::{ExtractOptions, Shard, read_dataset};

fn dataset() -> std::path::PathBuf {
    fixture_dir().join("datasets/turns")
}

fn names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

async fn extract(out: &Path, shard: Option<Shard>) -> hsx::extract::ExtractSummary {
    let cfg = config("llama", out, 64, Some(vec![0, 4]));
    let engine = Engine::start(&cfg).await.unwrap();
    let opts = ExtractOptions {
        show_progress: false,
        shard,
        ..Default::default()
    };
    let summary = hsx::extract::run_with(&engine, &dataset(), &opts)
        .await
        .unwrap();
    engine.shutdown().await;
    assert!(summary.ok(), "{}", summary.report());
    summary
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dataset_rows_become_hs_files_and_shards_partition_them() {
    let rows = read_dataset(&dataset(), None).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let whole = dir.path().join("whole");
    let summary = extract(&whole, None).await;
    assert_eq!(summary.completed, rows.len());
    // One row per assistant turn: earlier turns are prefixes of later ones, computed once.
    assert!(
        summary.tokens_computed < summary.tokens,
        "{}",
        summary.report()
    );
    for r in &rows {
        let f = HsFile::read(&whole.join(format!("hs_{}.safetensors", r.row)));
        let ids: Vec<u32> = f.token_ids.iter().map(|&t| t as u32).collect();
        assert_eq!(&ids, r.input_ids.as_ref().unwrap(), "row {}", r.row);
    }

    let sharded = dir.path().join("sharded");
    let mut seen = BTreeSet::new();
    for index in 0..3 {
        let before = names(&sharded);
        let s = extract(&sharded, Some(Shard { index, count: 3 })).await;
        let new: BTreeSet<String> = names(&sharded).difference(&before).cloned().collect();
        assert_eq!(
            new.len(),
            s.completed,
            "shard {index} wrote only its own rows"
        );
        assert!(new.is_disjoint(&seen), "no file twice");
        seen.extend(new);
    }
    assert_eq!(seen, names(&whole));
    for name in &seen {
        assert!(
            HsFile::read(&whole.join(name)).raw == HsFile::read(&sharded.join(name)).raw,
            "{name}"
        );
    }
}
