//! The device-ops layer: one trait, [`Device`], with the fused ops every architecture is
//! written over (src/models/), and an implementation per device (`cpu::CpuDevice`,
//! `cuda::CudaDevice`). The models never see a device's memory: they hold its associated
//! types (activation buffers, weights, caches) and call its ops, so each architecture exists
//! once and runs on every device.
//!
//! # Conventions
//! - An activation buffer ([`Device::Buf`]) is `[rows, width]` row-major. Outputs are written
//!   whole: an op sets its output's rows and width. A buffer is created for at most `rows` rows
//!   ([`Device::buffer`]; the CPU grows as needed, CUDA allocates once for the token budget).
//! - [`BufKind::GemmIn`] buffers feed a linear layer: they hold the weights' compute dtype
//!   (bf16 / f16 on CUDA, f32 on the CPU). Everything else, the residual stream included, is f32.
//! - `Cols { buf, col, width }` names columns `col..col + width` of every row (the q / k / v,
//!   z, b, a, dt parts of a fused projection): no copy on devices that can stride.
//! - Every op gives each token the same arithmetic whatever else shares the batch and however
//!   its request was cut into chunks (DESIGN.md §7).

use std::borrow::Cow;
use std::ops::Range;

use half::{bf16, f16};
use thiserror::Error;

use super::RowFault;
use super::dtype::{OutputDtype, WeightDtype};
pub use super::dtype::{dtype_size, widen};
use super::plan::{BatchPlan, SeqState};
use super::rope::Rope;
use super::routing::{GroupedTopK, Routing};

/// A device op failed or was given inconsistent sizes.
#[derive(Debug, Error)]
pub enum DeviceError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Failed(String),
    /// The device can run nothing more ([`super::BackendError::DeviceLost`]).
    #[error("{0}")]
    Lost(String),
}

pub type DevResult<T> = Result<T, DeviceError>;

impl From<DeviceError> for super::BackendError {
    fn from(e: DeviceError) -> Self {
        match e {
            DeviceError::Lost(m) => super::BackendError::DeviceLost(m),
            other => super::BackendError::Compute(other.to_string()),
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
        let data = if dtype == self.dtype {
            Cow::Borrowed(&self.data[..])
        } else {
            let v = self.to_f32();
            Cow::Owned(match dtype {
                WeightDtype::F32 => bytemuck::cast_slice(&v).to_vec(),
                WeightDtype::Bf16 => {
                    let h: Vec<bf16> = v.iter().map(|&x| bf16::from_f32(x)).collect();
                    bytemuck::cast_slice(&h).to_vec()
                }
                WeightDtype::F16 => {
                    let h: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
                    bytemuck::cast_slice(&h).to_vec()
                }
            })
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
}

/// Where q, k and v sit in a fused projection's rows: q heads from column 0, k heads from
/// `k_col`, v heads right after k.
#[derive(Debug, Clone, Copy)]
pub struct QkvLayout {
    pub k_col: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl QkvLayout {
    pub fn v_col(&self) -> usize {
        self.k_col + self.kv_heads * self.head_dim
    }
}

/// Head geometry of one attention layer, as every device's attention kernel takes it.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Softmax scale, `head_dim^-0.5` (computed in f64, rounded to f32).
    pub scale: f32,
}

impl AttnShape {
    pub fn new(heads: usize, kv_heads: usize, head_dim: usize) -> Self {
        Self {
            heads,
            kv_heads,
            head_dim,
            scale: (head_dim as f64).powf(-0.5) as f32,
        }
    }
}

/// One attention layer's call: its KV cache layer, the qkv layout, optional per-head q/k
/// RMSNorm weights and RoPE (table, rotary dims of each head), and the softmax's variant.
pub struct AttnCall<'a, D: Device> {
    pub kv_layer: usize,
    pub layout: QkvLayout,
    pub qk_norm: Option<(&'a D::Vector, &'a D::Vector, f64)>,
    pub rope: Option<(&'a D::Rope, usize)>,
    pub softmax: AttnSoftmax<'a, D>,
}

/// What the attention's softmax sees beyond the causal keys (gpt-oss): a sliding window
/// (query at position p sees keys `p - window + 1 ..= p`), a learned per-head sink logit
/// that joins the denominator only, and a factor on the scores (YaRN's attention factor
/// squared) on top of `head_dim^-0.5`.
pub struct AttnSoftmax<'a, D: Device> {
    pub window: Option<usize>,
    /// `[heads]` logits.
    pub sinks: Option<&'a D::Vector>,
    pub score_factor: f64,
}

impl<D: Device> AttnSoftmax<'_, D> {
    /// Plain causal softmax.
    pub fn causal() -> Self {
        Self {
            window: None,
            sinks: None,
            score_factor: 1.0,
        }
    }

    /// The head geometry with the scale `head_dim^-0.5 · score_factor` (f64, rounded once).
    pub fn shape(&self, heads: usize, kv_heads: usize, head_dim: usize) -> AttnShape {
        AttnShape {
            scale: ((head_dim as f64).powf(-0.5) * self.score_factor) as f32,
            ..AttnShape::new(heads, kv_heads, head_dim)
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

/// Gated DeltaNet per-head parameters: `-exp(A_log)` and `dt_bias`.
pub struct GdnParams<'a, D: Device> {
    pub dims: GdnDims,
    pub neg_a: &'a D::Vector,
    pub dt_bias: &'a D::Vector,
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

/// A causal depthwise conv1d (`[channels, kernel]` weight, optional bias) with its state.
pub struct ConvCall<'a, D: Device> {
    pub state_layer: usize,
    pub weight: &'a D::Vector,
    pub bias: Option<&'a D::Vector>,
    pub kernel: usize,
}

/// Shape of a paged KV cache: `layers` attention layers of `num_blocks × block_size` slots of
/// `kv_dim` values for K and for V.
#[derive(Debug, Clone, Copy)]
pub struct KvShape {
    pub layers: usize,
    pub num_blocks: usize,
    pub block_size: usize,
    pub kv_dim: usize,
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

/// What the guard finds in one captured row, from the row's two flags.
pub fn row_fault(non_finite: bool, any_nonzero: bool, zero_check: bool) -> Option<RowFault> {
    if non_finite {
        Some(RowFault::NonFinite)
    } else if zero_check && !any_nonzero {
        Some(RowFault::AllZero)
    } else {
        None
    }
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

/// A compute device: memory for weights, caches and activations, and the fused ops.
pub trait Device: Send + Sync + Sized + 'static {
    /// Activations `[rows, width]`.
    type Buf: Send;
    /// A linear layer's weight (`[out, in]`, stored dtype) and optional f32 bias; also an
    /// embedding table.
    type Linear: Send + Sync;
    /// A small f32 vector (norm weights, per-head parameters, conv weights).
    type Vector: Send + Sync;
    /// A RoPE frequency table.
    type Rope: Send + Sync;
    /// The paged KV cache of the attention layers.
    type Kv: Send;
    /// The recurrent-state slots (conv + SSM / delta state) of the recurrent layers.
    type States: Send;
    /// Staging of the captured rows until they leave the device in the file dtype.
    type Capture: Send;
    /// One forward's plan as the device reads it.
    type Step<'a>;

    /// What the device is, for logs.
    fn describe(&self) -> String;
    /// Runs `f` where this device's ops should run (the CPU: inside its thread pool).
    fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R;

    // ----- memory -----
    fn linear(&self, weight: HostMatrix<'_>, bias: Option<Vec<f32>>) -> DevResult<Self::Linear>;
    fn vector(&self, values: &[f32]) -> DevResult<Self::Vector>;
    fn rope_table(&self, rope: &Rope) -> DevResult<Self::Rope>;
    /// A buffer for up to `rows` rows of `width`.
    fn buffer(&self, rows: usize, width: usize, kind: BufKind) -> DevResult<Self::Buf>;
    fn kv_cache(&self, shape: KvShape) -> DevResult<Self::Kv>;
    /// `shapes[i]` = (conv floats, state floats) per slot of recurrent layer i.
    fn state_cache(&self, shapes: &[(usize, usize)], slots: usize) -> DevResult<Self::States>;
    /// Copies every recurrent layer's state (conv and recurrent) of slot `from` into slot `to`
    /// for each `(from, to)`, bit for bit (prefix reuse: a request's slot snapshotted at a block
    /// boundary, restored into another request's slot). Checked by [`check_slot_copies`].
    fn copy_state_slots(
        &self,
        states: &mut Self::States,
        copies: &[(usize, usize)],
    ) -> DevResult<()>;
    /// Staging for the captured rows.
    fn capture_buffer(&self, spec: CaptureSpec) -> DevResult<Self::Capture>;
    /// Host rows (`width` wide) into `out` (f32).
    fn upload(&self, rows: &[f32], width: usize, out: &mut Self::Buf) -> DevResult<()>;
    /// An f32 buffer back to the host.
    fn download(&self, x: &Self::Buf) -> DevResult<Vec<f32>>;

    // ----- one forward -----
    /// The plan of a checked batch on the device; zeroes the state slots of chunks that start
    /// at position 0 (a reused slot never leaks).
    fn begin<'a>(
        &self,
        tokens: &'a [u32],
        plan: &'a BatchPlan<'a>,
        seqs: &'a [SeqState],
        states: Option<&mut Self::States>,
    ) -> DevResult<Self::Step<'a>>;
    /// `out[t] = table[tokens[t]]` (f32).
    fn embed(
        &self,
        step: &Self::Step<'_>,
        table: &Self::Linear,
        out: &mut Self::Buf,
    ) -> DevResult<()>;
    /// `out = x · Wᵀ (+ b)`, f32 accumulation, f32 out.
    fn matmul(&self, x: &Self::Buf, w: &Self::Linear, out: &mut Self::Buf) -> DevResult<()>;
    /// [`Device::matmul`] on rows `rows` of `x` into the same rows of `out`, which must
    /// already hold at least `rows.end` rows of `w`'s output width (MoE experts).
    fn matmul_rows(
        &self,
        x: &Self::Buf,
        rows: Range<usize>,
        w: &Self::Linear,
        out: &mut Self::Buf,
    ) -> DevResult<()>;
    /// Rows `rows` of `out` (`[n, I]`) = `silu_mul` of rows `rows` of `x · Wᵀ`, for a stacked
    /// `[gate | up]` weight `w` (a MoE expert), where the device fuses the two (the same bits as
    /// [`Device::matmul_rows`] then [`Device::silu_mul`]); false: not done, the caller runs
    /// those.
    fn matmul_rows_silu_mul(
        &self,
        x: &Self::Buf,
        rows: Range<usize>,
        w: &Self::Linear,
        out: &mut Self::Buf,
    ) -> DevResult<bool> {
        let _ = (x, rows, w, out);
        Ok(false)
    }
    /// `out` = `n` rows of `width`, ready for [`Device::matmul_rows`] to fill: a reused buffer
    /// keeps its old values (every row must be written before it is read; the MoE blocks'
    /// experts' row spans cover all `n`).
    fn resize(&self, out: &mut Self::Buf, n: usize, width: usize) -> DevResult<()>;
    /// `out = rms_norm(x) · w` per row.
    fn rms_norm(
        &self,
        x: &Self::Buf,
        w: &Self::Vector,
        eps: f64,
        out: &mut Self::Buf,
    ) -> DevResult<()>;
    /// `x += y` (exact, f32), then `out = rms_norm(x) · w`.
    fn add_rms_norm(
        &self,
        x: &mut Self::Buf,
        y: &Self::Buf,
        w: &Self::Vector,
        eps: f64,
        out: &mut Self::Buf,
    ) -> DevResult<()>;
    /// `x += y`.
    fn add(&self, x: &mut Self::Buf, y: &Self::Buf) -> DevResult<()>;
    /// One attention layer over fused projection rows `qkv`: q/k norms and RoPE in place,
    /// every token's K/V into the cache, then causal attention (scale `head_dim^-0.5`) into
    /// `out` (`[T, heads · head_dim]`).
    fn attention(
        &self,
        step: &Self::Step<'_>,
        kv: &mut Self::Kv,
        qkv: &mut Self::Buf,
        call: &AttnCall<'_, Self>,
        out: &mut Self::Buf,
    ) -> DevResult<()>;
    /// `out = x · sigmoid(gate)` (gated attention's output gate).
    fn sigmoid_gate(
        &self,
        x: &Self::Buf,
        gate: Cols<'_, Self::Buf>,
        out: &mut Self::Buf,
    ) -> DevResult<()>;
    /// `out[t, i] = silu(gu[t, i]) · gu[t, I + i]` for `gu` `[T, 2I]`.
    fn silu_mul(&self, gate_up: &Self::Buf, out: &mut Self::Buf) -> DevResult<()>;
    /// `out = silu_mul(x · Wᵀ)` for a stacked `[gate | up]` weight `w`: [`Device::matmul`]
    /// into `wide` then [`Device::silu_mul`], unless the device fuses the two (the same bits).
    fn matmul_silu_mul(
        &self,
        x: &Self::Buf,
        w: &Self::Linear,
        wide: &mut Self::Buf,
        out: &mut Self::Buf,
    ) -> DevResult<()> {
        self.matmul(x, w, wide)?;
        self.silu_mul(wide, out)
    }
    /// The SwiGLU MLP `out = down(silu_mul(x · Wᵀ))` for a stacked `[gate | up]` weight `w`:
    /// [`Device::matmul_silu_mul`] into `act` (through `wide`) then [`Device::matmul`] by
    /// `down`, unless the device fuses them (the same bits).
    fn swiglu_mlp(
        &self,
        x: &Self::Buf,
        (w, down): (&Self::Linear, &Self::Linear),
        (wide, act): (&mut Self::Buf, &mut Self::Buf),
        out: &mut Self::Buf,
    ) -> DevResult<()> {
        self.matmul_silu_mul(x, w, wide, act)?;
        self.matmul(act, down, out)
    }
    /// gpt-oss's experts: for `gu` `[T, 2I]` (gate then up), `g = min(gate, limit)`,
    /// `u = clamp(up, -limit, limit)`, `out = (u + 1) · g · sigmoid(alpha · g)`.
    fn swiglu_clamped(
        &self,
        gate_up: &Self::Buf,
        alpha_limit: (f32, f32),
        out: &mut Self::Buf,
    ) -> DevResult<()>;
    /// `out = relu(x)²`.
    fn relu2(&self, x: &Self::Buf, out: &mut Self::Buf) -> DevResult<()>;
    /// Causal depthwise conv1d + SiLU over `x`'s columns, the conv state carried per slot.
    #[allow(clippy::too_many_arguments)]
    fn conv1d_silu(
        &self,
        step: &Self::Step<'_>,
        states: &mut Self::States,
        x: Cols<'_, Self::Buf>,
        call: &ConvCall<'_, Self>,
        out: &mut Self::Buf,
    ) -> DevResult<()>;
    /// L2 norm of q / k (in place in `qkv`, the conv output `[q | k | v]`), then the gated
    /// delta rule token by token into `out` (`[T, nv · dv]`, f32).
    #[allow(clippy::too_many_arguments)]
    fn gated_delta_rule(
        &self,
        step: &Self::Step<'_>,
        states: &mut Self::States,
        state_layer: usize,
        qkv: &mut Self::Buf,
        beta_alpha: (Cols<'_, Self::Buf>, Cols<'_, Self::Buf>),
        p: &GdnParams<'_, Self>,
        out: &mut Self::Buf,
    ) -> DevResult<()>;
    /// Per-head `w · rms_norm(x) · silu(z)` (heads of `w`'s length).
    fn gdn_gated_norm(
        &self,
        x: &Self::Buf,
        z: Cols<'_, Self::Buf>,
        w: &Self::Vector,
        eps: f64,
        out: &mut Self::Buf,
    ) -> DevResult<()>;
    /// The Mamba-2 selective scan token by token over the conv output `xbc` (`[x | B | C]`)
    /// and the raw `dt` columns, into `out` (`[T, heads · head_dim]`, f32).
    #[allow(clippy::too_many_arguments)]
    fn mamba2_scan(
        &self,
        step: &Self::Step<'_>,
        states: &mut Self::States,
        state_layer: usize,
        xbc: &Self::Buf,
        dt: Cols<'_, Self::Buf>,
        p: &MambaParams<'_, Self>,
        out: &mut Self::Buf,
    ) -> DevResult<()>;
    /// `y · silu(z)`, then RMSNorm over groups of `group_size`, times `w`.
    fn mamba2_gated_norm(
        &self,
        y: &Self::Buf,
        z: Cols<'_, Self::Buf>,
        w: &Self::Vector,
        group_eps: (usize, f64),
        out: &mut Self::Buf,
    ) -> DevResult<()>;
    /// Softmax over the router's logits `[T, E]`, top-k (lower index first on ties),
    /// optionally renormalised, planned on the host.
    fn moe_route(&self, logits: &Self::Buf, top_k: usize, renorm: bool) -> DevResult<Routing>;
    /// `out[i] = x[routing.rows[i]]` (expert order; `x`'s kind).
    fn moe_gather(&self, x: &Self::Buf, routing: &Routing, out: &mut Self::Buf) -> DevResult<()>;
    /// `out[t] = sigmoid(x[t] · w)`, one value per row (the shared expert's gate).
    fn moe_shared_gate(
        &self,
        x: &Self::Buf,
        w: &Self::Vector,
        out: &mut Self::Buf,
    ) -> DevResult<()>;
    /// `out[t] = Σ_e w_te · y[row_te]` in ascending expert order from zero, then, with a
    /// shared expert `(shared, gate)`, `+ gate[t] · shared[t]`.
    fn moe_combine(
        &self,
        y: &Self::Buf,
        routing: &Routing,
        shared: Option<(&Self::Buf, &Self::Buf)>,
        out: &mut Self::Buf,
    ) -> DevResult<()>;
    /// The group-limited sigmoid router ([`GroupedTopK`]) over the router's logits `[T, E]`
    /// with the choice bias `[E]`, planned on the host.
    fn moe_route_grouped(
        &self,
        logits: &Self::Buf,
        bias: &Self::Vector,
        router: &GroupedTopK,
    ) -> DevResult<Routing>;
    /// `out[t] = Σ_e w_te · y[row_te]` in ascending expert order from zero for the `tokens`
    /// tokens of `routing`, written in `out`'s kind.
    fn moe_weighted_sum(
        &self,
        y: &Self::Buf,
        routing: &Routing,
        tokens: usize,
        out: &mut Self::Buf,
    ) -> DevResult<()>;
    /// `out = x` (f32) in `out`'s kind: a linear layer's output as another one's input.
    fn cast(&self, x: &Self::Buf, out: &mut Self::Buf) -> DevResult<()>;
    /// `out[i] = x[rows[i]]` (f32).
    fn gather_rows(&self, x: &Self::Buf, rows: &[usize], out: &mut Self::Buf) -> DevResult<()>;
    /// Index of each row's largest value (first on ties).
    fn argmax(&self, logits: &Self::Buf) -> DevResult<Vec<u32>>;
    /// Before a forward's captures (the previous forward's downloads are done).
    fn capture_begin(&self, cap: &mut Self::Capture) -> DevResult<()>;
    /// Rows of `x` as capture slot `slot`, converted to the file dtype on the way out and,
    /// in the same pass, checked by the guard.
    fn capture(&self, cap: &mut Self::Capture, slot: usize, x: &Self::Buf) -> DevResult<()>;
    /// The forward's `[rows, K, H]` captured values as file-dtype bytes, and the rows the
    /// guard refused.
    fn capture_finish(&self, cap: &mut Self::Capture, rows: usize) -> DevResult<Captured>;
    /// Takes back [`Captured::bytes`] of an earlier step once the caller has cut them into
    /// requests, so a later step can write into the same allocation (default: dropped).
    fn capture_recycle(&self, _cap: &mut Self::Capture, _bytes: Vec<u8>) {}
}
