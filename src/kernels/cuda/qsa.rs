//! Qwen4-Exp's QSA on the device (the qsa_* kernels of dsa.cu; the rule:
//! `crate::kernels::qsa`): q prepared and the raw keys cached, each chunk's block keys pooled,
//! each token's block scores and its keys, into the selection DeepSeek Sparse Attention's
//! sparse attention reads ([`DevDsa::attend`]).

use super::context::{CudaError, CudaResult, Gpu, LaunchConfig, launch};
use super::device::CudaDevice;
use super::device_types::{CudaBuf, CudaStep, check_len, invalid};
use super::dsa::{
    DevDsa, MAX_DIM, MAX_SCORES, MAX_SPARSE_SMEM, check_indexer_inputs, grow, sparse_smem,
};
use super::kv_cache::{DevKvCache, DevPlan};
use super::ops::i32_of;
use crate::kernels::device::{DevResult, DeviceError, QsaCall};

/// Indexer heads at most (QSA_MAX_HEADS in dsa.cu).
const MAX_HEADS: usize = 128;

/// One attention layer's indexer operands: device addresses of q `[T, heads · dim]` and the
/// raw keys `[T, dim]` (f32), the RoPE frequencies, the norms' `1 + weight`.
pub struct QsaArgs {
    pub layer: usize,
    pub q: u64,
    pub k: u64,
    pub heads: usize,
    pub rot: usize,
    pub rope: (u64, f32),
    /// q's and the block keys' norm weights, eps.
    pub norms: (u64, u64, f32),
    /// Blocks kept and keys per block.
    pub blocks: usize,
    pub ratio: usize,
}

impl QsaArgs {
    /// Keys a token past the dense length keeps at most (a row of the selection).
    fn cap(&self) -> usize {
        (self.blocks + 1) * self.ratio - 1
    }
}

fn grid(g: (u32, u32), threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (g.0, g.1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn u32_of(v: usize, what: &str) -> CudaResult<u32> {
    u32::try_from(v).map_err(|_| CudaError::Invalid(format!("{what} {v} exceeds the grid")))
}

impl DevDsa {
    /// q prepared in place, the step's raw keys cached, each token's selection made.
    pub fn qsa_select(&mut self, gpu: &Gpu, plan: &DevPlan, a: &QsaArgs) -> CudaResult<()> {
        let (t, d, heads) = (plan.num_tokens, self.dim, a.heads);
        let cache = (self.keys.get(a.layer))
            .ok_or_else(|| CudaError::Invalid(format!("indexer layer {}", a.layer)))?;
        if d > MAX_DIM || heads > MAX_HEADS || sparse_smem(a.cap()) > MAX_SPARSE_SMEM {
            return Err(CudaError::Invalid(format!(
                "QSA indexer of {heads} heads of {d}, {} keys kept: the kernels take dims <= \
                 {MAX_DIM}, heads <= {MAX_HEADS}, at most {} keys",
                a.cap(),
                MAX_SPARSE_SMEM / 12
            )));
        }
        self.selected = None;
        if t == 0 {
            return Ok(());
        }
        let (dim, rot) = (i32_of(d, "index dim")?, i32_of(a.rot, "rotated dims")?);
        let ratio = i32_of(a.ratio, "compress ratio")?;
        launch!(
            gpu,
            "qsa_prepare",
            grid((u32_of(t, "tokens")?, 1), 128),
            a.q,
            a.k,
            plan.positions.ptr(),
            plan.slots.ptr(),
            cache.ptr(),
            a.rope.0,
            a.rope.1,
            a.norms.0,
            a.norms.2,
            i32_of(heads, "indexer heads")?,
            dim,
            rot
        )?;
        grow(gpu, &mut self.sel, t * a.cap())?;
        grow(gpu, &mut self.count, t)?;
        self.selected = Some((t, a.cap()));
        let max_blocks = plan.max_keys / a.ratio;
        if max_blocks <= a.blocks {
            // Every token keeps all its keys.
            return gpu.memset_zero(self.count.ptr(), t * 4);
        }
        let chunks = plan.table_start.len();
        grow(gpu, &mut self.pooled, chunks * max_blocks * d)?;
        let mb = i32_of(max_blocks, "blocks")?;
        launch!(
            gpu,
            "qsa_pool",
            grid(
                (u32_of(max_blocks, "blocks")?, u32_of(chunks, "chunks")?),
                128
            ),
            cache.ptr(),
            plan.chunk_keys.ptr(),
            plan.tables.ptr(),
            plan.table_start.ptr(),
            i32_of(plan.block_size, "block size")?,
            a.norms.1,
            a.norms.2,
            a.rope.0,
            a.rope.1,
            dim,
            rot,
            ratio,
            mb,
            self.pooled.ptr()
        )?;
        let group = (MAX_SCORES / max_blocks).clamp(1, t);
        grow(gpu, &mut self.scores, group * max_blocks)?;
        grow(gpu, &mut self.blocks, group * a.blocks)?;
        let score_blocks = u32_of(max_blocks.div_ceil(128), "blocks")?;
        for t0 in (0..t).step_by(group) {
            let g = group.min(t - t0) as u32;
            let t0 = i32_of(t0, "token")?;
            launch!(
                gpu,
                "qsa_scores",
                grid((g, score_blocks), 128),
                a.q,
                self.pooled.ptr(),
                plan.positions.ptr(),
                plan.seq_of.ptr(),
                i32_of(heads, "indexer heads")?,
                dim,
                ratio,
                mb,
                self.scores.ptr(),
                t0
            )?;
            launch!(
                gpu,
                "qsa_topk",
                grid((g, 1), 256),
                self.scores.ptr(),
                plan.positions.ptr(),
                mb,
                i32_of(a.blocks, "blocks kept")?,
                ratio,
                i32_of(a.cap(), "keys kept")?,
                self.blocks.ptr(),
                self.sel.ptr(),
                self.count.ptr(),
                t0
            )?;
        }
        Ok(())
    }
}

impl CudaDevice {
    /// Qwen4-Exp's QSA indexer ([`crate::kernels::Device::qsa_select`]).
    pub(super) fn qsa_select_op(
        &self,
        step: &CudaStep<'_>,
        kv: &mut DevKvCache,
        call: &QsaCall<'_, Self>,
        (q, k): (&mut CudaBuf, &CudaBuf),
    ) -> DevResult<()> {
        call.check().map_err(DeviceError::Invalid)?;
        let plan = &step.plan;
        let d = call.head_dim;
        let inputs = [&*q, k].into_iter().zip(call.widths());
        let names = ["indexer q", "indexer k"];
        check_indexer_inputs(plan.num_tokens, inputs.zip(names), call.rope)?;
        let (rope, rot) = call.rope;
        let (qn, kn, eps) = call.norms;
        check_len(qn, d, "indexer q norm")?;
        check_len(kn, d, "indexer k norm")?;
        let Some(dsa) = kv.dsa.as_mut().filter(|x| call.fits(x.shape())) else {
            return invalid(format!(
                "qsa_select: no index cache for layer {} of {d} dims",
                call.index_layer
            ));
        };
        let args = QsaArgs {
            layer: call.index_layer,
            q: q.ptr(),
            k: k.ptr(),
            heads: call.heads,
            rot,
            rope: (rope.inv_freq.ptr(), rope.scale),
            norms: (qn.ptr(), kn.ptr(), eps as f32),
            blocks: call.blocks(),
            ratio: call.ratio,
        };
        Ok(dsa.qsa_select(&self.gpu, plan, &args)?)
    }
}

#[cfg(test)]
#[path = "qsa_tests.rs"]
mod tests;
