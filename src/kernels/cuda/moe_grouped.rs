//! Nemotron 3's MoE on the device (moe_grouped.cu): the group-limited router, its
//! choice copied back and planned on the host like [`super::moe`]'s, and the weighted sum of
//! the routed experts' outputs written in the next GEMM's input dtype; plus the f32 -> GEMM
//! input cast of a latent projection. Each op checks its operands on the host first.

use super::context::{CudaError, CudaResult, DevBuf, Gpu, launch, row_tiles_cfg};
use super::device::CudaDevice;
use super::device_types::{CudaBuf, check_len, invalid};
use super::ops::{self, i32_of, suffix};
use super::recurrent::warps_cfg;
use crate::kernels::device::{DevResult, DeviceError};
use crate::kernels::dtype::WeightDtype;
use crate::kernels::routing::{GroupRank, GroupedTopK, Routing};

/// Largest expert count of `moe_route_grouped_f32` (32 lanes × 32 registers).
pub const MAX_EXPERTS: usize = super::limits::MAX_EXPERTS;
/// Largest group count (one bit per group in a 32-bit mask).
pub const MAX_GROUPS: usize = super::limits::MAX_EXPERT_GROUPS;

/// The group-limited top-k of `logits` `[t, experts]` with the choice `bias` into `ids` (i32)
/// and `weights` (f32), both `[t, top_k]`.
pub fn route_grouped(
    gpu: &Gpu,
    (logits, bias): (u64, u64),
    (ids, weights): (u64, u64),
    (t, experts): (usize, usize),
    r: &GroupedTopK,
) -> CudaResult<()> {
    if t == 0 {
        return Ok(());
    }
    r.group_size(experts).map_err(CudaError::Invalid)?;
    if experts > MAX_EXPERTS || r.n_group > MAX_GROUPS {
        return Err(CudaError::Invalid(format!(
            "{experts} experts in {} groups (at most {MAX_EXPERTS} in {MAX_GROUPS})",
            r.n_group
        )));
    }
    launch!(
        gpu,
        "moe_route_grouped_f32",
        warps_cfg(t)?,
        logits,
        bias,
        ids,
        weights,
        i32_of(t, "tokens")?,
        i32_of(experts, "experts")?,
        i32_of(r.top_k, "top_k")?,
        i32_of(r.n_group, "n_group")?,
        i32_of(r.topk_group, "topk_group")?,
        i32::from(r.renorm),
        r.renorm_eps,
        r.scale,
        r.score.code(),
        i32::from(r.group_rank == GroupRank::Best)
    )
}

/// `out[t] = Σ_i tok_w[t, i] · y[tok_pos[t, i]]` (i ascending, from zero) for `t` rows of `h`,
/// `out` in `dtype`.
pub fn weighted_sum(
    gpu: &Gpu,
    (y, tok_pos, tok_w, out): (u64, u64, u64, u64),
    dtype: WeightDtype,
    (t, k, h): (usize, usize, usize),
) -> CudaResult<()> {
    if t * h == 0 {
        return Ok(());
    }
    let name = format!("moe_weighted_sum_{}", suffix(dtype));
    launch!(
        gpu,
        &name => "moe_weighted_sum_f32",
        row_tiles_cfg(t, h, 256)?,
        y,
        tok_pos,
        tok_w,
        out,
        i32_of(t, "tokens")?,
        i32_of(k, "top_k")?,
        i32_of(h, "hidden")?
    )
}

impl CudaDevice {
    /// The router on the device, the choice copied back (one wait per MoE layer: the routing
    /// sizes the expert GEMMs) and planned on the host.
    pub(super) fn moe_route_grouped_op(
        &self,
        logits: &CudaBuf,
        bias: &DevBuf<f32>,
        r: &GroupedTopK,
    ) -> DevResult<Routing> {
        logits.f32("moe router logits")?;
        let (g, t, e) = (&self.gpu, logits.rows(), logits.width());
        check_len(bias, e, "moe e_score_correction_bias")?;
        let n = t * r.top_k;
        let ids: DevBuf<i32> = g.zeros(n)?;
        let wts: DevBuf<f32> = g.zeros(n)?;
        let io = (ids.ptr(), wts.ptr());
        route_grouped(g, (logits.ptr(), bias.ptr()), io, (t, e), r)?;
        let (ids, wts) = (g.download(&ids, n)?, g.download(&wts, n)?);
        Routing::build(&ids, &wts, t, r.top_k, e).map_err(DeviceError::Invalid)
    }

    pub(super) fn moe_weighted_sum_op(
        &self,
        y: &CudaBuf,
        routing: &Routing,
        t: usize,
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        y.f32("moe expert outputs")?;
        let h = y.width();
        let k = routing.tok_pos.len().checked_div(t).unwrap_or(0);
        if routing.tok_pos.len() != t * k || routing.tok_w.len() != t * k {
            let n = routing.tok_pos.len();
            return invalid(format!("moe weighted sum of {n} routes over {t} tokens"));
        }
        if let Some(r) = routing
            .tok_pos
            .iter()
            .find(|&&r| r < 0 || r as usize >= y.rows())
        {
            return invalid(format!("moe weighted sum: row {r} of {}", y.rows()));
        }
        out.set(t, h, "moe weighted sum")?;
        let g = &self.gpu;
        let (tok_pos, tok_w) = (g.upload(&routing.tok_pos)?, g.upload(&routing.tok_w)?);
        let io = (y.ptr(), tok_pos.ptr(), tok_w.ptr(), out.ptr());
        Ok(weighted_sum(g, io, out.dtype(), (t, k, h))?)
    }

    pub(super) fn cast_op(&self, x: &CudaBuf, out: &mut CudaBuf) -> DevResult<()> {
        x.f32("cast input")?;
        out.set(x.rows(), x.width(), "cast")?;
        Ok(ops::cast(
            &self.gpu,
            x.ptr(),
            out.ptr(),
            out.dtype(),
            x.len(),
        )?)
    }
}

#[cfg(all(test, feature = "cuda"))]
mod tests {
    use super::super::context::kernel_names_for_test;
    use super::super::nvrtc::SOURCES;

    /// Every kernel the launchers call is an entry point of a loaded source.
    #[test]
    fn launched_grouped_moe_kernels_exist() {
        let all: Vec<String> = SOURCES
            .iter()
            .flat_map(|(_, src)| kernel_names_for_test(src))
            .collect();
        let mut wanted = vec!["moe_route_grouped_f32".to_string()];
        wanted.extend(["f32", "bf16", "f16"].map(|d| format!("moe_weighted_sum_{d}")));
        for w in &wanted {
            assert!(all.contains(w), "kernel `{w}` is launched but not defined");
        }
    }
}
