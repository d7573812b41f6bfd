//! Tests driving the Connector and EventHub actors together.

use std::path::{Path, PathBuf};

use safetensors::SafeTensors;

use super::*;
use crate::actors::events::{EventHubHandle, EventHubOptions};
use crate::actors::messages::OutputDtype;

// K = 2 layers, H = 4, f32: 32 bytes per row.
fn layout() -> FileLayout {
    FileLayout {
        layer_ids: vec![1, 3],
        hidden_size: 4,
        dtype: OutputDtype::F32,
        model: "tiny".into(),
    }
}

fn rid(s: &str) -> RequestId {
    RequestId::new(s).unwrap()
}

fn chunk(id: &str, start: usize, rows: usize) -> CapturedChunk {
    CapturedChunk {
        id: rid(id),
        start,
        rows,
        data: vec![start as u8 + 1; rows * 32].into(),
    }
}

fn finished(id: &str, dir: &Path, tokens: usize) -> FinishedRequest {
    FinishedRequest {
        id: rid(id),
        token_ids: (0..tokens as u32).collect(),
        output_token_ids: vec![42],
        path: dir.join(format!("{id}.safetensors")),
        prefixes: vec![],
    }
}

fn spawn(options: ConnectorOptions) -> (ConnectorHandle, EventHubHandle) {
    let events = EventHubHandle::spawn(EventHubOptions::default());
    let connector = ConnectorHandle::spawn(layout(), options, events.clone()).unwrap();
    (connector, events)
}

#[tokio::test]
async fn complete_request_is_written_then_announced() {
    let dir = tempfile::tempdir().unwrap();
    let (connector, events) = spawn(ConnectorOptions::default());
    let mut sub = events.subscribe(None).await;
    connector.capture(chunk("r1", 0, 3)).await.unwrap();
    connector.capture(chunk("r1", 3, 2)).await.unwrap();
    connector
        .finish(finished("r1", dir.path(), 5))
        .await
        .unwrap();

    let event = sub.next().await.unwrap();
    let path = dir.path().join("r1.safetensors");
    // The event comes after the rename: the file is already complete under its final name.
    let raw = std::fs::read(&path).unwrap();
    assert_eq!(event.seq, 1);
    assert_eq!(event.id, rid("r1"));
    assert_eq!(
        event.kind,
        EventKind::Completed {
            path: path.clone(),
            num_tokens: 5,
            layer_ids: vec![1, 3],
            bytes: raw.len() as u64,
            output_token_ids: vec![42],
        }
    );
    let st = SafeTensors::deserialize(&raw).unwrap();
    assert_eq!(st.tensor("hidden_states").unwrap().shape(), [5, 2, 4]);
    assert_eq!(connector.stats().await.unwrap(), ConnectorStats::default());
    connector.stop().await;
    assert_eq!(connector.stats().await, Err(ConnectorError::NotRunning));
}

#[tokio::test]
async fn incomplete_or_bad_requests_fail_without_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let (connector, events) = spawn(ConnectorOptions::default());
    let mut sub = events.subscribe(None).await;
    connector.capture(chunk("short", 0, 2)).await.unwrap();
    connector
        .finish(finished("short", dir.path(), 3))
        .await
        .unwrap();
    connector.capture(chunk("gap", 0, 1)).await.unwrap();
    connector.capture(chunk("gap", 2, 1)).await.unwrap();
    connector
        .finish(finished("gap", dir.path(), 3))
        .await
        .unwrap();
    connector.capture(chunk("aborted", 0, 1)).await.unwrap();
    assert_eq!(connector.stats().await.unwrap().pending_bytes, 32);
    connector.discard(rid("aborted")).await.unwrap();
    connector.flush().await.unwrap();

    let short = sub.next().await.unwrap();
    let EventKind::Failed { error } = &short.kind else {
        panic!("{short:?}")
    };
    assert_eq!(short.id, rid("short"));
    assert!(
        error.contains("2 rows") && error.contains("needs 3"),
        "{error}"
    );
    let gap = sub.next().await.unwrap();
    let EventKind::Failed { error } = &gap.kind else {
        panic!("{gap:?}")
    };
    assert!(error.contains("gap"), "{error}");
    assert_eq!(sub.try_next(), None, "a discard publishes nothing");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    assert_eq!(connector.stats().await.unwrap(), ConnectorStats::default());
}

#[tokio::test]
async fn write_error_is_published_with_os_text() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("blocker");
    std::fs::write(&blocker, b"x").unwrap();
    let (connector, events) = spawn(ConnectorOptions::default());
    let mut sub = events.subscribe(None).await;
    connector.capture(chunk("r", 0, 1)).await.unwrap();
    connector.finish(finished("r", &blocker, 1)).await.unwrap();
    let event = sub.next().await.unwrap();
    let EventKind::Failed { error } = &event.kind else {
        panic!("{event:?}")
    };
    assert!(error.contains("os error"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_captures_and_bounded_writers() {
    let dir = tempfile::tempdir().unwrap();
    let options = ConnectorOptions {
        mailbox: 2,
        max_concurrent_writes: 1,
        lock_files: true,
    };
    let (connector, events) = spawn(options);
    // The model runner sends from its own OS thread.
    let runner = connector.clone();
    let thread = std::thread::spawn(move || {
        for r in 0..6 {
            let id = format!("r{r}");
            for start in 0..4 {
                runner.capture_blocking(chunk(&id, start, 1)).unwrap();
            }
        }
    });
    tokio::task::spawn_blocking(move || thread.join().unwrap())
        .await
        .unwrap();
    for r in 0..6 {
        let req = finished(&format!("r{r}"), dir.path(), 4);
        connector.finish(req).await.unwrap();
    }
    connector.flush().await.unwrap();
    // Everything published before flush returned is in the journal.
    let mut sub = events.subscribe(Some(0)).await;
    let mut paths: Vec<PathBuf> = Vec::new();
    for _ in 0..6 {
        let event = sub.next().await.unwrap();
        let EventKind::Completed { path, .. } = event.kind else {
            panic!("{event:?}")
        };
        assert!(path.exists());
        paths.push(path);
    }
    paths.sort();
    assert_eq!(paths[0], dir.path().join("r0.safetensors"));
    assert_eq!(sub.try_next(), None);
    let files = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(files, 12, "6 files and their 6 lock files, no tmp");
}

#[tokio::test]
async fn invalid_layout_is_rejected() {
    let events = EventHubHandle::spawn(EventHubOptions::default());
    let mut bad = layout();
    bad.layer_ids = vec![3, 1];
    let spawned = ConnectorHandle::spawn(bad, ConnectorOptions::default(), events);
    assert!(matches!(spawned, Err(ConnectorError::Layout(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_are_reported_once_per_request_on_every_path() {
    use crate::actors::messages::{HiddenStatesReleased, PrefixOutput};
    let dir = tempfile::tempdir().unwrap();
    let events = EventHubHandle::spawn(EventHubOptions::default());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let connector =
        ConnectorHandle::spawn_reporting(layout(), ConnectorOptions::default(), events, Some(tx))
            .unwrap();
    let blocker = dir.path().join("blocker");
    std::fs::write(&blocker, b"x").unwrap();
    // Written, with two files sliced from its rows: one report, after all three writes.
    connector.capture(chunk("root", 0, 4)).await.unwrap();
    let mut root = finished("root", dir.path(), 4);
    root.prefixes = ["p1", "p2"]
        .iter()
        .zip([1, 3])
        .map(|(p, rows)| PrefixOutput {
            id: rid(p),
            rows,
            path: dir.path().join(format!("{p}.safetensors")),
        })
        .collect();
    connector.finish(root).await.unwrap();
    // Write failed.
    connector.capture(chunk("unwritable", 0, 1)).await.unwrap();
    let req = finished("unwritable", &blocker, 1);
    connector.finish(req).await.unwrap();
    // Finish refused (incomplete), discarded with rows, discarded without any.
    connector.capture(chunk("short", 0, 1)).await.unwrap();
    connector
        .finish(finished("short", dir.path(), 2))
        .await
        .unwrap();
    connector.capture(chunk("aborted", 0, 1)).await.unwrap();
    connector.discard(rid("aborted")).await.unwrap();
    connector.discard(rid("unseen")).await.unwrap();
    connector.flush().await.unwrap();
    let stats = connector.stats().await.unwrap();
    assert_eq!((stats.pending_bytes, stats.writing_bytes), (0, 0));
    connector.stop().await;
    let mut got = Vec::new();
    while let Some(HiddenStatesReleased(id)) = rx.recv().await {
        got.push(id.to_string());
    }
    got.sort();
    assert_eq!(
        got,
        ["aborted", "root", "short", "unseen", "unwritable"],
        "one report per finish or discard, none for the sliced files"
    );
    for f in ["root", "p1", "p2"] {
        assert!(dir.path().join(format!("{f}.safetensors")).exists(), "{f}");
    }
}
