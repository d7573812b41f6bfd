//! DeepSeek Sparse Attention on the device (dsa.cu; the rule: `crate::kernels::dsa`): the
//! indexer keys' cache beside the KV cache, the step's selection, and the attention over the
//! selected keys. The selection stays on the device until the next indexer layer replaces it
//! (GLM-5's shared layers attend over it too). [`CudaDevice`]'s `dsa_select` op checks its
//! operands here before the launchers run.

use super::context::{CudaError, CudaResult, DevBuf, Gpu, LaunchConfig, launch};
use super::device::CudaDevice;
use super::device_ops::check_rows;
use super::device_types::{CudaBuf, CudaRope, CudaStep, check_len, invalid};
use super::kv_cache::DevKvCache;
use super::kv_cache::{AttnShape, DevPlan};
use super::ops::{i32_of, suffix};
use crate::kernels::device::{DevResult, DeviceError, DsaCall};
use crate::kernels::dsa::IndexShape;
use crate::kernels::dtype::WeightDtype;

/// `index_head_dim` at most (DSA_MAX_DIM in dsa.cu).
pub(super) const MAX_DIM: usize = 512;
/// `(heads + 1) · rotated dims` at most (DSA_MAX_ROTATED).
const MAX_ROTATED: usize = 8192;
/// Scores held at once, `[tokens, keys]`: longer steps score their tokens in groups.
pub(super) const MAX_SCORES: usize = 1 << 26;
/// Dynamic shared memory the sparse attention may ask for (the keys' weights and slots).
pub(super) const MAX_SPARSE_SMEM: usize = super::kv_cache::SMEM_LIMIT;

/// The sparse attention's dynamic shared memory for rows of `topk` keys (attn_sparse_t in
/// dsa.cu: the keys' weights, rounded up to an even count, then their slots).
pub(super) fn sparse_smem(topk: usize) -> usize {
    4 * (topk + topk % 2) + 8 * topk
}

/// The indexer keys (one f32 buffer `[slots, dim]` per indexer layer) and the selection.
pub struct DevDsa {
    pub(super) keys: Vec<DevBuf<f32>>,
    pub(super) dim: usize,
    pub(super) scores: DevBuf<f32>,
    pub(super) sel: DevBuf<i32>,
    pub(super) count: DevBuf<i32>,
    /// Tokens and `topk` (keys a row of `sel` holds) of the selection in `sel` / `count`.
    pub(super) selected: Option<(usize, usize)>,
    /// QSA's block keys `[chunks, blocks, dim]` and each token's chosen blocks.
    pub(super) pooled: DevBuf<f32>,
    pub(super) blocks: DevBuf<i32>,
}

/// One indexer layer's operands: device addresses of q `[T, heads · dim]`, k `[T, dim]`, the
/// head weights `[T, heads]` (f32), the RoPE frequencies and `k_norm`'s weight and bias.
pub struct IndexerArgs {
    pub layer: usize,
    pub q: u64,
    pub k: u64,
    pub w: u64,
    pub heads: usize,
    pub rot: usize,
    pub interleave: bool,
    pub rope: (u64, f32),
    pub norm: (u64, u64, f32),
    pub scales: (f32, f32),
    pub topk: usize,
}

impl DevDsa {
    pub fn new(gpu: &Gpu, shape: IndexShape, slots: usize) -> CudaResult<Self> {
        let len = slots
            .checked_mul(shape.dim)
            .ok_or_else(|| CudaError::Invalid("index-key cache size overflows".into()))?;
        Ok(Self {
            keys: (0..shape.layers)
                .map(|_| gpu.zeros(len))
                .collect::<CudaResult<_>>()?,
            dim: shape.dim,
            scores: gpu.zeros(1)?,
            sel: gpu.zeros(1)?,
            count: gpu.zeros(1)?,
            selected: None,
            pooled: gpu.zeros(1)?,
            blocks: gpu.zeros(1)?,
        })
    }

    pub fn shape(&self) -> IndexShape {
        IndexShape {
            layers: self.keys.len(),
            dim: self.dim,
        }
    }

    /// q and k prepared in place, the step's keys cached, each token's selection made.
    pub fn select(&mut self, gpu: &Gpu, plan: &DevPlan, a: &IndexerArgs) -> CudaResult<()> {
        let (t, d, heads) = (plan.num_tokens, self.dim, a.heads);
        let cache = (self.keys.get(a.layer))
            .ok_or_else(|| CudaError::Invalid(format!("indexer layer {}", a.layer)))?;
        if d > MAX_DIM || (heads + 1) * a.rot > MAX_ROTATED || a.topk == 0 {
            return Err(CudaError::Invalid(format!(
                "indexer of {heads} heads of {d} ({} rotated), topk {}: the kernels take \
                 dims <= {MAX_DIM}, (heads + 1) · rotated <= {MAX_ROTATED}",
                a.rot, a.topk
            )));
        }
        self.selected = None;
        if t == 0 {
            return Ok(());
        }
        let (dim, rot) = (i32_of(d, "index dim")?, i32_of(a.rot, "rotated dims")?);
        let rows = |grid: (u32, u32), threads: u32| LaunchConfig {
            grid_dim: (grid.0, grid.1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let t32 = u32::try_from(t).map_err(|_| CudaError::Invalid("tokens exceed u32".into()))?;
        launch!(
            gpu,
            "dsa_prepare",
            rows((t32, 1), 128),
            a.q,
            a.k,
            plan.positions.ptr(),
            plan.slots.ptr(),
            cache.ptr(),
            a.rope.0,
            a.rope.1,
            a.norm.0,
            a.norm.1,
            a.norm.2,
            i32_of(heads, "indexer heads")?,
            dim,
            rot,
            i32::from(a.interleave)
        )?;
        grow(gpu, &mut self.sel, t * a.topk)?;
        grow(gpu, &mut self.count, t)?;
        let keys = plan.max_keys;
        if keys <= a.topk {
            // Every token keeps all its keys.
            gpu.memset_zero(self.count.ptr(), t * 4)?;
        } else {
            let group = (MAX_SCORES / keys).clamp(1, t);
            grow(gpu, &mut self.scores, group * keys)?;
            for t0 in (0..t).step_by(group) {
                let g = group.min(t - t0) as u32;
                let key_blocks = u32::try_from(keys.div_ceil(128))
                    .map_err(|_| CudaError::Invalid("keys exceed the grid".into()))?;
                let (keys32, t0) = (i32_of(keys, "keys")?, i32_of(t0, "token")?);
                launch!(
                    gpu,
                    "dsa_scores",
                    rows((g, key_blocks), 128),
                    a.q,
                    a.w,
                    cache.ptr(),
                    plan.positions.ptr(),
                    plan.seq_of.ptr(),
                    plan.tables.ptr(),
                    plan.table_start.ptr(),
                    i32_of(plan.block_size, "block size")?,
                    i32_of(heads, "indexer heads")?,
                    dim,
                    a.scales.0,
                    a.scales.1,
                    self.scores.ptr(),
                    keys32,
                    t0
                )?;
                launch!(
                    gpu,
                    "dsa_topk",
                    rows((g, 1), 256),
                    self.scores.ptr(),
                    plan.positions.ptr(),
                    keys32,
                    i32_of(a.topk, "index_topk")?,
                    self.sel.ptr(),
                    self.count.ptr(),
                    t0
                )?;
            }
        }
        self.selected = Some((t, a.topk));
        Ok(())
    }

    /// `out` rows of the tokens with a selection: attention of the q heads (`q` rows `stride`
    /// floats apart) over their selected keys of the cache layer `(k, v)` (in `cache`'s dtype).
    #[allow(clippy::too_many_arguments)]
    pub fn attend(
        &self,
        gpu: &Gpu,
        plan: &DevPlan,
        (q, stride): (u64, usize),
        (k, v, cache): (u64, u64, WeightDtype),
        shape: AttnShape,
        (out, out_dtype): (u64, WeightDtype),
    ) -> CudaResult<()> {
        let Some((t, topk)) = self.selected.filter(|s| s.0 == plan.num_tokens) else {
            return Err(CudaError::Invalid(
                "sparse attention without this step's selection".into(),
            ));
        };
        if t == 0 || plan.max_keys <= topk {
            return Ok(());
        }
        let smem = sparse_smem(topk);
        if smem > MAX_SPARSE_SMEM {
            return Err(CudaError::Invalid(format!(
                "index_topk {topk}: the sparse attention holds at most {} keys",
                MAX_SPARSE_SMEM / 12
            )));
        }
        let name = format!("attn_sparse_{}_{}", suffix(cache), suffix(out_dtype));
        let cfg = LaunchConfig {
            grid_dim: (t as u32, shape.heads as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        launch!(
            gpu,
            &name => "attn_sparse_f32_f32",
            cfg,
            q,
            stride as i64,
            k,
            v,
            self.sel.ptr(),
            self.count.ptr(),
            plan.seq_of.ptr(),
            plan.tables.ptr(),
            plan.table_start.ptr(),
            i32_of(plan.block_size, "block size")?,
            i32_of(shape.heads, "heads")?,
            i32_of(shape.kv_heads, "kv heads")?,
            i32_of(shape.head_dim, "head dim")?,
            shape.scale,
            i32_of(topk, "index_topk")?,
            out
        )
    }
}

impl CudaDevice {
    /// DeepSeek Sparse Attention's indexer ([`crate::kernels::Device::dsa_select`]).
    pub(super) fn dsa_select_op(
        &self,
        step: &CudaStep<'_>,
        kv: &mut DevKvCache,
        call: &DsaCall<'_, Self>,
        (q, k, w): (&mut CudaBuf, &mut CudaBuf, &CudaBuf),
    ) -> DevResult<()> {
        call.check().map_err(DeviceError::Invalid)?;
        let plan = &step.plan;
        let (heads, d) = (call.heads, call.head_dim);
        let names = ["indexer q", "indexer k", "indexer weights"];
        let inputs = [&*q, &*k, w].into_iter().zip(call.widths()).zip(names);
        check_indexer_inputs(plan.num_tokens, inputs, call.rope)?;
        let (rope, rot) = call.rope;
        let (nw, nb, eps) = call.k_norm;
        check_len(nw, d, "indexer k_norm weight")?;
        check_len(nb, d, "indexer k_norm bias")?;
        let dsa = kv.dsa.as_mut().filter(|x| call.fits(x.shape()));
        let Some(dsa) = dsa else {
            return invalid(format!(
                "dsa_select: no index cache for indexer layer {} of {d} dims",
                call.index_layer
            ));
        };
        let args = IndexerArgs {
            layer: call.index_layer,
            q: q.ptr(),
            k: k.ptr(),
            w: w.ptr(),
            heads,
            rot,
            interleave: call.interleave,
            rope: (rope.inv_freq.ptr(), rope.scale),
            norm: (nw.ptr(), nb.ptr(), eps as f32),
            scales: (call.score_scale(), call.weight_scale()),
            topk: call.topk,
        };
        Ok(dsa.select(&self.gpu, plan, &args)?)
    }
}

/// Each indexer input (buffer, width, name) is an f32 buffer of the step's `t` rows of its
/// width, and the RoPE table has the rotated dims' frequencies (DSA's and QSA's).
pub(super) fn check_indexer_inputs<'b>(
    t: usize,
    inputs: impl IntoIterator<Item = ((&'b CudaBuf, usize), &'b str)>,
    (rope, rot): (&CudaRope, usize),
) -> DevResult<()> {
    for ((b, width), what) in inputs {
        b.f32(what)?;
        check_rows(b.rows(), t, what)?;
        if b.width() != width {
            return invalid(format!("{what} of width {} for {width}", b.width()));
        }
    }
    if rot / 2 > rope.inv_freq.len() {
        return invalid(format!(
            "{rot} rotary dims with {} frequencies",
            rope.inv_freq.len()
        ));
    }
    Ok(())
}

/// `buf` holds at least `len` values (reallocated, unzeroed contents, when shorter).
pub(super) fn grow<T: bytemuck::Pod>(gpu: &Gpu, buf: &mut DevBuf<T>, len: usize) -> CudaResult<()> {
    if buf.len() < len {
        *buf = gpu.zeros(len)?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "dsa_tests.rs"]
mod tests;
