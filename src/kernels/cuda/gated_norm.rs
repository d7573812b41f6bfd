//! Launchers of the hybrid models' gated RMSNorms (Gated DeltaNet's per head, in
//! gated_delta.cu; Mamba-2's per group, in mamba2.cu) and Nemotron-H's relu² (mamba2.cu).

use super::context::{CudaError, CudaResult, Gpu, elems_cfg, launch};
use super::ops::{i32_of, suffix};
use super::recurrent::warps_cfg;
use crate::kernels::device::{NormGate, UnaryAct};
use crate::kernels::dtype::WeightDtype;

/// A gated RMSNorm over `t` rows: input `x` (f32), gate `z` (f32 rows `z_stride` apart),
/// weight `w`, output `out` in `dtype` (device addresses).
#[derive(Debug, Clone, Copy)]
pub struct GatedNormIo {
    pub x: u64,
    pub z: u64,
    pub z_stride: usize,
    pub w: u64,
    pub out: u64,
    pub dtype: WeightDtype,
    pub t: usize,
    pub eps: f64,
}

/// Launches `{kernel}_{dtype}` (Gated DeltaNet's), one warp per (row, head), with the
/// kernel's two geometry arguments `dims`.
fn gated_norm(
    gpu: &Gpu,
    kernel: &str,
    n: GatedNormIo,
    groups: usize,
    dims: (i32, i32),
) -> CudaResult<()> {
    let name = format!("{kernel}_{}", suffix(n.dtype));
    launch!(
        gpu,
        &name => "gdn_gated_norm_f32",
        warps_cfg(n.t * groups)?,
        n.x,
        n.z,
        i32_of(n.z_stride, "z stride")?,
        n.w,
        n.out,
        i32_of(n.t, "tokens")?,
        dims.0,
        dims.1,
        n.eps
    )
}

/// Per-head gated RMSNorm `w·norm(x)·silu(z)` of the GDN output (`nv` heads of `dv`), or
/// `w·norm(x)·sigmoid(z)` (Kimi Delta Attention).
pub fn gdn_gated_norm(
    gpu: &Gpu,
    n: GatedNormIo,
    (nv, dv): (usize, usize),
    gate: NormGate,
) -> CudaResult<()> {
    if n.t == 0 {
        return Ok(());
    }
    let dims = (i32_of(nv, "nv")?, i32_of(dv, "dv")?);
    let kernel = match gate {
        NormGate::Silu => "gdn_gated_norm",
        NormGate::Sigmoid => "gdn_sigmoid_norm",
    };
    gated_norm(gpu, kernel, n, nv, dims)
}

/// Mamba-2's output `n.x` = y (`inner` wide) met by its gate: `mode` 0 `y·silu(z)` then the
/// grouped RMSNorm times `w`, 1 the norm then `·silu(z)`, 2 `y·silu(z)` alone (`w` unread;
/// `group_size` any divisor of `inner`).
pub fn mamba2_gated_norm(
    gpu: &Gpu,
    n: GatedNormIo,
    inner: usize,
    group_size: usize,
    mode: i32,
) -> CudaResult<()> {
    if n.t == 0 {
        return Ok(());
    }
    if group_size == 0 || !inner.is_multiple_of(group_size) {
        return Err(CudaError::Invalid(format!(
            "gated norm group size {group_size} does not divide {inner}"
        )));
    }
    let name = format!("mamba2_gated_norm_{}", suffix(n.dtype));
    launch!(
        gpu,
        &name => "mamba2_gated_norm_f32",
        warps_cfg(n.t * (inner / group_size))?,
        n.x,
        n.z,
        i32_of(n.z_stride, "z stride")?,
        n.w,
        n.out,
        i32_of(n.t, "tokens")?,
        i32_of(inner, "inner")?,
        i32_of(group_size, "group size")?,
        n.eps,
        mode
    )
}

/// `out = f(x)` (an MLP's activation without a gate: Nemotron-H's relu², Apertus' xIELU,
/// StarCoder2's tanh GELU, GPT-NeoX's exact GELU),
/// written in `dtype`.
pub fn unary(
    gpu: &Gpu,
    (x, out): (u64, u64),
    f: UnaryAct,
    dtype: WeightDtype,
    total: usize,
) -> CudaResult<()> {
    if total == 0 {
        return Ok(());
    }
    let n = total as i64;
    match f {
        UnaryAct::Relu2 => {
            let name = format!("relu2_{}", suffix(dtype));
            launch!(gpu, &name => "relu2_f32", elems_cfg(total)?, x, out, n)
        }
        UnaryAct::GeluTanh => {
            let name = format!("gelu_tanh_{}", suffix(dtype));
            launch!(gpu, &name => "gelu_tanh_f32", elems_cfg(total)?, x, out, n)
        }
        UnaryAct::Gelu => {
            let name = format!("gelu_erf_{}", suffix(dtype));
            launch!(gpu, &name => "gelu_erf_f32", elems_cfg(total)?, x, out, n)
        }
        UnaryAct::Xielu(p) => {
            let name = format!("xielu_{}", suffix(dtype));
            let (ap, an, beta, eps) = (p.alpha_p, p.alpha_n, p.beta, p.eps);
            launch!(gpu, &name => "xielu_f32", elems_cfg(total)?, x, out, n, ap, an, beta, eps)
        }
    }
}
