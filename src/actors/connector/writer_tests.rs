//! Tests of the safetensors writer: exact tensors and metadata, atomicity, vLLM lock files.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use half::{bf16, f16};
use safetensors::SafeTensors;

use super::*;
use crate::actors::connector::ConnectorState;
use crate::actors::messages::{CapturedChunk, PrefixOutput};

fn rid(s: &str) -> RequestId {
    RequestId::new(s).unwrap()
}

fn layout(dtype: OutputDtype) -> FileLayout {
    FileLayout {
        layer_ids: vec![0, 2, 4],
        hidden_size: 5,
        dtype,
        model: "tiny-llama".into(),
    }
}

/// Row `t`, layer `k`, dim `h` holds `t * 100 + k * 10 + h`, encoded in the layout's dtype.
fn encode(dtype: OutputDtype, values: impl Iterator<Item = f32>) -> Vec<u8> {
    values
        .flat_map(|v| match dtype {
            OutputDtype::F32 => v.to_le_bytes().to_vec(),
            OutputDtype::Bf16 => bf16::from_f32(v).to_le_bytes().to_vec(),
            OutputDtype::F16 => f16::from_f32(v).to_le_bytes().to_vec(),
            OutputDtype::Fp8 => unimplemented!("fp8 rows are quantized per row (rows())"),
        })
        .collect()
}

fn row_values(t: usize) -> Vec<f32> {
    (0..3)
        .flat_map(move |k| (0..5).map(move |h| (t * 100 + k * 10 + h) as f32))
        .collect()
}

fn rows(dtype: OutputDtype, start: usize, n: usize) -> Vec<u8> {
    if dtype == OutputDtype::Fp8 {
        return (start..start + n)
            .flat_map(|t| {
                let mut out = vec![0u8; 15 + 4];
                crate::kernels::fp8::quantize_row(&row_values(t), &mut out);
                out
            })
            .collect();
    }
    encode(dtype, (start..start + n).flat_map(row_values))
}

/// Captures T rows in chunks of the given sizes and finishes the request.
fn complete(
    dtype: OutputDtype,
    path: &Path,
    chunk_rows: &[usize],
    lock: bool,
) -> CompleteHiddenStates {
    let mut state = ConnectorState::new(layout(dtype), lock).unwrap();
    let mut start = 0;
    for &n in chunk_rows {
        let data = rows(dtype, start, n);
        let chunk = CapturedChunk {
            id: rid("req-1"),
            start,
            rows: n,
            data: data.into(),
        };
        state.capture(chunk).unwrap();
        start += n;
    }
    let req = FinishedRequest {
        id: rid("req-1"),
        token_ids: (0..start as u32).map(|i| 1000 + i).collect(),
        output_token_ids: vec![7],
        path: path.to_owned(),
        prefixes: vec![],
    };
    state.finish(req).unwrap()
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn check_file(dtype: OutputDtype, st_dtype: Dtype) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub/dir/req-1.safetensors");
    let done = complete(dtype, &path, &[2, 1, 4], false);
    let bytes = done.write().unwrap();

    let raw = fs::read(&path).unwrap();
    assert_eq!(bytes, raw.len() as u64);
    let st = SafeTensors::deserialize(&raw).unwrap();
    let mut names = st.names();
    names.sort();
    assert_eq!(names, ["hidden_states", "token_ids"]);

    let hs = st.tensor("hidden_states").unwrap();
    assert_eq!(hs.dtype(), st_dtype);
    assert_eq!(hs.shape(), [7, 3, 5]);
    assert_eq!(hs.data(), rows(dtype, 0, 7).as_slice());

    let ids = st.tensor("token_ids").unwrap();
    assert_eq!(ids.dtype(), Dtype::I64);
    assert_eq!(ids.shape(), [7]);
    let want: Vec<u8> = (1000..1007i64).flat_map(i64::to_le_bytes).collect();
    assert_eq!(ids.data(), want.as_slice());

    let (_, meta) = SafeTensors::read_metadata(&raw).unwrap();
    let expected = HashMap::from([
        ("layer_ids".to_string(), "[0,2,4]".to_string()),
        ("model".into(), "tiny-llama".into()),
        ("dtype".into(), dtype.name().into()),
        ("pre_norm_last".into(), "true".into()),
        ("hsx_version".into(), crate::VERSION.into()),
        ("num_tokens".into(), "7".into()),
    ]);
    assert_eq!(meta.metadata().as_ref(), Some(&expected));
    // int64 data first: 8-byte aligned for zero-copy readers.
    assert_eq!(meta.info("token_ids").unwrap().data_offsets.0, 0);
    assert_eq!(names_in(path.parent().unwrap()), ["req-1.safetensors"]);
}

#[test]
fn writes_fp8_file_in_hs_connectors_layout() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("req-1.safetensors");
    let done = complete(OutputDtype::Fp8, &path, &[2, 1, 4], false);
    let written = done.write().unwrap();
    let raw = fs::read(&path).unwrap();
    assert_eq!(written, raw.len() as u64);
    let st = SafeTensors::deserialize(&raw).unwrap();
    let mut names = st.names();
    names.sort();
    assert_eq!(names, ["hidden_states", SCALES_TENSOR, "token_ids"]);
    let held = rows(OutputDtype::Fp8, 0, 7);
    let (codes, scales): (Vec<&[u8]>, Vec<&[u8]>) =
        held.chunks_exact(19).map(|r| r.split_at(15)).unzip();
    let hs = st.tensor("hidden_states").unwrap();
    assert_eq!(hs.dtype(), Dtype::F8_E4M3);
    assert_eq!(hs.shape(), [7, 3, 5]);
    assert_eq!(hs.data(), codes.concat().as_slice());
    let sc = st.tensor(SCALES_TENSOR).unwrap();
    assert_eq!(sc.dtype(), Dtype::F32);
    assert_eq!(sc.shape(), [7, 1, 1]);
    assert_eq!(sc.data(), scales.concat().as_slice());
    // Row 6's amax is 624 (6·100 + 2·10 + 4): scale 624 / 448.
    assert_eq!(sc.data()[24..28], (624.0f32 / 448.0).to_le_bytes());
    let (_, meta) = SafeTensors::read_metadata(&raw).unwrap();
    assert_eq!(meta.metadata().as_ref().unwrap()["dtype"], "fp8");
    assert_eq!(meta.info("token_ids").unwrap().data_offsets.0, 0);
}

#[test]
fn writes_exact_f32_file() {
    check_file(OutputDtype::F32, Dtype::F32);
}

#[test]
fn writes_exact_bf16_file() {
    check_file(OutputDtype::Bf16, Dtype::BF16);
}

#[test]
fn writes_exact_f16_file() {
    check_file(OutputDtype::F16, Dtype::F16);
}

#[test]
fn same_content_as_safetensors_serialize() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.safetensors");
    let done = complete(OutputDtype::Bf16, &path, &[3, 3], false);
    done.write().unwrap();
    let ours = fs::read(&path).unwrap();
    let theirs = safetensors::serialize(done.tensors(), Some(done.metadata())).unwrap();
    assert_eq!(ours.len(), theirs.len());
    let (a, b) = (
        SafeTensors::deserialize(&ours).unwrap(),
        SafeTensors::deserialize(&theirs).unwrap(),
    );
    for name in ["hidden_states", "token_ids"] {
        let (x, y) = (a.tensor(name).unwrap(), b.tensor(name).unwrap());
        assert_eq!(
            (x.dtype(), x.shape(), x.data()),
            (y.dtype(), y.shape(), y.data())
        );
    }
    // Same header length, so the data sections line up byte for byte.
    let data_start = |raw: &[u8]| 8 + u64::from_le_bytes(raw[..8].try_into().unwrap()) as usize;
    assert_eq!(data_start(&ours), data_start(&theirs));
    assert_eq!(ours[data_start(&ours)..], theirs[data_start(&theirs)..]);
}

/// The same content gives the same bytes, whichever order the metadata map iterates in (a
/// fresh HashMap per write: different orders with high probability), keys sorted.
#[test]
fn same_content_same_bytes_on_every_write() {
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<Vec<u8>> = (0..4)
        .map(|i| {
            let path = dir.path().join(format!("{i}.safetensors"));
            complete(OutputDtype::Bf16, &path, &[3, 3], false)
                .write()
                .unwrap();
            fs::read(&path).unwrap()
        })
        .collect();
    assert!(files.iter().all(|f| f == &files[0]));
    let len = u64::from_le_bytes(files[0][..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&files[0][8..8 + len]).unwrap();
    let keys: Vec<&String> = header["__metadata__"].as_object().unwrap().keys().collect();
    assert!(keys.len() > 3 && keys.is_sorted(), "{keys:?}");
}

#[test]
fn replaces_stale_tmp_and_old_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.safetensors");
    fs::write(with_suffix(&path, ".tmp"), b"stale partial write").unwrap();
    fs::write(&path, b"old").unwrap();
    let done = complete(OutputDtype::F32, &path, &[1], false);
    let bytes = done.write().unwrap();
    assert_eq!(fs::metadata(&path).unwrap().len(), bytes);
    assert_eq!(names_in(dir.path()), ["a.safetensors"]);
}

#[test]
fn parent_is_a_file_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("blocker");
    fs::write(&blocker, b"x").unwrap();
    let path = blocker.join("a.safetensors");
    let err = complete(OutputDtype::F32, &path, &[2], false)
        .write()
        .unwrap_err();
    assert_eq!(err.op, "create directory");
    assert!(err.to_string().contains("os error"), "{err}");
    assert_eq!(names_in(dir.path()), ["blocker"]);
}

#[test]
fn failed_rename_removes_tmp() {
    let dir = tempfile::tempdir().unwrap();
    // A non-empty directory under the final name: the tmp is written, the rename fails.
    let path = dir.path().join("a.safetensors");
    fs::create_dir_all(path.join("inside")).unwrap();
    let err = complete(OutputDtype::F32, &path, &[2], false)
        .write()
        .unwrap_err();
    assert_eq!(err.op, "rename into place");
    assert_eq!(names_in(dir.path()), ["a.safetensors"]);
    assert!(path.is_dir(), "the final name never holds a partial file");
}

#[test]
fn lock_file_created_and_released() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.safetensors");
    let done = complete(OutputDtype::F32, &path, &[2], true);
    done.write().unwrap();
    let lock_path = with_suffix(&path, ".lock");
    let mode = fs::metadata(&lock_path).unwrap().permissions().mode();
    assert_eq!(mode & 0o600, 0o600, "owner read/write: {mode:o}");
    assert_eq!(mode & 0o133, 0, "no exec, no group/other write: {mode:o}");
    let lock = File::open(&lock_path).unwrap();
    lock.try_lock().expect("the writer released its lock");
    assert_eq!(
        names_in(dir.path()),
        ["a.safetensors", "a.safetensors.lock"]
    );
}

#[test]
fn writer_waits_for_a_held_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.safetensors");
    let lock_path = with_suffix(&path, ".lock");
    let reader = File::create(&lock_path).unwrap();
    reader.lock().unwrap();
    let done = complete(OutputDtype::F32, &path, &[2], true);
    let writer = std::thread::spawn(move || done.write());
    std::thread::sleep(Duration::from_millis(150));
    assert!(!path.exists(), "no write while a client holds the lock");
    reader.unlock().unwrap();
    writer.join().unwrap().unwrap();
    assert!(path.exists());
}

#[test]
fn completed_event_describes_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.safetensors");
    let done = complete(OutputDtype::F32, &path, &[2, 2], false);
    assert_eq!((done.num_tokens(), done.hidden_bytes()), (4, 4 * 3 * 5 * 4));
    assert_eq!(done.id().as_str(), "req-1");
    assert_eq!(
        done.completed_event(99),
        EventKind::Completed {
            path,
            num_tokens: 4,
            layer_ids: vec![0, 2, 4],
            bytes: 99,
            output_token_ids: vec![7],
        }
    );
}

#[test]
fn prefixes_are_the_leading_rows_of_the_full_file() {
    let dir = tempfile::tempdir().unwrap();
    let layout = FileLayout {
        layer_ids: vec![0, 2],
        hidden_size: 3,
        dtype: OutputDtype::F32,
        model: "m".into(),
    };
    let mut state = ConnectorState::new(layout, false).unwrap();
    let row = |r: usize| -> Vec<u8> {
        (0..6)
            .flat_map(|v| ((r * 10 + v) as f32).to_le_bytes())
            .collect()
    };
    // Rows 0..2 in one chunk, 2..5 in another: the 3-row prefix spans both.
    let data = |a: usize, b: usize| (a..b).flat_map(row).collect::<Vec<u8>>();
    for (start, end) in [(0, 2), (2, 5)] {
        state
            .capture(CapturedChunk {
                id: rid("full"),
                start,
                rows: end - start,
                data: data(start, end).into(),
            })
            .unwrap();
    }
    let prefix = |id: &str, rows| PrefixOutput {
        id: rid(id),
        rows,
        path: dir.path().join(format!("{id}.safetensors")),
    };
    let req = FinishedRequest {
        id: rid("full"),
        token_ids: vec![5, 6, 7, 8, 9],
        output_token_ids: vec![],
        path: dir.path().join("full.safetensors"),
        prefixes: vec![prefix("p3", 3), prefix("p1", 1), prefix("too-long", 6)],
    };
    let mut complete = state.finish(req).unwrap();
    let prefixes = complete.take_prefixes();
    assert_eq!(prefixes.len(), 2, "a prefix longer than T is dropped");
    complete.write().unwrap();
    for p in &prefixes {
        p.write().unwrap();
    }
    let read = |name: &str| {
        let bytes = std::fs::read(dir.path().join(name)).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let hs = st.tensor("hidden_states").unwrap();
        let tok = st.tensor("token_ids").unwrap();
        (hs.shape().to_vec(), hs.data().to_vec(), tok.data().to_vec())
    };
    let (shape, hs, _) = read("p3.safetensors");
    assert_eq!(shape, vec![3, 2, 3]);
    assert_eq!(hs, data(0, 3));
    let (shape, hs, tok) = read("p1.safetensors");
    assert_eq!(shape, vec![1, 2, 3]);
    assert_eq!(hs, data(0, 1));
    assert_eq!(tok, 5i64.to_le_bytes().to_vec());
    assert_eq!(read("full.safetensors").1, data(0, 5));
}
