//! The paged KV cache on the device and causal GQA prefill attention over it (attention.cu).
//!
//! One K and one V buffer per attention layer, `[num_blocks * block_size, kv_heads * hd]` in
//! the model dtype. The per-batch [`DevPlan`] (token ids, positions, cache slots, attention
//! tiles, block tables) is built from the device-neutral checked [`BatchPlan`] and uploaded once
//! per forward; every layer reuses it.

use super::context::LaunchConfig;

use super::context::{CudaError, CudaResult, DevBuf, Gpu, launch};
use super::dsa::DevDsa;
use super::gemm::WeightData;
use super::ops::{self, Heads, suffix};
use crate::kernels::dtype::WeightDtype;
use crate::kernels::plan::BatchPlan;

/// Query tokens per attention tile (ATTN_TILE in attention.cu).
pub const ATTN_TILE: usize = 16;
/// Query tokens per tile of the tensor-core kernel (MMA_TILE in attention.cu).
const MMA_TILE: usize = 64;
/// Head dims the tensor-core kernel is instantiated for (attn_mma_h{HD}_* in attention.cu).
const MMA_HEAD_DIMS: [usize; 5] = [16, 32, 64, 128, 256];

/// Threads per block of the tensor-core kernel: 4 warps, twice over past head dim 128, where
/// two warps share a row tile and split its output columns (MMA_THREADS in attention.cu; the
/// kernel's key-block copy rounds assume exactly this many).
fn mma_threads(hd: usize) -> u32 {
    if hd > 128 { 256 } else { 128 }
}
/// Largest head_dim the attention kernel takes (ATTN_MAX_HD).
pub const ATTN_MAX_HD: usize = super::limits::ATTN_MAX_HEAD_DIM;
const ATTN_THREADS: u32 = 128;
pub(super) const SMEM_LIMIT: usize = 48 * 1024;

/// The batch plan on the device.
pub struct DevPlan {
    pub num_tokens: usize,
    /// u32 token ids (range-checked on the host by `BatchPlan::new`).
    pub tokens: DevBuf<u32>,
    /// i32 absolute position of each token.
    pub positions: DevBuf<i32>,
    /// i64 cache slot of each token.
    pub slots: DevBuf<i64>,
    /// `[tiles, 3]`: first token, tokens, seq index.
    tiles: DevBuf<i32>,
    num_tiles: usize,
    /// The same in tiles of at most [`MMA_TILE`] tokens, for the tensor-core kernel.
    mma_tiles: DevBuf<i32>,
    num_mma_tiles: usize,
    pub(super) tables: DevBuf<i32>,
    pub(super) table_start: DevBuf<i32>,
    pub(super) block_size: usize,
    /// Each token's index into `table_start` (its sequence chunk).
    pub(super) seq_of: DevBuf<i32>,
    /// The most keys any token sees (its position + 1).
    pub(super) max_keys: usize,
    /// Each sequence chunk's keys: its last token's position + 1 (i32).
    pub(super) chunk_keys: DevBuf<i32>,
}

impl DevPlan {
    /// Uploads `plan` (checked by `BatchPlan::new`) and the batch's token ids.
    pub fn new(gpu: &Gpu, tokens: &[u32], plan: &BatchPlan<'_>) -> CudaResult<Self> {
        let to_i32 = |v: usize, what: &str| {
            i32::try_from(v).map_err(|_| CudaError::Invalid(format!("{what} {v} exceeds i32")))
        };
        let positions = plan
            .positions
            .iter()
            .map(|&p| to_i32(p, "position"))
            .collect::<CudaResult<Vec<_>>>()?;
        let slots: Vec<i64> = plan.slots.iter().map(|&s| s as i64).collect();
        // Seq indices are < T, which the caller bounds by the token budget.
        let seq_of: Vec<i32> = plan.seq_of.iter().map(|&s| s as i32).collect();
        let tiles = tiles_of(plan, ATTN_TILE);
        let mma_tiles = tiles_of(plan, MMA_TILE);
        let mut tables = Vec::new();
        let mut table_start = Vec::with_capacity(plan.tables.len());
        for t in &plan.tables {
            table_start.push(to_i32(tables.len(), "block table offset")?);
            for &b in t.iter() {
                tables.push(to_i32(b as usize, "block id")?);
            }
        }
        let mut chunk_keys = vec![0i32; plan.tables.len()];
        for (&p, &c) in positions.iter().zip(&seq_of) {
            chunk_keys[c as usize] = chunk_keys[c as usize].max(p + 1);
        }
        Ok(Self {
            num_tokens: plan.num_tokens(),
            tokens: gpu.upload(tokens)?,
            positions: gpu.upload(&positions)?,
            slots: gpu.upload(&slots)?,
            num_tiles: tiles.len() / 3,
            tiles: gpu.upload(&tiles)?,
            num_mma_tiles: mma_tiles.len() / 3,
            mma_tiles: gpu.upload(&mma_tiles)?,
            tables: gpu.upload(&tables)?,
            table_start: gpu.upload(&table_start)?,
            block_size: plan.block_size,
            seq_of: gpu.upload(&seq_of)?,
            max_keys: plan.positions.iter().max().map_or(0, |p| p + 1),
            chunk_keys: gpu.upload(&chunk_keys)?,
        })
    }
}

/// [`BatchPlan::tiles`] of at most `tile` tokens as `[first token, tokens, seq index]`.
fn tiles_of(plan: &BatchPlan<'_>, tile: usize) -> Vec<i32> {
    // Token indices and seq indices are < T, which the caller bounds by the token budget.
    plan.tiles(tile)
        .into_iter()
        .flat_map(|(start, end)| {
            [
                start as i32,
                (end - start) as i32,
                plan.seq_of[start] as i32,
            ]
        })
        .collect()
}

pub use crate::kernels::device::AttnShape;
use crate::kernels::device::{KvShape, QkNormForm, QueryTemperature};

/// q/k norm of [`DevKvCache::attend`]: the q and k weights' addresses, eps, the
/// (count, width) of the pieces of q and of k each normalises, and how they apply (RMSNorm
/// before or after RoPE, or a LayerNorm of each head with its own weights).
pub type QkNorms = (u64, u64, f64, [(usize, usize); 2], QkNormForm);

/// The per-head RMSNorm of v (weights `[head_dim]`, eps): Gemma 4's.
pub type VNorm = (u64, f64);

/// Fused projection rows `[q | … | k | v]` (f32, `width` apart, one per batch token): q heads
/// at column 0, k heads at `k_col`, v right after k.
#[derive(Debug, Clone, Copy)]
pub struct QkvRows {
    pub base: u64,
    pub width: usize,
    pub k_col: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// The rows hold q only: the layer attends over keys and values an earlier layer wrote.
    pub shared_kv: bool,
}

/// The softmax's variant as the kernel takes it: scale and head geometry, the sinks' device
/// address (0 = none), the sliding window or the chunk in keys (0 = none), the query
/// temperature, the scores' soft cap (0 = none).
#[derive(Debug, Clone, Copy)]
pub struct DevSoftmax {
    pub shape: AttnShape,
    pub sinks: u64,
    pub window: usize,
    pub chunk: usize,
    pub temperature: Option<QueryTemperature>,
    /// Only the queries at positions below it (DeepSeek Sparse Attention's `index_topk`), or
    /// 0 for all.
    pub dense_below: usize,
    /// Gemma-2's `attn_logit_softcapping` (scores become `cap · tanh(s / cap)`), or 0.
    pub softcap: f32,
}

impl DevSoftmax {
    /// Plain causal attention of `shape`.
    pub fn causal(shape: AttnShape) -> Self {
        Self {
            shape,
            sinks: 0,
            window: 0,
            chunk: 0,
            temperature: None,
            dense_below: 0,
            softcap: 0.0,
        }
    }
}

/// The kernel's argument struct (AttnArgs in attention.cu): same fields, same order, C layout.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AttnArgs {
    q: u64,
    q_stride: i64,
    q_col: i32,
    tiles: u64,
    positions: u64,
    tables: u64,
    table_start: u64,
    heads: i32,
    kv_heads: i32,
    hd: i32,
    block_size: i32,
    kb: i32,
    scale: f32,
    sinks: u64,
    window: i32,
    chunk: i32,
    temp_floor: f32,
    temp_scale: f32,
    temp_offset: f32,
    dense_below: i32,
    softcap: f32,
}

/// K and V of every attention layer.
pub struct DevKvCache {
    k: Vec<WeightData>,
    v: Vec<WeightData>,
    num_blocks: usize,
    block_size: usize,
    kv_dim: usize,
    dtype: WeightDtype,
    /// Whether attention may take the tensor-core kernel ([`mma_kernel`]).
    tensor_cores: bool,
    /// DeepSeek Sparse Attention's index keys and selection, for a model with an indexer.
    pub(super) dsa: Option<DevDsa>,
}

impl DevKvCache {
    /// Allocates (zero-filled) `layers` K and V buffers in `dtype`.
    pub fn new(gpu: &Gpu, shape: KvShape, dtype: WeightDtype) -> CudaResult<Self> {
        let KvShape {
            num_blocks,
            block_size,
            kv_dim,
            ..
        } = shape;
        let per_layer = (shape.per_layer())
            .ok_or_else(|| CudaError::Invalid("KV cache size overflows".into()))?;
        let (k, v) = shape.alloc_layers(|| WeightData::zeros(gpu, dtype, per_layer))?;
        // `HSX_CUDA_ATTENTION=simt`: the CUDA-core kernel for every layer (to compare the two).
        let simt = std::env::var("HSX_CUDA_ATTENTION").is_ok_and(|v| v == "simt");
        let dsa = (shape.index)
            .map(|ix| DevDsa::new(gpu, ix, num_blocks * block_size))
            .transpose()?;
        Ok(Self {
            k,
            v,
            num_blocks,
            block_size,
            kv_dim,
            dtype,
            tensor_cores: !simt && gpu.info.compute_capability >= (8, 0),
            dsa,
        })
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    fn layer(&self, layer: usize) -> CudaResult<(&WeightData, &WeightData)> {
        match (self.k.get(layer), self.v.get(layer)) {
            (Some(k), Some(v)) => Ok((k, v)),
            _ => Err(CudaError::Invalid(format!(
                "KV cache layer {layer} of {}",
                self.k.len()
            ))),
        }
    }

    /// The tokens with a DeepSeek Sparse Attention selection: attention of their q heads
    /// (`q`) over only their selected keys of `layer`, into their rows of `out`.
    pub fn attend_selected(
        &self,
        gpu: &Gpu,
        layer: usize,
        q: (u64, usize),
        shape: AttnShape,
        out: (u64, WeightDtype),
        plan: &DevPlan,
    ) -> CudaResult<()> {
        let (k, v) = self.layer(layer)?;
        check_shape(shape, self.kv_dim)?;
        let dsa = (self.dsa.as_ref())
            .ok_or_else(|| CudaError::Invalid("sparse attention without an indexer".into()))?;
        dsa.attend(gpu, plan, q, (k.ptr(), v.ptr(), self.dtype), shape, out)
    }

    /// Writes the K and V rows of every batch token (f32 columns `k_col..+kv_dim` and
    /// `v_col..+kv_dim` of `src`'s rows) into their slots of `layer`.
    pub fn write(
        &self,
        gpu: &Gpu,
        layer: usize,
        src: Heads,
        k_col: usize,
        v_col: usize,
        plan: &DevPlan,
    ) -> CudaResult<()> {
        let (k, v) = self.layer(layer)?;
        if plan.block_size != self.block_size {
            return Err(CudaError::Invalid(
                "plan and cache block sizes differ".into(),
            ));
        }
        let name = format!("kv_write_{}", suffix(self.dtype));
        let cfg = super::context::rows_cfg(plan.num_tokens, 256)?;
        let (stride, kc, vc) = (src.stride as i64, k_col as i32, v_col as i32);
        let kv_dim = self.kv_dim as i32;
        let slots = plan.slots.ptr();
        launch!(
            gpu,
            &name => "kv_write_f32",
            cfg,
            src.base,
            stride,
            kc,
            vc,
            kv_dim,
            slots,
            k.ptr(),
            v.ptr()
        )
    }

    /// An attention layer over fused projection rows: q/k RMSNorm in place where `norms` =
    /// (q weight, k weight, eps, the (count, width) of q's and k's pieces) is given, v's
    /// per-head RMSNorm where `norms.1` is given, RoPE of
    /// the first `rot` dims at the plan's positions where `rope` = (rot, (inv_freq, scale)) is given,
    /// every token's K/V into `layer`, then the causal attention (`softmax`'s scale, window
    /// and sinks) into `out` = (address, dtype).
    #[allow(clippy::too_many_arguments)]
    pub fn attend(
        &self,
        gpu: &Gpu,
        layer: usize,
        rows: QkvRows,
        norms: (Option<QkNorms>, Option<VNorm>),
        rope: Option<(usize, ops::RopeFreqs)>,
        softmax: DevSoftmax,
        (out, out_dtype): (u64, WeightDtype),
        plan: &DevPlan,
    ) -> CudaResult<()> {
        let hd = rows.head_dim;
        let heads = |col: usize, heads: usize| Heads {
            base: rows.base,
            stride: rows.width,
            col,
            rows: plan.num_tokens,
            heads,
            head_dim: hd,
        };
        let q = heads(0, rows.heads);
        // A layer sharing an earlier layer's keys and values has no k / v columns.
        let k = (!rows.shared_kv).then(|| heads(rows.k_col, rows.kv_heads));
        let v_col = rows.k_col + rows.kv_heads * hd;
        if let Some((vn, eps)) = norms.1.filter(|_| k.is_some()) {
            ops::head_rms_norm(gpu, heads(v_col, rows.kv_heads), vn, eps)?;
        }
        let qk_norm = |after: bool| -> CudaResult<()> {
            let Some((qn, kn, eps, [(qc, qw), (kc, kw)], form)) =
                norms.0.filter(|n| n.4.after_rope() == after)
            else {
                return Ok(());
            };
            let pieces = |x: Heads, heads, head_dim| Heads {
                heads,
                head_dim,
                ..x
            };
            let norm = match form {
                QkNormForm::HeadLayerNorm => ops::head_layer_norm,
                QkNormForm::Rms | QkNormForm::RmsAfterRope => ops::head_rms_norm,
            };
            norm(gpu, pieces(q, qc, qw), qn, eps)?;
            if let Some(k) = k {
                norm(gpu, pieces(k, kc, kw), kn, eps)?;
            }
            Ok(())
        };
        qk_norm(false)?;
        if let Some((rot, freqs)) = rope {
            let pos = plan.positions.ptr();
            match k {
                Some(k) => ops::rope_qk(gpu, q, k, rot, pos, freqs)?,
                None => ops::rope(gpu, q, rot, pos, freqs)?,
            }
        }
        qk_norm(true)?;
        if k.is_some() {
            self.write(gpu, layer, q, rows.k_col, v_col, plan)?;
        }
        self.attention(gpu, layer, q, softmax, out, out_dtype, plan)
    }

    /// `out[t, h * hd..]` (in `out_dtype`: f32 or the cache dtype) = causal attention of the
    /// query heads `q` over positions `0..=pos[t]` (the window's end of them) of token t's
    /// sequence in `layer`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        gpu: &Gpu,
        layer: usize,
        q: Heads,
        softmax: DevSoftmax,
        out: u64,
        out_dtype: WeightDtype,
        plan: &DevPlan,
    ) -> CudaResult<()> {
        let (k, v) = self.layer(layer)?;
        let shape = softmax.shape;
        check_shape(shape, self.kv_dim)?;
        let keys = |n: usize| {
            i32::try_from(n).map_err(|_| CudaError::Invalid(format!("window {n} exceeds i32")))
        };
        let (window, chunk) = (keys(softmax.window)?, keys(softmax.chunk)?);
        if plan.num_tiles == 0 {
            return Ok(());
        }
        let hd = shape.head_dim;
        let (temp_floor, temp_scale, temp_offset) = (softmax.temperature)
            .map_or((0.0, 0.0, 0.0), |t| (t.floor_scale, t.attn_scale, t.offset));
        let mut args = AttnArgs {
            q: q.base,
            q_stride: q.stride as i64,
            q_col: q.col as i32,
            tiles: plan.tiles.ptr(),
            positions: plan.positions.ptr(),
            tables: plan.tables.ptr(),
            table_start: plan.table_start.ptr(),
            heads: shape.heads as i32,
            kv_heads: shape.kv_heads as i32,
            hd: hd as i32,
            block_size: self.block_size as i32,
            kb: 0,
            scale: shape.scale,
            sinks: softmax.sinks,
            window,
            chunk,
            temp_floor,
            temp_scale,
            temp_offset,
            dense_below: keys(softmax.dense_below)?,
            softcap: softmax.softcap,
        };
        let mma = self
            .tensor_cores
            .then(|| mma_kernel(self.dtype, out_dtype, hd, &softmax));
        if let Some(name) = mma.flatten() {
            args.tiles = plan.mma_tiles.ptr();
            let cfg = LaunchConfig {
                grid_dim: (plan.num_mma_tiles as u32, shape.heads as u32, 1),
                block_dim: (mma_threads(hd), 1, 1),
                shared_mem_bytes: 0,
            };
            return launch!(gpu, &name => "attn_mma_h128_bf16", cfg, args, k.ptr(), v.ptr(), out);
        }
        let wide = match hd > super::limits::ATTN_NARROW_HEAD_DIM {
            true => "wide_",
            false => "",
        };
        let name = format!(
            "attention_{wide}{}_{}",
            suffix(self.dtype),
            suffix(out_dtype)
        );
        // Heads of 512 leave room for key blocks of 2 beside their 32 KiB query tile.
        let kb = [32usize, 16, 8, 4, 2]
            .into_iter()
            .find(|&kb| smem_floats(hd, kb) * 4 <= SMEM_LIMIT)
            .unwrap_or(2);
        args.kb = kb as i32;
        let cfg = LaunchConfig {
            grid_dim: (plan.num_tiles as u32, shape.heads as u32, 1),
            block_dim: (ATTN_THREADS, 1, 1),
            shared_mem_bytes: (smem_floats(hd, kb) * 4) as u32,
        };
        launch!(gpu, &name => "attention_f32_f32", cfg, args, k.ptr(), v.ptr(), out)
    }
}

/// The tensor-core kernel (attn_mma_* in attention.cu, sm_80+) for a layer, where it applies:
/// a bf16 cache, a head dim it is built for, no sliding window, chunks or sinks (those
/// layers, and f32 / f16 caches, take the CUDA-core kernel); a query temperature it applies.
fn mma_kernel(
    cache: WeightDtype,
    out: WeightDtype,
    hd: usize,
    softmax: &DevSoftmax,
) -> Option<String> {
    let plain = softmax.window == 0 && softmax.chunk == 0 && softmax.sinks == 0;
    let out = match out {
        WeightDtype::Bf16 | WeightDtype::F32 => suffix(out),
        _ => return None,
    };
    (cache == WeightDtype::Bf16 && plain && MMA_HEAD_DIMS.contains(&hd))
        .then(|| format!("attn_mma_h{hd}_{out}"))
}

/// Shared floats of one attention block: query tile, padded key block, value block.
fn smem_floats(hd: usize, kb: usize) -> usize {
    ATTN_TILE * hd + kb * (hd + 1) + kb * hd
}

fn check_shape(s: AttnShape, kv_dim: usize) -> CudaResult<()> {
    let ok = s.kv_heads > 0
        && s.heads.is_multiple_of(s.kv_heads)
        && s.head_dim > 0
        && s.head_dim <= ATTN_MAX_HD
        && s.kv_heads * s.head_dim == kv_dim
        && s.heads <= 65535;
    if ok {
        Ok(())
    } else {
        Err(CudaError::Invalid(format!(
            "attention shape {s:?} unsupported (kv_dim {kv_dim}, head_dim <= {ATTN_MAX_HD})"
        )))
    }
}

#[cfg(test)]
#[path = "attention_tests.rs"]
mod attention_tests;
