//! Qwen3-Next sparse MoE block on the device (models::moe::MoeBlock): router GEMM, softmax
//! top-k on the device (moe.cu), the routing copied back once per MoE layer to build the
//! per-expert row ranges (tokens ascending inside an expert), a gather of the normed rows into
//! expert order, one cuBLAS GEMM pair per expert that got rows (SwiGLU in between, over all
//! rows at once), the sigmoid-gated shared expert, and the combine that adds the expert outputs
//! in ascending expert order from zero, then the shared expert's, as the CPU does.

use super::super::context::{CudaError, CudaResult, DevBuf, Gpu, launch};
use super::super::gemm::linear;
use super::super::ops::{self, suffix};
use super::super::weights::{DevWeight, UploadError, upload_stacked};
use super::recurrent::{i32_of, warps_cfg};
use crate::models::hybrid_config::MoeSpec;
use crate::models::{WeightDtype, Weights};

/// Largest expert count of `moe_route_f32` (32 lanes × 32 registers).
pub const MAX_EXPERTS: usize = 1024;

struct Expert {
    gate_up: DevWeight,
    down: DevWeight,
}

/// One MoE block's weights.
pub struct MoeDev {
    router: DevWeight,
    experts: Vec<Expert>,
    shared: Expert,
    /// `[hidden]` f32.
    shared_gate: DevBuf<f32>,
    top_k: usize,
    norm_topk_prob: bool,
    inter: usize,
    shared_inter: usize,
    hidden: usize,
}

/// Activation buffers of the MoE blocks, for the token budget.
pub struct MoeScratch {
    logits: DevBuf<f32>,
    ids: DevBuf<i32>,
    weights: DevBuf<f32>,
    /// Normed rows in expert order (GEMM input dtype; f32-sized).
    xp: DevBuf<f32>,
    gu: DevBuf<f32>,
    act: DevBuf<f32>,
    y: DevBuf<f32>,
    shared_gu: DevBuf<f32>,
    shared_act: DevBuf<f32>,
    shared_out: DevBuf<f32>,
    gate: DevBuf<f32>,
}

impl MoeScratch {
    pub fn new(gpu: &Gpu, m: &MoeSpec, hidden: usize, t: usize) -> CudaResult<Self> {
        let n = t * m.top_k;
        Ok(Self {
            logits: gpu.zeros(t * m.num_experts)?,
            ids: gpu.zeros(n)?,
            weights: gpu.zeros(n)?,
            xp: gpu.zeros(n * hidden)?,
            gu: gpu.zeros(n * 2 * m.expert_intermediate)?,
            act: gpu.zeros(n * m.expert_intermediate)?,
            y: gpu.zeros(n * hidden)?,
            shared_gu: gpu.zeros(t * 2 * m.shared_intermediate)?,
            shared_act: gpu.zeros(t * m.shared_intermediate)?,
            shared_out: gpu.zeros(t * hidden)?,
            gate: gpu.zeros(t)?,
        })
    }
}

fn gated_mlp(
    gpu: &Gpu,
    w: &Weights,
    prefix: &str,
    hidden: usize,
    inter: usize,
    dt: WeightDtype,
) -> Result<Expert, UploadError> {
    let p = |s: &str| (format!("{prefix}.{s}.weight"), inter);
    Ok(Expert {
        gate_up: upload_stacked(gpu, w, &[p("gate_proj"), p("up_proj")], hidden, dt)?,
        down: upload_stacked(
            gpu,
            w,
            &[(format!("{prefix}.down_proj.weight"), hidden)],
            inter,
            dt,
        )?,
    })
}

/// Bytes per element of a GEMM input in `dtype`.
fn elem(dtype: WeightDtype) -> u64 {
    match dtype {
        WeightDtype::F32 => 4,
        WeightDtype::Bf16 | WeightDtype::F16 => 2,
    }
}

impl MoeDev {
    /// `prefix` = `...layers.{i}.mlp`; experts stored one tensor each (on-disk layout).
    pub fn load(
        gpu: &Gpu,
        w: &Weights,
        prefix: &str,
        hidden: usize,
        m: &MoeSpec,
        dt: WeightDtype,
    ) -> Result<Self, UploadError> {
        let experts = (0..m.num_experts)
            .map(|e| {
                gated_mlp(
                    gpu,
                    w,
                    &format!("{prefix}.experts.{e}"),
                    hidden,
                    m.expert_intermediate,
                    dt,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let router = upload_stacked(
            gpu,
            w,
            &[(format!("{prefix}.gate.weight"), m.num_experts)],
            hidden,
            dt,
        )?;
        let gate = w.tensor(&format!("{prefix}.shared_expert_gate.weight"), &[1, hidden])?;
        Ok(Self {
            router,
            experts,
            shared: gated_mlp(
                gpu,
                w,
                &format!("{prefix}.shared_expert"),
                hidden,
                m.shared_intermediate,
                dt,
            )?,
            shared_gate: gpu.upload(&gate)?,
            top_k: m.top_k,
            norm_topk_prob: m.norm_topk_prob,
            inter: m.expert_intermediate,
            shared_inter: m.shared_intermediate,
            hidden,
        })
    }

    /// `out[T, hidden]` (f32) for the normed rows `x` (GEMM input dtype). Waits for the
    /// compute stream once (the routing decides the per-expert GEMM sizes).
    pub fn forward(
        &self,
        gpu: &Gpu,
        x: u64,
        t: usize,
        s: &MoeScratch,
        dtype: WeightDtype,
        out: u64,
    ) -> CudaResult<()> {
        if t == 0 {
            return Ok(());
        }
        let (h, k, e_count) = (self.hidden, self.top_k, self.experts.len());
        let n = t * k;
        s.xp.check(n * h, "MoE rows beyond the token budget")?;
        linear(gpu, x, &self.router, s.logits.ptr(), t)?;
        launch!(
            gpu,
            "moe_route_f32",
            warps_cfg(t)?,
            s.logits.ptr(),
            s.ids.ptr(),
            s.weights.ptr(),
            i32_of(t, "tokens")?,
            i32_of(e_count, "experts")?,
            i32_of(k, "top_k")?,
            i32::from(self.norm_topk_prob)
        )?;
        let ids = gpu.download(&s.ids, n)?;
        let wts = gpu.download(&s.weights, n)?;
        let route = Routing::build(&ids, &wts, t, k, e_count)?;
        let rows = gpu.upload(&route.rows)?;
        let tok_pos = gpu.upload(&route.tok_pos)?;
        let tok_w = gpu.upload(&route.tok_w)?;
        let gather = if dtype == WeightDtype::F32 {
            "moe_gather_rows_f32"
        } else {
            "moe_gather_rows_u16"
        };
        launch!(
            gpu,
            gather,
            super::super::context::elems_cfg(n * h)?,
            x,
            rows.ptr(),
            s.xp.ptr(),
            i32_of(n, "rows")?,
            i32_of(h, "hidden")?
        )?;
        let (inter, es) = (self.inter, elem(dtype));
        for (e, expert) in self.experts.iter().enumerate() {
            let (off, cnt) = (route.offsets[e], route.offsets[e + 1] - route.offsets[e]);
            if cnt == 0 {
                continue;
            }
            let xin = s.xp.ptr() + (off * h) as u64 * es;
            linear(
                gpu,
                xin,
                &expert.gate_up,
                s.gu.ptr_at(off * 2 * inter, cnt * 2 * inter)?,
                cnt,
            )?;
        }
        ops::silu_mul(gpu, s.gu.ptr(), s.act.ptr(), dtype, n, inter)?;
        for (e, expert) in self.experts.iter().enumerate() {
            let (off, cnt) = (route.offsets[e], route.offsets[e + 1] - route.offsets[e]);
            if cnt == 0 {
                continue;
            }
            let ain = s.act.ptr() + (off * inter) as u64 * es;
            linear(gpu, ain, &expert.down, s.y.ptr_at(off * h, cnt * h)?, cnt)?;
        }
        let si = self.shared_inter;
        linear(gpu, x, &self.shared.gate_up, s.shared_gu.ptr(), t)?;
        ops::silu_mul(gpu, s.shared_gu.ptr(), s.shared_act.ptr(), dtype, t, si)?;
        linear(
            gpu,
            s.shared_act.ptr(),
            &self.shared.down,
            s.shared_out.ptr(),
            t,
        )?;
        let gate_name = format!("moe_shared_gate_{}", suffix(dtype));
        launch!(
            gpu,
            &gate_name,
            warps_cfg(t)?,
            x,
            self.shared_gate.ptr(),
            s.gate.ptr(),
            i32_of(t, "tokens")?,
            i32_of(h, "hidden")?
        )?;
        launch!(
            gpu,
            "moe_combine_f32",
            super::super::context::elems_cfg(t * h)?,
            s.y.ptr(),
            tok_pos.ptr(),
            tok_w.ptr(),
            s.shared_out.ptr(),
            s.gate.ptr(),
            out,
            i32_of(t, "tokens")?,
            i32_of(k, "top_k")?,
            i32_of(h, "hidden")?
        )
    }
}

/// The routing of one MoE layer in expert order.
#[derive(Debug, PartialEq)]
pub(crate) struct Routing {
    /// Token of each expert-ordered row.
    pub rows: Vec<i32>,
    /// Expert e's rows are `offsets[e]..offsets[e + 1]`.
    pub offsets: Vec<usize>,
    /// `[T, k]`: row of token t's i-th expert, ascending expert order.
    pub tok_pos: Vec<i32>,
    /// `[T, k]`: the matching routing weights.
    pub tok_w: Vec<f32>,
}

impl Routing {
    /// From the device's `ids` / `wts` (`[T, k]`, ids in descending-probability order).
    pub(crate) fn build(
        ids: &[i32],
        wts: &[f32],
        t: usize,
        k: usize,
        experts: usize,
    ) -> CudaResult<Self> {
        let mut counts = vec![0usize; experts];
        for &e in ids {
            let e = usize::try_from(e)
                .ok()
                .filter(|&e| e < experts)
                .ok_or_else(|| CudaError::Invalid(format!("router chose expert {e}")))?;
            counts[e] += 1;
        }
        let mut offsets = Vec::with_capacity(experts + 1);
        offsets.push(0);
        for c in &counts {
            offsets.push(offsets.last().copied().unwrap_or(0) + c);
        }
        let mut fill = offsets[..experts].to_vec();
        let mut rows = vec![0i32; t * k];
        let (mut tok_pos, mut tok_w) = (Vec::with_capacity(t * k), Vec::with_capacity(t * k));
        let mut mine: Vec<(usize, usize, f32)> = Vec::with_capacity(k);
        for tok in 0..t {
            mine.clear();
            for i in 0..k {
                let e = ids[tok * k + i] as usize;
                let pos = fill[e];
                fill[e] += 1;
                rows[pos] = i32_of(tok, "token")?;
                mine.push((e, pos, wts[tok * k + i]));
            }
            mine.sort_by_key(|&(e, _, _)| e);
            for &(_, pos, w) in &mine {
                tok_pos.push(i32_of(pos, "row")?);
                tok_w.push(w);
            }
        }
        Ok(Self {
            rows,
            offsets,
            tok_pos,
            tok_w,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_orders_rows_by_expert_then_token() {
        // 3 tokens, top-2 of 4 experts.
        let ids = [2, 0, 0, 3, 2, 1];
        let wts = [0.6, 0.4, 0.7, 0.3, 0.5, 0.5];
        let r = Routing::build(&ids, &wts, 3, 2, 4).unwrap();
        assert_eq!(r.offsets, vec![0, 2, 3, 5, 6]);
        // expert 0: tokens 0, 1; expert 1: token 2; expert 2: tokens 0, 2; expert 3: token 1
        assert_eq!(r.rows, vec![0, 1, 2, 0, 2, 1]);
        // token 0: experts 0 (row 0, 0.4), 2 (row 3, 0.6)
        assert_eq!(&r.tok_pos[..2], &[0, 3]);
        assert_eq!(&r.tok_w[..2], &[0.4, 0.6]);
        assert_eq!(&r.tok_pos[2..4], &[1, 5]);
        assert_eq!(&r.tok_pos[4..], &[2, 4]);
        assert!(Routing::build(&[4, 0], &[0.5, 0.5], 1, 2, 4).is_err());
    }
}
