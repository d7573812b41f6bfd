//! A request's complete hidden states and the atomic safetensors writer (DESIGN.md §1.2).

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::{Dtype, View};

use super::FileLayout;
use crate::actors::messages::{
    ChunkBytes, EventKind, FinishedRequest, OutputDtype, PrefixOutput, RequestId,
};
use crate::kernels::fp8::SCALE_BYTES;

/// The fp8 files' per-token scales, `[T, 1, 1]` f32 (`hs_connectors.fp8_utils.SCALES_KEY`).
pub const SCALES_TENSOR: &str = "hidden_states_scales";

/// All `T` rows of one request, one per token: the only thing the writer accepts.
///
/// Built only by `ConnectorState::finish` (the constructor is private to the connector module),
/// after it checked that the rows held equal the number of tokens.
#[derive(Debug)]
pub struct CompleteHiddenStates {
    id: RequestId,
    layout: Arc<FileLayout>,
    token_ids: Vec<u32>,
    output_token_ids: Vec<u32>,
    path: PathBuf,
    /// Row chunks in order, shared with the files sliced from this one's leading rows.
    chunks: Arc<[ChunkBytes]>,
    lock_files: bool,
    /// Files to cut from the leading rows (taken by [`Self::take_prefixes`]).
    prefixes: Vec<PrefixOutput>,
}

/// A write that failed, with the step and the OS error text.
#[derive(Debug, thiserror::Error)]
#[error("writing {}: {op}: {source}", path.display())]
pub struct WriteError {
    pub path: PathBuf,
    pub op: &'static str,
    #[source]
    pub source: io::Error,
}

/// One tensor's bytes, borrowed from the pending chunks (no concatenation) where it can be.
#[derive(Debug)]
pub struct TensorSource<'a> {
    dtype: Dtype,
    shape: Vec<usize>,
    parts: Vec<Cow<'a, [u8]>>,
    len: usize,
}

impl<'a> TensorSource<'a> {
    fn new(dtype: Dtype, shape: Vec<usize>, parts: Vec<Cow<'a, [u8]>>) -> Self {
        let len = parts.iter().map(|p| p.len()).sum();
        Self {
            dtype,
            shape,
            parts,
            len,
        }
    }
}

impl View for TensorSource<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// Contiguous bytes; copies only when the rows came in several chunks (the writer itself
    /// never calls this: it writes the parts one after another).
    fn data(&self) -> Cow<'_, [u8]> {
        match self.parts.as_slice() {
            [] => Cow::Borrowed(&[]),
            [one] => Cow::Borrowed(one),
            many => Cow::Owned(many.concat()),
        }
    }
    fn data_len(&self) -> usize {
        self.len
    }
}

impl CompleteHiddenStates {
    pub(super) fn new(
        req: FinishedRequest,
        layout: Arc<FileLayout>,
        chunks: Vec<ChunkBytes>,
        lock_files: bool,
    ) -> Self {
        Self {
            id: req.id,
            layout,
            token_ids: req.token_ids,
            output_token_ids: req.output_token_ids,
            path: req.path,
            chunks: chunks.into(),
            lock_files,
            prefixes: req.prefixes,
        }
    }

    /// The files made of this one's leading rows: each holds exactly its first `rows` rows and
    /// tokens, so it is complete by construction. Prefixes longer than T are dropped (the
    /// caller built them from the same prompt, so this does not happen).
    pub fn take_prefixes(&mut self) -> Vec<CompleteHiddenStates> {
        let t = self.num_tokens();
        std::mem::take(&mut self.prefixes)
            .into_iter()
            .filter(|p| p.rows >= 1 && p.rows <= t)
            .map(|p| Self {
                id: p.id,
                layout: Arc::clone(&self.layout),
                token_ids: self.token_ids[..p.rows].to_vec(),
                output_token_ids: Vec::new(),
                path: p.path,
                chunks: Arc::clone(&self.chunks),
                lock_files: self.lock_files,
                prefixes: Vec::new(),
            })
            .collect()
    }

    pub fn id(&self) -> &RequestId {
        &self.id
    }
    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn layout(&self) -> &FileLayout {
        &self.layout
    }
    /// T: tokens, and rows of `hidden_states`.
    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }
    /// Bytes of this file's hidden states.
    pub fn hidden_bytes(&self) -> usize {
        self.num_tokens() * self.layout.row_bytes()
    }

    /// This file's rows: the leading `hidden_bytes()` of the chunks, borrowed.
    fn hidden_parts(&self) -> Vec<Cow<'_, [u8]>> {
        let mut left = self.hidden_bytes();
        let mut parts = Vec::new();
        for c in self.chunks.iter() {
            if left == 0 {
                break;
            }
            let n = left.min(c.len());
            parts.push(Cow::Borrowed(&c[..n]));
            left -= n;
        }
        parts
    }

    /// fp8 rows (`width` codes then a 4-byte scale each) split into the `hidden_states` codes
    /// and the `hidden_states_scales` bytes.
    fn split_fp8_rows(&self, width: usize) -> (Vec<u8>, Vec<u8>) {
        let t = self.num_tokens();
        let mut codes = Vec::with_capacity(t * width);
        let mut scales = Vec::with_capacity(t * SCALE_BYTES);
        for part in self.hidden_parts() {
            for row in part.chunks_exact(width + SCALE_BYTES) {
                codes.extend_from_slice(&row[..width]);
                scales.extend_from_slice(&row[width..]);
            }
        }
        (codes, scales)
    }

    /// The event announcing this file once written (`bytes`: its size).
    pub fn completed_event(&self, bytes: u64) -> EventKind {
        EventKind::Completed {
            path: self.path.clone(),
            num_tokens: self.num_tokens(),
            layer_ids: self.layout.layer_ids.clone(),
            bytes,
            output_token_ids: self.output_token_ids.clone(),
        }
    }

    /// The file's tensors as safetensors views, in file order (highest alignment first, as
    /// `safetensors::serialize` orders them, so `token_ids` stays 8-byte aligned).
    pub fn tensors(&self) -> Vec<(&'static str, TensorSource<'_>)> {
        let t = self.num_tokens();
        let (k, h) = (self.layout.num_layers(), self.layout.hidden_size);
        let ids: Vec<u8> = self
            .token_ids
            .iter()
            .flat_map(|&id| i64::from(id).to_le_bytes())
            .collect();
        let mut tensors = vec![(
            "token_ids",
            TensorSource::new(Dtype::I64, vec![t], vec![Cow::Owned(ids)]),
        )];
        let dtype = dtype_of(self.layout.dtype);
        if self.layout.dtype == OutputDtype::Fp8 {
            let (codes, scales) = self.split_fp8_rows(k * h);
            tensors.push((
                "hidden_states",
                TensorSource::new(dtype, vec![t, k, h], vec![Cow::Owned(codes)]),
            ));
            tensors.push((
                SCALES_TENSOR,
                TensorSource::new(Dtype::F32, vec![t, 1, 1], vec![Cow::Owned(scales)]),
            ));
        } else {
            let hidden = self.hidden_parts();
            tensors.push((
                "hidden_states",
                TensorSource::new(dtype, vec![t, k, h], hidden),
            ));
        }
        tensors.sort_by(|(ln, l), (rn, r)| r.dtype.cmp(&l.dtype).then(ln.cmp(rn)));
        tensors
    }

    /// The file's `__metadata__` (provenance; readers ignore it).
    pub fn metadata(&self) -> HashMap<String, String> {
        let layer_ids = self
            .layout
            .layer_ids
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>();
        HashMap::from([
            ("layer_ids".into(), format!("[{}]", layer_ids.join(","))),
            ("model".into(), self.layout.model.clone()),
            ("dtype".into(), self.layout.dtype.name().into()),
            ("pre_norm_last".into(), "true".into()),
            ("hsx_version".into(), crate::VERSION.into()),
            ("num_tokens".into(), self.num_tokens().to_string()),
        ])
    }

    /// Writes the file so that it appears under its final name only when complete: `path.tmp`,
    /// fsync, rename, fsync of the directory (creating missing parents). With `lock_files`,
    /// holds an exclusive flock on `path.lock` throughout. Returns the file's size.
    pub fn write(&self) -> Result<u64, WriteError> {
        let parent = parent_dir(&self.path);
        fs::create_dir_all(parent).map_err(self.err("create directory"))?;
        let lock = if self.lock_files {
            Some(self.acquire_lock()?)
        } else {
            None
        };
        let result = self.write_and_rename(parent);
        // vLLM's clients delete the lock file themselves; only release it (closing would too).
        if let Some(lock) = lock {
            let _ = lock.unlock();
        }
        result
    }

    fn write_and_rename(&self, parent: &Path) -> Result<u64, WriteError> {
        let tmp = with_suffix(&self.path, ".tmp");
        let written = self.write_tmp(&tmp).and_then(|bytes| {
            fs::rename(&tmp, &self.path).map_err(self.err("rename into place"))?;
            Ok(bytes)
        });
        if written.is_err() {
            // Best effort: the tmp may not even exist (open failed).
            let _ = fs::remove_file(&tmp);
        }
        let bytes = written?;
        sync_dir(parent).map_err(self.err("fsync directory"))?;
        Ok(bytes)
    }

    fn write_tmp(&self, tmp: &Path) -> Result<u64, WriteError> {
        let tensors = self.tensors();
        let header = header(&tensors, self.metadata()).map_err(self.err("build header"))?;
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(tmp)
            .map_err(self.err("create tmp file"))?;
        // Large parts bypass the buffer; it only batches the header and small chunks.
        let mut out = BufWriter::with_capacity(1 << 20, &file);
        let mut bytes = header.len() as u64;
        out.write_all(&header).map_err(self.err("write"))?;
        if let Some(e) = crate::faults::write_fault(&self.path) {
            // Test hook (src/faults.rs): as if the disk filled up here.
            out.flush().map_err(self.err("write"))?;
            return Err(self.err("write")(e));
        }
        for part in tensors.iter().flat_map(|(_, t)| &t.parts) {
            out.write_all(part).map_err(self.err("write"))?;
            bytes += part.len() as u64;
        }
        out.flush().map_err(self.err("write"))?;
        drop(out);
        file.sync_all().map_err(self.err("fsync"))?;
        Ok(bytes)
    }

    /// vLLM's protocol: `O_CREAT|O_WRONLY|O_TRUNC`, mode 0644, exclusive flock (waits for
    /// readers that hold it).
    fn acquire_lock(&self) -> Result<File, WriteError> {
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(with_suffix(&self.path, ".lock"))
            .map_err(self.err("create lock file"))?;
        file.lock().map_err(self.err("lock"))?;
        Ok(file)
    }

    fn err(&self, op: &'static str) -> impl FnOnce(io::Error) -> WriteError + '_ {
        move |source| WriteError {
            path: self.path.clone(),
            op,
            source,
        }
    }
}

fn dtype_of(dtype: OutputDtype) -> Dtype {
    match dtype {
        OutputDtype::F32 => Dtype::F32,
        OutputDtype::Bf16 => Dtype::BF16,
        OutputDtype::F16 => Dtype::F16,
        OutputDtype::Fp8 => Dtype::F8_E4M3,
    }
}

/// The safetensors header: 8-byte little-endian length, then the JSON padded with spaces to a
/// multiple of 8, exactly as `safetensors::serialize` lays it out. Built through safetensors'
/// own `Metadata` (which validates shapes against byte lengths) so the data never needs to be
/// gathered into one buffer.
fn header(
    tensors: &[(&'static str, TensorSource<'_>)],
    metadata: HashMap<String, String>,
) -> io::Result<Vec<u8>> {
    let mut offset = 0;
    let infos = tensors
        .iter()
        .map(|(name, t)| {
            let start = offset;
            offset += t.data_len();
            let info = TensorInfo {
                dtype: t.dtype(),
                shape: t.shape().to_vec(),
                data_offsets: (start, offset),
            };
            (name.to_string(), info)
        })
        .collect();
    let invalid = |e: String| io::Error::new(io::ErrorKind::InvalidData, e);
    let meta = Metadata::new(Some(metadata), infos).map_err(|e| invalid(e.to_string()))?;
    let mut value = serde_json::to_value(&meta).map_err(|e| invalid(e.to_string()))?;
    // safetensors keeps `__metadata__` in a HashMap, whose order changes from run to run:
    // sorted keys make the same file the same bytes on every run (checksums, dedup).
    if let Some(m) = value
        .get_mut("__metadata__")
        .and_then(|m| m.as_object_mut())
    {
        m.sort_keys();
    }
    let mut json = serde_json::to_vec(&value).map_err(|e| invalid(e.to_string()))?;
    json.resize(json.len().next_multiple_of(8), b' ');
    let mut out = Vec::with_capacity(8 + json.len());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    Ok(out)
}

fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Makes the rename durable. Some filesystems cannot fsync a directory; that is not a failure
/// of this write.
fn sync_dir(dir: &Path) -> io::Result<()> {
    match File::open(dir)?.sync_all() {
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::InvalidInput | io::ErrorKind::Unsupported
            ) =>
        {
            Ok(())
        }
        other => other,
    }
}

#[cfg(test)]
#[path = "writer_tests.rs"]
mod tests;
