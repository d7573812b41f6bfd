//! Rust launchers of the row-wise and element-wise kernels (norm.cu, rope.cu,
//! elementwise.cu, embed.cu, gated_attn.cu, mla.cu). Arguments are device addresses (`u64`) plus
//! sizes; the caller ([`super::CudaDevice`]) checks that the buffers hold what the sizes say.
//!
//! `*_dtype` arguments name the dtype a kernel writes for a following GEMM (the weights'
//! dtype); the residual stream and everything else stays f32.

use super::api::limits::ATTN_MAX_HEAD_DIM;
use super::context::{
    CudaError, CudaResult, Gpu, LaunchConfig, elems_cfg, launch, row_tiles_cfg, rows_cfg,
};
use super::gemm::DevWeight;
use crate::kernels::device::{GateFn, NormKind, RowNorm};
use crate::kernels::dtype::WeightDtype;

/// Kernel-name suffix of a dtype.
pub fn suffix(d: WeightDtype) -> &'static str {
    match d {
        WeightDtype::F32 => "f32",
        WeightDtype::Bf16 => "bf16",
        WeightDtype::F16 => "f16",
    }
}

/// `v` as an i32 kernel argument (`what` names it in the error).
pub fn i32_of(v: usize, what: &str) -> CudaResult<i32> {
    i32::try_from(v).map_err(|_| CudaError::Invalid(format!("{what} = {v} exceeds i32")))
}

fn i64_of(v: usize) -> i64 {
    // usize -> i64 cannot overflow for any buffer that fits in device memory.
    v as i64
}

const ROW_THREADS: u32 = 256;

/// `out[r] = norm(x[r]) * w` for `rows` rows of `n` (out in `dtype`).
#[allow(clippy::too_many_arguments)]
pub fn norm(
    gpu: &Gpu,
    x: u64,
    w: u64,
    out: u64,
    dtype: WeightDtype,
    rows: usize,
    n: usize,
    op: RowNorm,
) -> CudaResult<()> {
    let name = format!("{}_{}", norm_kernel(op.kind), suffix(dtype));
    let (n, eps) = (i32_of(n, "hidden")?, op.eps);
    launch!(gpu, &name => "rms_norm_f32", rows_cfg(rows, ROW_THREADS)?, x, w, out, n, eps)
}

/// The kernel family of a norm kind (`{family}_{dtype}`, `add_{family}_{dtype}`).
fn norm_kernel(kind: NormKind) -> &'static str {
    match kind {
        NormKind::Rms => "rms_norm",
        NormKind::Layer => "layer_norm",
        NormKind::LayerBias => "layer_norm_bias",
    }
}

/// `x += y`, then `out = norm(x) * w` (the residual add fused with the next norm).
#[allow(clippy::too_many_arguments)]
pub fn add_norm(
    gpu: &Gpu,
    x: u64,
    y: u64,
    w: u64,
    out: u64,
    dtype: WeightDtype,
    rows: usize,
    n: usize,
    op: RowNorm,
) -> CudaResult<()> {
    let name = format!("add_{}_{}", norm_kernel(op.kind), suffix(dtype));
    let (n, eps) = (i32_of(n, "hidden")?, op.eps);
    launch!(
        gpu,
        &name => "add_rms_norm_f32",
        rows_cfg(rows, ROW_THREADS)?,
        x,
        y,
        w,
        out,
        n,
        eps
    )
}

/// Where a group of heads sits inside wider f32 rows (e.g. q / k inside fused qkv rows).
#[derive(Debug, Clone, Copy)]
pub struct Heads {
    /// Device address of row 0, column 0.
    pub base: u64,
    /// Elements between rows.
    pub stride: usize,
    /// Column of the first head.
    pub col: usize,
    pub rows: usize,
    pub heads: usize,
    pub head_dim: usize,
}

/// RMSNorm in place of each of `x`'s heads, `w` of `head_dim` values: Qwen3's per-head q_norm /
/// k_norm, or (one head as wide as the projection) MiniMax-M2's over all of q or k.
pub fn head_rms_norm(gpu: &Gpu, x: Heads, w: u64, eps: f64) -> CudaResult<()> {
    head_norm(gpu, x, (w, 0), false, eps)
}

/// LayerNorm without a bias in place of each of `x`'s heads, each with its own `head_dim`
/// values of `w` (`[heads, head_dim]`): Cohere's `use_qk_norm`.
pub fn head_layer_norm(gpu: &Gpu, x: Heads, w: u64, eps: f64) -> CudaResult<()> {
    head_norm(gpu, x, (w, x.head_dim), true, eps)
}

/// [`head_rms_norm`] / [`head_layer_norm`]: head h's weights at `w + h · w_stride` floats.
fn head_norm(
    gpu: &Gpu,
    x: Heads,
    (w, w_stride): (u64, usize),
    centred: bool,
    eps: f64,
) -> CudaResult<()> {
    if x.rows == 0 {
        return Ok(());
    }
    let cfg = LaunchConfig {
        grid_dim: (
            u32::try_from(x.rows).map_err(|_| CudaError::Invalid("rows".into()))?,
            u32::try_from(x.heads).map_err(|_| CudaError::Invalid("heads".into()))?,
            1,
        ),
        block_dim: (32, 1, 1),
        shared_mem_bytes: 0,
    };
    let (stride, col, hd) = (
        i64_of(x.stride),
        i32_of(x.col, "col")?,
        i32_of(x.head_dim, "hd")?,
    );
    let (w_stride, centred) = (i64_of(w_stride), i32::from(centred));
    launch!(
        gpu,
        "head_norm",
        cfg,
        x.base,
        stride,
        col,
        hd,
        w,
        w_stride,
        centred,
        eps
    )
}

/// A RoPE table on the device: `inv_freq` (rot / 2 f32) and the scale of cos and sin.
pub type RopeFreqs = (u64, f32);

/// RoPE in place on the first `rot` dims of every head (rot == head_dim: full rotary), at
/// `positions` (device, i32 per row), with `inv_freq` (device, rot / 2 values), cos and sin
/// times `scale`.
pub fn rope(
    gpu: &Gpu,
    x: Heads,
    rot: usize,
    positions: u64,
    (inv_freq, scale): RopeFreqs,
) -> CudaResult<()> {
    if x.rows == 0 {
        return Ok(());
    }
    if rot == 0 || !rot.is_multiple_of(2) || rot > x.head_dim || rot > ATTN_MAX_HEAD_DIM {
        return Err(CudaError::Invalid(format!(
            "rotary dims {rot} must be even and within head_dim {} (at most {ATTN_MAX_HEAD_DIM})",
            x.head_dim
        )));
    }
    let (stride, col) = (i64_of(x.stride), i32_of(x.col, "col")?);
    let (heads, hd, rot) = (
        i32_of(x.heads, "heads")?,
        i32_of(x.head_dim, "hd")?,
        i32_of(rot, "rot")?,
    );
    let cfg = rows_cfg(x.rows, ROW_THREADS)?;
    launch!(
        gpu, "rope", cfg, x.base, stride, col, heads, hd, rot, positions, inv_freq, scale
    )
}

/// [`rope`] of q's and k's heads. Where k's heads follow q's in the same rows (the fused qkv
/// layout), one launch covers both, so each row's cos / sin are computed once, not twice.
pub fn rope_qk(
    gpu: &Gpu,
    q: Heads,
    k: Heads,
    rot: usize,
    positions: u64,
    freqs: RopeFreqs,
) -> CudaResult<()> {
    let same_rows =
        (q.base, q.stride, q.rows, q.head_dim) == (k.base, k.stride, k.rows, k.head_dim);
    if same_rows && k.col == q.col + q.heads * q.head_dim {
        let both = Heads {
            heads: q.heads + k.heads,
            ..q
        };
        return rope(gpu, both, rot, positions, freqs);
    }
    rope(gpu, q, rot, positions, freqs)?;
    rope(gpu, k, rot, positions, freqs)
}

/// `out[t, i] = silu(gu[t, i]) * gu[t, inter + i]` (out in `dtype`).
pub fn silu_mul(
    gpu: &Gpu,
    gu: u64,
    out: u64,
    dtype: WeightDtype,
    rows: usize,
    inter: usize,
) -> CudaResult<()> {
    if rows * inter == 0 {
        return Ok(());
    }
    let name = format!("silu_mul_{}", suffix(dtype));
    let cfg = row_tiles_cfg(rows, inter, GLU_COLS_PER_BLOCK)?;
    let inter = i32_of(inter, "intermediate")?;
    launch!(gpu, &name => "silu_mul_f32", cfg, gu, out, inter)
}

/// gpt-oss's clamped SwiGLU of `gu` `[rows, 2 · inter]` (f32) into `out` (`dtype`).
pub fn swiglu_clamped(
    gpu: &Gpu,
    (gu, out): (u64, u64),
    dtype: WeightDtype,
    (rows, inter): (usize, usize),
    (alpha, limit): (f32, f32),
) -> CudaResult<()> {
    if rows * inter == 0 {
        return Ok(());
    }
    let name = format!("swiglu_clamped_{}", suffix(dtype));
    let cfg = row_tiles_cfg(rows, inter, GLU_COLS_PER_BLOCK)?;
    let inter = i32_of(inter, "intermediate")?;
    launch!(gpu, &name => "swiglu_clamped_f32", cfg, gu, out, inter, alpha, limit)
}

/// Gemma's GeGLU of `gu` `[rows, 2 · inter]` (f32) into `out` (`dtype`).
pub fn gelu_tanh_mul(
    gpu: &Gpu,
    (gu, out): (u64, u64),
    dtype: WeightDtype,
    (rows, inter): (usize, usize),
) -> CudaResult<()> {
    if rows * inter == 0 {
        return Ok(());
    }
    let name = format!("gelu_tanh_mul_{}", suffix(dtype));
    let cfg = row_tiles_cfg(rows, inter, GLU_COLS_PER_BLOCK)?;
    let inter = i32_of(inter, "intermediate")?;
    launch!(gpu, &name => "gelu_tanh_mul_f32", cfg, gu, out, inter)
}

/// Columns per block of the gated activations (`glu_rows` in elementwise.cu: 256 threads ×
/// GLU_COLS 4).
const GLU_COLS_PER_BLOCK: usize = 1024;

/// `y[r, i] += b[i]` over `rows` rows of `n`.
pub fn bias_add(gpu: &Gpu, y: u64, b: u64, rows: usize, n: usize) -> CudaResult<()> {
    let total = rows * n;
    if total == 0 {
        return Ok(());
    }
    let ni = i32_of(n, "bias length")?;
    launch!(gpu, "bias_add", elems_cfg(total)?, y, b, ni, i64_of(total))
}

/// `x += y` over `total` f32 values.
pub fn add(gpu: &Gpu, x: u64, y: u64, total: usize) -> CudaResult<()> {
    if total == 0 {
        return Ok(());
    }
    launch!(gpu, "add_f32", elems_cfg(total)?, x, y, i64_of(total))
}

/// `x *= factor` over `total` values of `dtype` (the f32 product, rounded to `dtype`).
pub fn scale(gpu: &Gpu, x: u64, dtype: WeightDtype, factor: f32, total: usize) -> CudaResult<()> {
    if total == 0 {
        return Ok(());
    }
    let name = format!("scale_{}", suffix(dtype));
    let cfg = elems_cfg(total)?;
    launch!(gpu, &name => "scale_f32", cfg, x, factor, i64_of(total))
}

/// `x = clamp(x, -limit, limit)` over `total` values of `dtype`, NaN kept.
pub fn clamp(gpu: &Gpu, x: u64, dtype: WeightDtype, limit: f32, total: usize) -> CudaResult<()> {
    if total == 0 {
        return Ok(());
    }
    let name = format!("clamp_{}", suffix(dtype));
    let cfg = elems_cfg(total)?;
    launch!(gpu, &name => "clamp_f32", cfg, x, limit, i64_of(total))
}

/// f32 values to `dtype` (a plain device copy for f32).
pub fn cast(gpu: &Gpu, x: u64, out: u64, dtype: WeightDtype, total: usize) -> CudaResult<()> {
    if total == 0 {
        return Ok(());
    }
    match dtype {
        WeightDtype::F32 => copy_f32(gpu, x, out, total),
        WeightDtype::Bf16 => launch!(
            gpu,
            "cast_f32_bf16",
            elems_cfg(total)?,
            x,
            out,
            i64_of(total)
        ),
        WeightDtype::F16 => launch!(
            gpu,
            "cast_f32_f16",
            elems_cfg(total)?,
            x,
            out,
            i64_of(total)
        ),
    }
}

/// Device-to-device copy of `total` f32 values on the compute stream.
pub fn copy_f32(gpu: &Gpu, src: u64, dst: u64, total: usize) -> CudaResult<()> {
    if total == 0 {
        return Ok(());
    }
    // Both ranges are live device memory of `total` f32 (caller's contract).
    gpu.copy(dst, src, total * 4)
}

/// `x[t] = table[tokens[t]]` (f32) for `t < rows`; token ids (device, u32) must have been
/// range-checked on the host.
pub fn embed(
    gpu: &Gpu,
    (tokens, table, scale): (u64, &DevWeight, f32),
    x: u64,
    rows: usize,
) -> CudaResult<()> {
    if rows == 0 {
        return Ok(());
    }
    let name = format!("embed_{}", suffix(table.data.dtype()));
    let hidden = i32_of(table.cols, "hidden")?;
    launch!(
        gpu,
        &name => "embed_f32",
        rows_cfg(rows, ROW_THREADS)?,
        tokens,
        table.data.ptr(),
        x,
        hidden,
        scale
    )
}

/// [`Device::gate`](crate::kernels::device::Device::gate) (gated_attn.cu): `out [rows, w]`
/// in `dtype` from columns of `x` and `g`, each given as (column 0's address, row stride).
pub fn gate(
    gpu: &Gpu,
    (x, x_stride): (u64, usize),
    (g, g_stride): (u64, usize),
    (out, dtype): (u64, WeightDtype),
    (rows, w): (usize, usize),
    f: GateFn,
) -> CudaResult<()> {
    if rows * w == 0 {
        return Ok(());
    }
    let name = format!("gate_{}", suffix(dtype));
    let cfg = row_tiles_cfg(rows, w, 256)?;
    let kind: i32 = match f {
        GateFn::Sigmoid => 0,
        GateFn::GeluTanh => 1,
        GateFn::Product => 2,
    };
    launch!(
        gpu,
        &name => "gate_f32",
        cfg,
        x,
        i64_of(x_stride),
        g,
        i64_of(g_stride),
        out,
        i32_of(w, "gate width")?,
        kind
    )
}

/// Multi-head latent attention's heads (mla.cu) for `rows` tokens: `out` `[rows, 3 · heads ·
/// D]` from `q`, `kv`, `k_rope` (f32; the caller checked their shapes).
pub fn mla_heads(
    gpu: &Gpu,
    (q, kv, k_rope): (u64, u64, u64),
    out: u64,
    rows: usize,
    d: &crate::kernels::device::MlaDims,
) -> CudaResult<()> {
    if rows == 0 {
        return Ok(());
    }
    let cfg = row_tiles_cfg(rows, d.out_width(), 256)?;
    launch!(
        gpu,
        "mla_heads_f32",
        cfg,
        q,
        kv,
        k_rope,
        out,
        i32_of(d.heads, "MLA heads")?,
        i32_of(d.nope, "MLA nope dims")?,
        i32_of(d.rope, "MLA rope dims")?,
        i32_of(d.v, "MLA v dims")?,
        i32::from(d.interleave)
    )
}

/// `out[i] = x[rows[i]]` for `n` rows (device u32 indices) of `hidden` f32.
pub fn gather_rows(
    gpu: &Gpu,
    x: u64,
    rows: u64,
    out: u64,
    n: usize,
    hidden: usize,
) -> CudaResult<()> {
    if n == 0 {
        return Ok(());
    }
    let hidden = i32_of(hidden, "hidden")?;
    launch!(
        gpu,
        "gather_rows",
        rows_cfg(n, ROW_THREADS)?,
        x,
        rows,
        out,
        hidden
    )
}

/// `out[r] = argmax(logits[r])` (u32) for `rows` rows of `vocab` f32.
pub fn argmax(gpu: &Gpu, logits: u64, rows: usize, vocab: usize, out: u64) -> CudaResult<()> {
    if rows == 0 {
        return Ok(());
    }
    let vocab = i32_of(vocab, "vocab")?;
    // The kernel's shared arrays are sized for exactly 256 threads.
    launch!(gpu, "argmax_rows", rows_cfg(rows, 256)?, logits, vocab, out)
}
