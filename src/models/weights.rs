//! Safetensors weights of a model directory: `model.safetensors`, or
//! `model.safetensors.index.json` + the shards it names. Files are memory-mapped; each tensor
//! is widened to an owned f32 `Vec` when asked for (once, at load).

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use safetensors::tensor::{Dtype, Metadata, SafeTensors};

use super::compressed_tensors::{self, Compressed, PackedInt};
use super::fp8_weights::{self, Fp8Blocks};
use super::{ModelError, WeightDtype};
use crate::kernels::device::{HostMatrix, HostTable, SharedBytes, widen};
use crate::kernels::dtype::dtype_size;

/// A gather-only table's own map starts at a multiple of this (a multiple of every page size
/// Linux uses: 4, 16 and 64 KiB).
const TABLE_MAP_ALIGN: usize = 64 << 10;

/// One memory-mapped safetensors file with its parsed header.
struct Shard {
    path: PathBuf,
    mmap: Mmap,
    /// Byte offset of the data section (8 + header length).
    data_start: usize,
    metadata: Metadata,
}

impl Shard {
    fn open(path: &Path) -> Result<Self, ModelError> {
        let mmap = map_file(path, None)?;
        let (header_len, metadata) =
            SafeTensors::read_metadata(&mmap).map_err(|e| ModelError::Safetensors {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
        Ok(Self {
            path: path.to_path_buf(),
            mmap,
            data_start: 8 + header_len,
            metadata,
        })
    }
}

/// A read-only map of the file at `path`, whole or the bytes `region` (its start a multiple of
/// the page size).
fn map_file(path: &Path, region: Option<Range<usize>>) -> Result<Mmap, ModelError> {
    let io = |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let mut options = memmap2::MmapOptions::new();
    if let Some(r) = region {
        options.offset(r.start as u64).len(r.len());
    }
    // SAFETY: the file is opened read-only and the map is never written to; like every
    // safetensors reader we rely on the checkpoint not being modified while hsx runs.
    unsafe { options.map(&file) }.map_err(io)
}

/// The weights of one model directory.
pub struct Weights {
    dir: PathBuf,
    shards: Vec<Shard>,
    /// tensor name -> index into `shards`
    index: HashMap<String, usize>,
    /// The text model's name of each tensor of a multimodal export's language model
    /// (`model.X` for `model.language_model.X`) -> its stored name.
    aliases: HashMap<String, String>,
    /// FP8 weights' blocks and the dtype they are dequantized to ([`Weights::dequantizing`]).
    fp8: Option<(Fp8Blocks, WeightDtype)>,
    /// The FP8 scales' suffix: `_scale_inv` (`quant_method` fp8), `_scale` (compressed-tensors).
    fp8_scale: &'static str,
    /// Packed integer weights' layout and the dtype they are dequantized to.
    packed: Option<(PackedInt, WeightDtype)>,
}

impl Weights {
    /// Opens the checkpoint in `dir`. Errors if the directory, the index or a shard is missing
    /// or malformed.
    pub fn open(dir: &Path) -> Result<Self, ModelError> {
        if !dir.is_dir() {
            return Err(ModelError::MissingDir(dir.to_path_buf()));
        }
        let single = dir.join("model.safetensors");
        let index_path = dir.join("model.safetensors.index.json");
        let files = if single.is_file() {
            vec![single]
        } else if index_path.is_file() {
            shard_files(&index_path)?
        } else {
            return Err(ModelError::NoWeights(dir.to_path_buf()));
        };
        let mut shards = Vec::with_capacity(files.len());
        let mut index = HashMap::new();
        for (i, file) in files.iter().enumerate() {
            let shard = Shard::open(file)?;
            for name in shard.metadata.tensors().keys() {
                if let Some(first) = index.insert(name.clone(), i) {
                    return Err(ModelError::Safetensors {
                        path: file.clone(),
                        message: format!("tensor `{name}` is also in {}", files[first].display()),
                    });
                }
            }
            shards.push(shard);
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            aliases: text_model_aliases(&index),
            shards,
            index,
            fp8: None,
            fp8_scale: "_scale_inv",
            packed: None,
        })
    }

    /// The same weights, FP8 matrices (float8_e4m3fn with a `_scale_inv` sibling) read in
    /// `dtype` when `blocks` is given (the config's `quantization_config`), refused otherwise.
    /// Likewise a compressed-tensors checkpoint's (`compressed`): packed integer matrices (a
    /// `weight_packed` in place of `weight`), or FP8 ones with a `_scale` sibling.
    pub fn dequantizing(
        mut self,
        (blocks, compressed): (Option<Fp8Blocks>, Option<Compressed>),
        dtype: WeightDtype,
    ) -> Self {
        self.fp8 = blocks.map(|b| (b, dtype));
        match compressed {
            Some(Compressed::Int(p)) => self.packed = Some((p, dtype)),
            Some(Compressed::Float(b)) => (self.fp8, self.fp8_scale) = (Some((b, dtype)), "_scale"),
            None => {}
        }
        self
    }

    /// The same weights, each tensor a release names with a `from` part of `renames` also
    /// answering to the name with `to` in its place (transformers' in-memory name, which hsx's
    /// loaders read), where no tensor has that name itself: transformers' load-time renamings
    /// of a family's released checkpoints (`Architecture::released_renames`).
    pub fn renamed(mut self, renames: &[(&str, &str)]) -> Self {
        // Most families have none: no pass over the names at every load.
        if renames.is_empty() {
            return self;
        }
        let visible = (self.index.keys().map(|n| (n.clone(), n.clone())))
            .chain(self.aliases.iter().map(|(a, s)| (a.clone(), s.clone())))
            .collect::<Vec<_>>();
        for (name, stored) in visible {
            for (from, to) in renames {
                let renamed = name.replacen(from, to, 1);
                if renamed != name && !self.index.contains_key(&renamed) {
                    self.aliases.insert(renamed, stored.clone());
                }
            }
        }
        self
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The checkpoint has `name` (a packed integer weight answers to its `weight`'s name).
    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(self.stored_name(name)) || self.packed_name(name).is_some()
    }

    /// `{name}_packed` where `name` is a `weight` the checkpoint stores packed.
    fn packed_name(&self, name: &str) -> Option<String> {
        let packed = format!("{name}_packed");
        let stored = |n: &str| self.index.contains_key(self.stored_name(n));
        (name.ends_with(".weight") && !stored(name) && stored(&packed)).then_some(packed)
    }

    /// `name` as the checkpoint stores it (a multimodal export's language model is read under
    /// the text model's names).
    fn stored_name<'n>(&'n self, name: &'n str) -> &'n str {
        self.aliases.get(name).map_or(name, String::as_str)
    }

    /// Shape of a tensor as stored.
    pub fn shape_of(&self, name: &str) -> Result<Vec<usize>, ModelError> {
        let (_, info) = self.info(name)?;
        Ok(info.shape.clone())
    }

    /// On-disk dtype of a tensor.
    pub fn dtype_of(&self, name: &str) -> Result<WeightDtype, ModelError> {
        let (_, info) = self.info(name)?;
        weight_dtype(name, info.dtype)
    }

    /// The tensor `name` as f32, checked against `expected_shape`.
    pub fn tensor(&self, name: &str, expected_shape: &[usize]) -> Result<Vec<f32>, ModelError> {
        let (dtype, bytes) = self.raw(name, expected_shape)?;
        Ok(widen(bytes, dtype))
    }

    /// The matrix `name` (`[rows, cols]`) as stored: its raw elements in the mapped file.
    pub fn matrix(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<HostMatrix<'_>, ModelError> {
        if let Some(packed) = self.packed_name(name) {
            return self.unpacked(name, &packed, (rows, cols));
        }
        if let (Dtype::F8_E4M3, codes) = self.located(name, &[rows, cols])? {
            return self.fp8_stack(name, codes, &[], (rows, cols));
        }
        let (dtype, bytes) = self.raw(name, &[rows, cols])?;
        Ok(HostMatrix {
            dtype,
            rows,
            cols,
            data: std::borrow::Cow::Borrowed(bytes),
        })
    }

    /// The embedding table `name` (`[rows, cols]`) in a map of its own pages of its shard (an
    /// FP8 one dequantized into owned bytes).
    pub fn table(&self, name: &str, rows: usize, cols: usize) -> Result<HostTable, ModelError> {
        let (shard, dtype, span) = self.span(name, &[rows, cols])?;
        if dtype == Dtype::F8_E4M3 {
            return Ok(HostTable::from_matrix(&self.matrix(name, rows, cols)?));
        }
        let dtype = weight_dtype(name, dtype)?;
        // A map of the table's own pages: the shard's map (every other weight's pages, read
        // at load) is not kept alive with the model.
        let start = span.start / TABLE_MAP_ALIGN * TABLE_MAP_ALIGN;
        let map = map_file(&shard.path, Some(start..span.end))?;
        let lead = span.start - start;
        let bytes: SharedBytes = Arc::new(map);
        HostTable::new(bytes, lead..lead + span.len(), dtype, (rows, cols)).map_err(|message| {
            ModelError::Safetensors {
                path: shard.path.clone(),
                message,
            }
        })
    }

    /// The 3-D tensor `name` (`[n, rows, cols]`, e.g. fused experts) as the matrix
    /// `[n · rows, cols]`, as stored.
    pub fn stacked(
        &self,
        name: &str,
        n: usize,
        rows: usize,
        cols: usize,
    ) -> Result<HostMatrix<'_>, ModelError> {
        if let (Dtype::F8_E4M3, codes) = self.located(name, &[n, rows, cols])? {
            return self.fp8_stack(name, codes, &[n], (rows, cols));
        }
        self.stacked_matrix(name, &[n, rows, cols])
    }

    /// The FP8 tensor `name` (`codes`: `[lead.., rows, cols]`, matrices stacked along the
    /// leading dims) dequantized with `{name}_scale_inv` (compressed-tensors: `{name}_scale`;
    /// `[lead.., row blocks, col blocks]`,
    /// or one value for a single matrix) as the matrix `[n · rows, cols]`, `n` the product of
    /// `lead`.
    fn fp8_stack(
        &self,
        name: &str,
        codes: &[u8],
        lead: &[usize],
        (rows, cols): (usize, usize),
    ) -> Result<HostMatrix<'static>, ModelError> {
        let n: usize = lead.iter().product();
        let Some((blocks, dtype)) = self.fp8 else {
            return Err(ModelError::TensorDtype {
                name: name.to_string(),
                dtype: "F8_E4M3 (the config names no fp8 quantization_config)".into(),
            });
        };
        let scale_name = format!("{name}{}", self.fp8_scale);
        if !self.contains(&scale_name) && self.contains(&format!("{name}_scale")) {
            return Err(ModelError::InvalidOptions(format!(
                "FP8 weight `{name}` has a per-tensor `{name}_scale` (AutoFP8's layout): hsx \
                 reads block-quantized FP8 (`{scale_name}`)"
            )));
        }
        // One scale for the whole matrix (Mistral's FP8 releases: Ministral 3, Devstral 2):
        // transformers reads the blocks off the scales' shape, a single value being one block.
        let scale_shape = self.shape_of(&scale_name)?;
        let per_tensor = lead.is_empty() && scale_shape.iter().product::<usize>() == 1;
        let blocks = match per_tensor {
            true => Fp8Blocks {
                rows: rows.max(1),
                cols: cols.max(1),
            },
            false => blocks,
        };
        let grid = blocks.grid(rows, cols);
        let shape = match per_tensor {
            true => scale_shape,
            false => [lead, &grid[..]].concat(),
        };
        let scales = self.tensor(&scale_name, &shape)?;
        let (per, per_scales) = (rows * cols, grid[0] * grid[1]);
        let mut data = Vec::with_capacity(n * per * dtype_size(dtype));
        for i in 0..n {
            let m = fp8_weights::dequantize(
                name,
                &codes[i * per..][..per],
                &scales[i * per_scales..][..per_scales],
                (rows, cols),
                blocks,
                dtype,
            )?;
            data.extend_from_slice(&m.data);
        }
        Ok(HostMatrix {
            dtype,
            rows: n * rows,
            cols,
            data: std::borrow::Cow::Owned(data),
        })
    }

    /// The packed integer weight `name` (`[rows, cols]`, stored as `packed` with
    /// `{name}_scale` and `{name}_shape`) dequantized.
    fn unpacked(
        &self,
        name: &str,
        packed: &str,
        (rows, cols): (usize, usize),
    ) -> Result<HostMatrix<'static>, ModelError> {
        let Some((p, dtype)) = self.packed else {
            return Err(ModelError::TensorDtype {
                name: packed.to_string(),
                dtype: "packed integers (the config names no compressed-tensors \
                        quantization_config)"
                    .into(),
            });
        };
        let shape_name = format!("{name}_shape");
        let shape: Vec<i64> = match self.located(&shape_name, &[2])? {
            (Dtype::I64, b) => (b.chunks_exact(8))
                .map(|x| i64::from_le_bytes(x.try_into().unwrap_or_default()))
                .collect(),
            (Dtype::I32, b) => (b.chunks_exact(4))
                .map(|x| i32::from_le_bytes(x.try_into().unwrap_or_default()).into())
                .collect(),
            (other, _) => {
                return Err(ModelError::TensorDtype {
                    name: shape_name,
                    dtype: format!("{other:?} (expected I64)"),
                });
            }
        };
        if shape != [rows as i64, cols as i64] {
            return Err(ModelError::InvalidOptions(format!(
                "packed weight `{name}`: `{shape_name}` is {shape:?}, expected [{rows}, {cols}]"
            )));
        }
        let words = match self.located(packed, &[rows, p.words(cols)])? {
            (Dtype::I32, bytes) => bytes,
            (other, _) => {
                return Err(ModelError::TensorDtype {
                    name: packed.to_string(),
                    dtype: format!("{other:?} (expected I32)"),
                });
            }
        };
        let scales = self.tensor(&format!("{name}_scale"), &[rows, p.scales(cols)])?;
        compressed_tensors::dequantize(name, words, &scales, (rows, cols), p, dtype)
    }

    /// The tensor `name` of `shape` seen as `[shape[0] · … · shape[n-2], shape[n-1]]` rows as
    /// stored (gpt-oss keeps all experts of a layer in one `[E, in, out]` tensor).
    pub fn stacked_matrix(
        &self,
        name: &str,
        shape: &[usize],
    ) -> Result<HostMatrix<'_>, ModelError> {
        let (dtype, bytes) = self.raw(name, shape)?;
        // Fits: raw checked that the shape's values are the tensor's bytes.
        let (cols, rows) = match shape.split_last() {
            Some((&c, rest)) => (c, rest.iter().product()),
            None => (1, 1),
        };
        Ok(HostMatrix {
            dtype,
            rows,
            cols,
            data: std::borrow::Cow::Borrowed(bytes),
        })
    }

    /// The stored bytes of a `U8` tensor (MXFP4 blocks and scales), checked against
    /// `expected_shape`.
    pub fn u8s(&self, name: &str, expected_shape: &[usize]) -> Result<&[u8], ModelError> {
        match self.located(name, expected_shape)? {
            (Dtype::U8, bytes) => Ok(bytes),
            (other, _) => Err(ModelError::TensorDtype {
                name: name.to_string(),
                dtype: format!("{other:?} (expected U8)"),
            }),
        }
    }

    /// The stored bytes of `name`, checked against `expected_shape` and its byte count.
    fn raw(
        &self,
        name: &str,
        expected_shape: &[usize],
    ) -> Result<(WeightDtype, &[u8]), ModelError> {
        let (dtype, bytes) = self.located(name, expected_shape)?;
        Ok((weight_dtype(name, dtype)?, bytes))
    }

    /// The bytes of `name` in its shard, of any stored dtype.
    fn located(&self, name: &str, expected_shape: &[usize]) -> Result<(Dtype, &[u8]), ModelError> {
        let (shard, dtype, span) = self.span(name, expected_shape)?;
        Ok((dtype, &shard.mmap[span]))
    }

    /// The shard holding `name`, its stored dtype and where its bytes lie in the shard's map
    /// (checked to be in the file and as many as its shape and dtype need).
    fn span(
        &self,
        name: &str,
        expected_shape: &[usize],
    ) -> Result<(&Shard, Dtype, Range<usize>), ModelError> {
        let (shard, info) = self.info(name)?;
        if info.shape != expected_shape {
            return Err(ModelError::TensorShape {
                name: name.to_string(),
                expected: expected_shape.to_vec(),
                found: info.shape.clone(),
            });
        }
        let (start, end) = info.data_offsets;
        let span = shard
            .data_start
            .checked_add(start)
            .zip(shard.data_start.checked_add(end))
            .map(|(a, b)| a..b)
            .filter(|s| shard.mmap.get(s.clone()).is_some())
            .ok_or_else(|| ModelError::Safetensors {
                path: shard.path.clone(),
                message: format!("data of `{name}` lies outside the file"),
            })?;
        let numel = info.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let bits = info.dtype.bitsize();
        let want = numel.and_then(|n| n.checked_mul(bits));
        if want != span.len().checked_mul(8) {
            return Err(ModelError::Safetensors {
                path: shard.path.clone(),
                message: format!(
                    "`{name}` holds {} bytes, its shape {:?} needs {numel:?} values of {bits} bits",
                    span.len(),
                    info.shape,
                ),
            });
        }
        Ok((shard, info.dtype, span))
    }

    fn info(&self, name: &str) -> Result<(&Shard, &safetensors::tensor::TensorInfo), ModelError> {
        let missing = || ModelError::MissingTensor {
            name: name.to_string(),
            dir: self.dir.clone(),
        };
        let stored = self.stored_name(name);
        let shard = &self.shards[*self.index.get(stored).ok_or_else(missing)?];
        let info = shard.metadata.info(stored).ok_or_else(missing)?;
        Ok((shard, info))
    }
}

/// Where a multimodal export keeps its language model (export prefix, the text model's): Qwen3.5
/// and Qwen3-VL under `model.language_model.`, Llama-4 under `language_model.model.` with its
/// head `language_model.lm_head`.
const EXPORT_PREFIXES: [(&str, &str); 3] = [
    ("model.language_model.", "model."),
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
];

/// Where the text model's embedding is absent and an export's present, each export tensor
/// answers to the text model's name (`model.language_model.X` to `model.X`, …; the vision tower
/// is never named).
fn text_model_aliases(index: &HashMap<String, usize>) -> HashMap<String, String> {
    let embed = "embed_tokens.weight";
    let exported = !index.contains_key(&format!("model.{embed}"))
        && (EXPORT_PREFIXES.iter()).any(|(from, _)| index.contains_key(&format!("{from}{embed}")));
    if !exported {
        return HashMap::new();
    }
    let alias = |n: &str| {
        (EXPORT_PREFIXES.iter())
            .find_map(|(from, to)| Some(format!("{to}{}", n.strip_prefix(from)?)))
    };
    index
        .keys()
        .filter_map(|n| Some((alias(n)?, n.clone())))
        .filter(|(alias, _)| !index.contains_key(alias))
        .collect()
}

/// The shard files named by an index, in first-seen order, deduplicated.
fn shard_files(index_path: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let text = std::fs::read_to_string(index_path).map_err(|source| ModelError::Io {
        path: index_path.to_path_buf(),
        source,
    })?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| ModelError::Json {
        path: index_path.to_path_buf(),
        message: e.to_string(),
    })?;
    let map = value
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| ModelError::Field {
            path: index_path.to_path_buf(),
            field: "weight_map".into(),
            message: "missing or not an object".into(),
        })?;
    let dir = index_path.parent().unwrap_or(Path::new("."));
    let mut files: Vec<PathBuf> = Vec::new();
    for (tensor, file) in map {
        let file = file.as_str().ok_or_else(|| ModelError::Field {
            path: index_path.to_path_buf(),
            field: format!("weight_map.{tensor}"),
            message: "expected a file name".into(),
        })?;
        // A shard is a file of the model directory, never one elsewhere.
        let plain = Path::new(file).components().count() == 1
            && matches!(
                Path::new(file).components().next(),
                Some(Component::Normal(_))
            );
        if !plain {
            return Err(ModelError::Field {
                path: index_path.to_path_buf(),
                field: format!("weight_map.{tensor}"),
                message: format!("{file:?} is not a file name in the model directory"),
            });
        }
        let path = dir.join(file);
        if !files.contains(&path) {
            files.push(path);
        }
    }
    Ok(files)
}

fn weight_dtype(name: &str, dtype: Dtype) -> Result<WeightDtype, ModelError> {
    match dtype {
        Dtype::F32 => Ok(WeightDtype::F32),
        Dtype::BF16 => Ok(WeightDtype::Bf16),
        Dtype::F16 => Ok(WeightDtype::F16),
        other => Err(ModelError::TensorDtype {
            name: name.to_string(),
            dtype: format!("{other:?}"),
        }),
    }
}
