//! Launchers of the sparse-MoE kernels (moe.cu): the router's softmax top-k, the row gather
//! into expert order, the shared expert's gate and the combine. The expert GEMMs in between
//! are plain [`super::gemm::linear`] calls on each expert's row range; the routing itself is
//! planned on the host ([`crate::kernels::routing::Routing`]) so that every device sums a
//! token's experts in the same order.

use super::context::{CudaError, CudaResult, Gpu, launch, row_tiles_cfg};
use super::ops::{i32_of, suffix};
use super::recurrent::warps_cfg;
use crate::kernels::dtype::WeightDtype;

/// Largest expert count of `moe_route_f32` (32 lanes × 32 registers).
pub const MAX_EXPERTS: usize = super::limits::MAX_EXPERTS;

/// Softmax over `logits` `[t, experts]` (f32), then per token the `top_k` most likely experts
/// (lower index first on ties) into `ids` (i32) and their probabilities into `weights` (f32),
/// both `[t, top_k]`, renormalised over the k when `renorm`.
pub fn route(
    gpu: &Gpu,
    logits: u64,
    (ids, weights): (u64, u64),
    t: usize,
    (experts, top_k): (usize, usize),
    renorm: bool,
) -> CudaResult<()> {
    if t == 0 {
        return Ok(());
    }
    if experts > MAX_EXPERTS || top_k == 0 || top_k > experts {
        return Err(CudaError::Invalid(format!(
            "top-{top_k} of {experts} experts (at most {MAX_EXPERTS})"
        )));
    }
    launch!(
        gpu,
        "moe_route_f32",
        warps_cfg(t)?,
        logits,
        ids,
        weights,
        i32_of(t, "tokens")?,
        i32_of(experts, "experts")?,
        i32_of(top_k, "top_k")?,
        i32::from(renorm)
    )
}

/// `out[i] = x[rows[i]]` for `n` rows of `h` elements of `dtype` (16-bit types moved as raw
/// bits); `rows` a device i32 array. With `scale` (a device f32 array, one per row): times
/// `scale[i]`, rounded to `dtype` once.
pub fn gather_rows(
    gpu: &Gpu,
    (x, rows, out): (u64, u64, u64),
    scale: Option<u64>,
    dtype: WeightDtype,
    (n, h): (usize, usize),
) -> CudaResult<()> {
    if n * h == 0 {
        return Ok(());
    }
    let (n32, h32) = (i32_of(n, "rows")?, i32_of(h, "hidden")?);
    let cfg = row_tiles_cfg(n, h, 256)?;
    if let Some(scale) = scale {
        let name = format!("moe_gather_scaled_{}", suffix(dtype));
        return launch!(gpu, &name => "moe_gather_scaled_f32", cfg, x, rows, scale, out, n32, h32);
    }
    let name = match dtype {
        WeightDtype::F32 => "moe_gather_rows_f32",
        WeightDtype::Bf16 | WeightDtype::F16 => "moe_gather_rows_u16",
    };
    launch!(gpu, name => "moe_gather_rows_f32", cfg, x, rows, out, n32, h32)
}

/// `gate[t] = sigmoid(x[t] · w)` for `t` rows of `h` (x in `dtype`, w and gate f32): one
/// fixed-order dot per row, where a GEMM with N = 1 need not be row-invariant.
pub fn shared_gate(
    gpu: &Gpu,
    (x, w, gate): (u64, u64, u64),
    dtype: WeightDtype,
    t: usize,
    h: usize,
) -> CudaResult<()> {
    if t == 0 {
        return Ok(());
    }
    let name = format!("moe_shared_gate_{}", suffix(dtype));
    launch!(
        gpu,
        &name => "moe_shared_gate_f32",
        warps_cfg(t)?,
        x,
        w,
        gate,
        i32_of(t, "tokens")?,
        i32_of(h, "hidden")?
    )
}

/// Device addresses of the combine's operands.
#[derive(Debug, Clone, Copy)]
pub struct CombineIo {
    /// Expert outputs in expert order `[t·k, h]` f32.
    pub y: u64,
    /// `[t, k]` i32 rows of `y` and f32 weights, ascending expert order per token.
    pub tok_pos: u64,
    pub tok_w: u64,
    /// Shared expert output `[t, h]` and its gate `[t]`, f32 (`None`: no shared expert).
    pub shared: Option<(u64, u64)>,
    /// `[t, h]` f32.
    pub out: u64,
}

/// `out[t] = Σ_i tok_w[t, i] · y[tok_pos[t, i]]` (i ascending, from zero)
/// `+ gate[t] · shared[t]` with a shared expert.
pub fn combine(gpu: &Gpu, io: CombineIo, t: usize, k: usize, h: usize) -> CudaResult<()> {
    if t * h == 0 {
        return Ok(());
    }
    let (shared, gate) = io.shared.unwrap_or((0, 0));
    launch!(
        gpu,
        "moe_combine_f32",
        row_tiles_cfg(t, h, 256)?,
        io.y,
        io.tok_pos,
        io.tok_w,
        shared,
        gate,
        io.out,
        i32_of(t, "tokens")?,
        i32_of(k, "top_k")?,
        i32_of(h, "hidden")?,
        i32::from(io.shared.is_some())
    )
}

#[cfg(all(test, feature = "cuda"))]
mod tests {
    use super::super::context::kernel_names_for_test;
    use super::super::nvrtc::SOURCES;

    /// Every kernel the MoE launchers call is an entry point of a loaded source.
    #[test]
    fn launched_moe_kernels_exist() {
        let all: Vec<String> = SOURCES
            .iter()
            .flat_map(|(_, src)| kernel_names_for_test(src))
            .collect();
        let mut wanted: Vec<String> = [
            "moe_route_f32",
            "moe_gather_rows_f32",
            "moe_gather_rows_u16",
            "moe_combine_f32",
        ]
        .map(String::from)
        .to_vec();
        wanted.extend(["f32", "bf16", "f16"].map(|d| format!("moe_shared_gate_{d}")));
        for w in &wanted {
            assert!(all.contains(w), "kernel `{w}` is launched but not defined");
        }
    }
}
