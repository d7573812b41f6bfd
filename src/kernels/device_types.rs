//! The device-ops layer's types (re-exported by `device.rs`): errors, column views, host
//! weights, the ops' shapes and parameters, KV / capture specs.

use std::borrow::Cow;

use thiserror::Error;

use super::Device;
use crate::kernels::RowFault;
use crate::kernels::dtype::{OutputDtype, WeightDtype};
use crate::kernels::dtype::{dtype_size, narrow_into, widen};

/// A device op failed or was given inconsistent sizes.
#[derive(Debug, Error)]
pub enum DeviceError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Failed(String),
    /// The device can run nothing more ([`crate::kernels::BackendError::DeviceLost`]).
    #[error("{0}")]
    Lost(String),
}

pub type DevResult<T> = Result<T, DeviceError>;

impl From<DeviceError> for crate::kernels::BackendError {
    fn from(e: DeviceError) -> Self {
        match e {
            DeviceError::Lost(m) => crate::kernels::BackendError::DeviceLost(m),
            other => crate::kernels::BackendError::Compute(other.to_string()),
        }
    }
}

/// What an activation buffer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufKind {
    /// f32 values.
    F32,
    /// The input of a linear layer, in the weights' compute dtype.
    GemmIn,
}

/// Columns `col..col + width` of every row of `buf`.
pub struct Cols<'a, B> {
    pub buf: &'a B,
    pub col: usize,
    pub width: usize,
}

impl<'a, B> Cols<'a, B> {
    pub fn new(buf: &'a B, col: usize, width: usize) -> Self {
        Self { buf, col, width }
    }
}

impl<B> Clone for Cols<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B> Copy for Cols<'_, B> {}

/// A checkpoint matrix `[rows, cols]` (torch Linear layout `[out, in]`) as stored: raw
/// little-endian elements of `dtype`, borrowed from the mapped checkpoint where possible.
/// Devices keep it in its dtype (or widen it, the CPU for now); re-ordering and stacking rows
/// never converts.
#[derive(Debug, Clone)]
pub struct HostMatrix<'a> {
    pub dtype: WeightDtype,
    pub rows: usize,
    pub cols: usize,
    pub data: Cow<'a, [u8]>,
}

/// `values` as little-endian `dtype` elements (round to nearest even when narrowing).
fn f32_bytes_in(values: &[f32], dtype: WeightDtype) -> Vec<u8> {
    let mut out = vec![0u8; values.len() * dtype_size(dtype)];
    narrow_into(values, dtype, &mut out);
    out
}

impl<'a> HostMatrix<'a> {
    /// f32 values `[rows, cols]` as a matrix.
    pub fn from_f32(values: &[f32], rows: usize, cols: usize) -> HostMatrix<'static> {
        HostMatrix {
            dtype: WeightDtype::F32,
            rows,
            cols,
            data: Cow::Owned(bytemuck::cast_slice(values).to_vec()),
        }
    }

    fn elem(&self) -> usize {
        dtype_size(self.dtype)
    }

    /// The same matrix owning its bytes.
    pub fn into_owned(self) -> HostMatrix<'static> {
        HostMatrix {
            dtype: self.dtype,
            rows: self.rows,
            cols: self.cols,
            data: Cow::Owned(self.data.into_owned()),
        }
    }

    /// Every element widened to f32 (exact for bf16 and f16).
    pub fn to_f32(&self) -> Vec<f32> {
        widen(&self.data, self.dtype)
    }

    /// The same values in `dtype` (round to nearest even when narrowing; exact when widening;
    /// a view when `dtype` is already the stored one).
    pub fn to_dtype(&self, dtype: WeightDtype) -> HostMatrix<'_> {
        let data = match dtype == self.dtype {
            true => Cow::Borrowed(&self.data[..]),
            false => Cow::Owned(f32_bytes_in(&self.to_f32(), dtype)),
        };
        HostMatrix {
            dtype,
            rows: self.rows,
            cols: self.cols,
            data,
        }
    }

    /// Matrices of the same width stacked row-wise (`[sum rows, cols]`; one part is returned
    /// as it is); parts stored in different dtypes are all widened to f32.
    pub fn stack(parts: Vec<HostMatrix<'a>>) -> Result<HostMatrix<'a>, String> {
        let Some(first) = parts.first() else {
            return Err("stacking no matrices".into());
        };
        let (cols, dtype) = (first.cols, first.dtype);
        if let Some(p) = parts.iter().find(|p| p.cols != cols) {
            return Err(format!("stacking [_, {}] onto [_, {cols}]", p.cols));
        }
        if parts.len() == 1 {
            return Ok(parts.into_iter().next().expect("one part"));
        }
        let same = parts.iter().all(|p| p.dtype == dtype);
        let dtype = if same { dtype } else { WeightDtype::F32 };
        let mut data = Vec::with_capacity(parts.iter().map(|p| p.data.len()).sum());
        let mut rows = 0;
        for p in parts {
            rows += p.rows;
            data.extend_from_slice(&p.to_dtype(dtype).data);
        }
        Ok(HostMatrix {
            dtype,
            rows,
            cols,
            data: Cow::Owned(data),
        })
    }

    /// Rows `rows` (a `[in, out]` block, as `x @ W` stores it) transposed to `[out, in]`, the
    /// output columns taken in the order of `cols`; raw elements, no conversion.
    pub fn transposed(&self, rows: std::ops::Range<usize>, cols: &[usize]) -> HostMatrix<'static> {
        let es = self.elem();
        let inp = rows.len();
        let mut data = Vec::with_capacity(cols.len() * inp * es);
        for &c in cols {
            for r in rows.clone() {
                let at = (r * self.cols + c) * es;
                data.extend_from_slice(&self.data[at..at + es]);
            }
        }
        HostMatrix {
            dtype: self.dtype,
            rows: cols.len(),
            cols: inp,
            data: Cow::Owned(data),
        }
    }

    /// The rows of `ranges` (start, count), concatenated in the order given.
    pub fn select_rows(&self, ranges: &[(usize, usize)]) -> HostMatrix<'static> {
        let row_bytes = self.cols * self.elem();
        let mut data = Vec::with_capacity(self.data.len());
        let mut rows = 0;
        for &(start, n) in ranges {
            data.extend_from_slice(&self.data[start * row_bytes..(start + n) * row_bytes]);
            rows += n;
        }
        HostMatrix {
            dtype: self.dtype,
            rows,
            cols: self.cols,
            data: Cow::Owned(data),
        }
    }

    /// Each row's columns, `groups` runs of `width`, each followed by zeros up to `to`
    /// (`to ≥ width`; `cols` must be `groups · width`).
    pub fn pad_col_groups(&self, groups: usize, width: usize, to: usize) -> HostMatrix<'static> {
        let e = self.elem();
        let mut data = vec![0u8; self.rows * groups * to * e];
        for (src, dst) in
            (self.data.chunks_exact(self.cols * e)).zip(data.chunks_exact_mut(groups * to * e))
        {
            for (s, d) in src
                .chunks_exact(width * e)
                .zip(dst.chunks_exact_mut(to * e))
            {
                d[..s.len()].copy_from_slice(s);
            }
        }
        HostMatrix {
            dtype: self.dtype,
            rows: self.rows,
            cols: groups * to,
            data: Cow::Owned(data),
        }
    }

    /// The rows, `groups` runs of `width`, each followed by zero rows up to `to` (`to ≥ width`;
    /// `rows` must be `groups · width`).
    pub fn pad_row_groups(&self, groups: usize, width: usize, to: usize) -> HostMatrix<'static> {
        let row = self.cols * self.elem();
        let mut data = vec![0u8; groups * to * row];
        for (s, d) in (self.data.chunks_exact(width * row)).zip(data.chunks_exact_mut(to * row)) {
            d[..s.len()].copy_from_slice(s);
        }
        HostMatrix {
            dtype: self.dtype,
            rows: groups * to,
            cols: self.cols,
            data: Cow::Owned(data),
        }
    }
}

/// Multi-head latent attention's heads (DeepSeek-V2 / V3): q and k heads of `nope` dims
/// without position and `rope` rotated dims (k's rotated dims one head shared by all), v heads
/// of `v` dims. [`Device::mla_heads`](super::Device::mla_heads) lays them out as a fused
/// projection of [`MlaDims::head_dim`] per head for the attention kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlaDims {
    pub heads: usize,
    pub nope: usize,
    pub rope: usize,
    pub v: usize,
    /// The checkpoint's rotated dims are interleaved pairs `(x0, x1), (x2, x3), …`
    /// (`rope_interleave`); the assembled heads hold them as `x0, x2, …, x1, x3, …`, the
    /// `rotate_half` order (q and k alike: their dot products do not change).
    pub interleave: bool,
}

impl MlaDims {
    /// Dims of an assembled head: `nope + rope` (v zero-padded to it).
    pub fn head_dim(&self) -> usize {
        self.nope + self.rope
    }

    /// Row widths of the inputs `q`, `kv`, `k_rope`; `None` when v is wider than a head.
    pub fn input_widths(&self) -> Option<[usize; 3]> {
        let hd = self.head_dim();
        (self.v <= hd).then_some([
            self.heads * hd,
            self.heads * (self.nope + self.v),
            self.rope,
        ])
    }

    /// Row width of the assembled `[q | k | v]` heads: `3 · heads · head_dim`.
    pub fn out_width(&self) -> usize {
        3 * self.heads * self.head_dim()
    }

    /// The checkpoint's rotated dim at assembled dim `c < rope`.
    pub fn rope_source(&self, c: usize) -> usize {
        match self.interleave {
            true => crate::kernels::dsa::deinterleaved_source(c, self.rope),
            false => c,
        }
    }
}

/// Gated DeltaNet geometry.
#[derive(Debug, Clone, Copy)]
pub struct GdnDims {
    pub nk: usize,
    pub nv: usize,
    pub dk: usize,
    pub dv: usize,
}

impl GdnDims {
    /// Columns of the decay's input `alpha` (and values of `dt_bias`): one per value head,
    /// or one per key channel of each (Kimi Delta Attention's `per_channel`).
    pub fn gate_width(&self, per_channel: bool) -> usize {
        match per_channel {
            true => self.nv * self.dk,
            false => self.nv,
        }
    }
}

/// Gated DeltaNet per-head parameters: `-exp(A_log)` and `dt_bias`, and the factor on
/// `sigmoid(b)`.
pub struct GdnParams<'a, D: Device> {
    pub dims: GdnDims,
    pub neg_a: &'a D::Vector,
    pub dt_bias: &'a D::Vector,
    /// `beta = beta_scale · sigmoid(b)`: 1, or 2 where the model allows negative eigenvalues
    /// (OLMo Hybrid's `linear_allow_neg_eigval`, beta in (0, 2)).
    pub beta_scale: f32,
    /// Kimi Delta Attention: the decay per key channel, not per head (`alpha` `nv · dk`
    /// columns, `dt_bias` `nv · dk` values; channel `h · dk + i` gates row i of head h's state).
    pub per_channel: bool,
}

impl<D: Device> GdnParams<'_, D> {
    /// Columns of the decay's input `alpha` (and values of `dt_bias`).
    pub fn gate_width(&self) -> usize {
        self.dims.gate_width(self.per_channel)
    }
}

/// The function of [`Device::gate`](super::Device::gate): `out = f(x, g)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateFn {
    /// `x · sigmoid(g)` (gated attention's output gate).
    Sigmoid,
    /// `gelu_tanh(x) · g` (Gemma 4's per-layer input gate: torch's tanh-approximated GELU,
    /// f32).
    GeluTanh,
    /// `x · g` (LFM2's short convolution: its input and output gates).
    Product,
}

/// An element-wise activation between an MLP's two projections (no gate).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum UnaryAct {
    /// `relu(x)²` (Nemotron-H, Arcee).
    Relu2,
    /// Apertus' xIELU ([`Xielu`]).
    Xielu(Xielu),
    /// The tanh GELU (StarCoder2's `gelu_pytorch_tanh`): `x · sigmoid(2 · √(2/π) · (x + 0.044715
    /// x³))`, the GeGLU's arithmetic with a unit gate.
    GeluTanh,
    /// The exact GELU (GPT-NeoX's `gelu`, torch's default): `x · 0.5 · (1 + erf(x / √2))`, in
    /// torch's order.
    Gelu,
}

/// xIELU (arXiv 2411.13010) with its learned scalars as transformers applies them:
/// `alpha_p · x · x + beta · x` where `x > 0`, else
/// `(expm1(min(x, eps)) - x) · alpha_n + beta · x`, each product rounded to f32 in that order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Xielu {
    /// `softplus(alpha_p)` of the checkpoint's parameter.
    pub alpha_p: f32,
    /// `beta + softplus(alpha_n)`.
    pub alpha_n: f32,
    pub beta: f32,
    pub eps: f32,
}

impl Xielu {
    #[inline]
    pub fn apply(&self, x: f32) -> f32 {
        match x > 0.0 {
            true => self.alpha_p * x * x + self.beta * x,
            false => (x.min(self.eps).exp_m1() - x) * self.alpha_n + self.beta * x,
        }
    }
}

/// A row norm: `w · normed(x)`, `eps` inside the root.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowNorm {
    pub kind: NormKind,
    pub eps: f64,
}

/// How a [`RowNorm`] normalises a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NormKind {
    /// `x · rsqrt(mean(x²) + eps)` (RMSNorm).
    #[default]
    Rms,
    /// `(x - mean(x)) · rsqrt(var(x) + eps)`: LayerNorm without a bias (Cohere's).
    Layer,
    /// `Layer` then `+ b` (`nn.LayerNorm`: StarCoder2's): the weight vector holds the weight
    /// then the bias, `[w | b]`, twice the normed width.
    LayerBias,
}

impl NormKind {
    /// Weight-vector values per normed value: 2 where the vector also holds the bias.
    pub fn weights_per_value(self) -> usize {
        match self {
            Self::Rms | Self::Layer => 1,
            Self::LayerBias => 2,
        }
    }
}

impl RowNorm {
    pub fn rms(eps: f64) -> Self {
        Self {
            kind: NormKind::Rms,
            eps,
        }
    }
}

/// The gate of a linear attention's output norm `w · rms_norm(x) · act(z)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormGate {
    /// Gated DeltaNet's `silu(z)`.
    Silu,
    /// Kimi Delta Attention's `sigmoid(z)`.
    Sigmoid,
}

/// Mamba-2 geometry.
#[derive(Debug, Clone, Copy)]
pub struct MambaDims {
    pub heads: usize,
    pub head_dim: usize,
    pub d_state: usize,
    pub groups: usize,
    /// Lower clamp of `dt` (transformers' `time_step_min`).
    pub dt_min: f32,
}

/// Mamba-2 per-head parameters: `-exp(A_log)`, `D`, `dt_bias`.
pub struct MambaParams<'a, D: Device> {
    pub dims: MambaDims,
    pub neg_a: &'a D::Vector,
    pub d: &'a D::Vector,
    pub dt_bias: &'a D::Vector,
}

/// Mamba-1 (Mamba, Falcon-Mamba, Jamba) per-channel parameters over `inner` channels of
/// `d_state` state values each: `-exp(A_log)` (`[inner, d_state]`), `D` and `dt_proj`'s bias
/// (`[inner]`), and the weights B and C are multiplied by before use (`[2 · d_state]`: Jamba's
/// `b_layernorm` / `c_layernorm` weights; ones elsewhere, which change no bit).
pub struct Mamba1Params<'a, D: Device> {
    pub d_state: usize,
    pub neg_a: &'a D::Vector,
    pub d: &'a D::Vector,
    pub dt_bias: &'a D::Vector,
    pub bc_weight: &'a D::Vector,
}

/// A causal depthwise conv1d (`[channels, kernel]` weight, optional bias) with its state.
pub struct ConvCall<'a, D: Device> {
    pub state_layer: usize,
    pub weight: &'a D::Vector,
    pub bias: Option<&'a D::Vector>,
    pub kernel: usize,
    /// SiLU after the conv (Gated DeltaNet, Mamba-2); none in LFM2's short convolution.
    pub silu: bool,
}

/// Shape of a paged KV cache: `layers` attention layers of `num_blocks × block_size` slots of
/// `kv_dim` values for K and for V, and the sparse-attention indexer's keys in the same slots.
#[derive(Debug, Clone, Copy)]
pub struct KvShape {
    pub layers: usize,
    pub num_blocks: usize,
    pub block_size: usize,
    pub kv_dim: usize,
    pub index: Option<crate::kernels::dsa::IndexShape>,
}

/// How a forward's captured rows are staged: `layers` slots of `hidden` values, up to `rows`
/// rows, in `dtype`. `guard`, when set, has one flag per slot: every row is checked for NaN /
/// Inf, and for all zeros where the slot's flag is set (layer ids >= 1).
#[derive(Debug, Clone)]
pub struct CaptureSpec {
    pub layers: usize,
    pub hidden: usize,
    pub rows: usize,
    pub dtype: OutputDtype,
    pub guard: Option<Vec<bool>>,
}

/// A forward's captured rows: `[rows, K, H]` file-dtype bytes and the refused (row, slot,
/// fault) triples in row then slot order.
#[derive(Debug, Clone, Default)]
pub struct Captured {
    pub bytes: Vec<u8>,
    pub refused: Vec<(usize, usize, RowFault)>,
}

impl KvShape {
    /// Values of K (or of V) in one layer; `None` when the size overflows.
    pub fn per_layer(&self) -> Option<usize> {
        self.num_blocks
            .checked_mul(self.block_size)?
            .checked_mul(self.kv_dim)
    }

    /// The K and V buffers of every layer, each made by `alloc`.
    pub fn alloc_layers<T, E>(
        &self,
        mut alloc: impl FnMut() -> Result<T, E>,
    ) -> Result<(Vec<T>, Vec<T>), E> {
        let (mut k, mut v) = (
            Vec::with_capacity(self.layers),
            Vec::with_capacity(self.layers),
        );
        for _ in 0..self.layers {
            k.push(alloc()?);
            v.push(alloc()?);
        }
        Ok((k, v))
    }
}

/// Slot copies are valid when every slot is below `slots`, no destination is written twice and
/// no slot is both read and written (so the copies may run in any order, or all at once).
pub fn check_slot_copies(copies: &[(usize, usize)], slots: usize) -> DevResult<()> {
    let bad = |m: String| Err(DeviceError::Invalid(m));
    if let Some(&(f, t)) = copies.iter().find(|&&(f, t)| f >= slots || t >= slots) {
        return bad(format!("state slot copy {f} -> {t} outside {slots} slots"));
    }
    let mut dst: Vec<usize> = copies.iter().map(|c| c.1).collect();
    dst.sort_unstable();
    if dst.windows(2).any(|w| w[0] == w[1]) {
        return bad("a state slot is the destination of two copies".into());
    }
    if let Some(&(f, _)) = copies.iter().find(|c| dst.binary_search(&c.0).is_ok()) {
        return bad(format!("state slot {f} is both copied from and into"));
    }
    Ok(())
}
