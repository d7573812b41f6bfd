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

use std::ops::Range;

pub use super::dsa::{DsaCall, IndexShape};
pub use super::dtype::{dtype_size, widen};
use super::plan::{BatchPlan, SeqState};
pub use super::qsa::QsaCall;
use super::rope::Rope;
use super::routing::{GroupedTopK, Routing};

#[path = "device_types.rs"]
mod types;
pub use types::*;
#[path = "attn_types.rs"]
mod attn_types;
pub use attn_types::*;
#[path = "host_table.rs"]
mod host_table;
pub use host_table::*;
#[path = "hyper_types.rs"]
mod hyper_types;
pub use hyper_types::*;

/// A compute device: memory for weights, caches and activations, and the fused ops.
pub trait Device: Send + Sync + Sized + 'static {
    /// Activations `[rows, width]`.
    type Buf: Send;
    /// A linear layer's weight (`[out, in]`, stored dtype) and optional f32 bias; also an
    /// embedding table.
    type Linear: Send + Sync;
    /// An embedding table only ever gathered from ([`HostTable`]).
    type Table: Send + Sync;
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
    /// A gather-only table: the CPU reads its rows where the checkpoint maps them.
    fn table(&self, table: HostTable) -> DevResult<Self::Table>;
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
    /// `out[t] = table[tokens[t]] · scale` (f32; Gemma scales its embeddings, the others pass
    /// 1, which changes no bit).
    fn embed(
        &self,
        step: &Self::Step<'_>,
        table: &Self::Linear,
        scale: f32,
        out: &mut Self::Buf,
    ) -> DevResult<()>;
    /// [`Device::embed`] from a gather-only table.
    fn embed_table(
        &self,
        step: &Self::Step<'_>,
        table: &Self::Table,
        scale: f32,
        out: &mut Self::Buf,
    ) -> DevResult<()>;
    /// Rows of a gather-only table by id, `per_row` of them side by side in each output row:
    /// `out[t] = [table[ids[t·k]] | … | table[ids[t·k + k - 1]]]`, `k` = `per_row` (f32;
    /// Qwen4-Exp's n-gram embeddings). An id past the table is an error.
    fn table_rows(
        &self,
        table: &Self::Table,
        ids: &[u32],
        per_row: usize,
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
    /// `out = norm(x) · w` per row, or per `w.len()`-wide piece of each row where `w` is
    /// shorter (Gemma 4's per-layer embeddings: one norm per layer's piece); `w.len()` must
    /// divide the row width.
    fn norm(
        &self,
        x: &Self::Buf,
        w: &Self::Vector,
        norm: RowNorm,
        out: &mut Self::Buf,
    ) -> DevResult<()>;
    /// `x += y` (exact, f32), then `out = norm(x) · w`.
    fn add_norm(
        &self,
        x: &mut Self::Buf,
        y: &Self::Buf,
        w: &Self::Vector,
        norm: RowNorm,
        out: &mut Self::Buf,
    ) -> DevResult<()>;
    /// `x += y`.
    fn add(&self, x: &mut Self::Buf, y: &Self::Buf) -> DevResult<()>;
    /// `x *= factor`, the f32 product rounded to the buffer's dtype (Granite's residual
    /// multiplier on a sublayer's output; MiMo-V2-Flash's value scale on an attention output,
    /// which a CUDA bf16 / f16 device writes in the GEMM input dtype).
    fn scale(&self, x: &mut Self::Buf, factor: f32) -> DevResult<()>;
    /// `x = clamp(x, -limit, limit)`, NaN kept (OLMo's `clip_qkv` on the fused q / k / v
    /// projection, before RoPE: torch's `clamp_`).
    fn clamp(&self, x: &mut Self::Buf, limit: f32) -> DevResult<()>;
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
    /// DeepSeek Sparse Attention's indexer ([`crate::kernels::dsa`]): `k` (`[T, head_dim]`,
    /// `wk`'s output) LayerNormed and rotated, `q` (`[T, heads · head_dim]`) rotated, in place;
    /// every token's key into the index cache, then each token past `topk` keys picks its keys
    /// by `w` (`[T, heads]`, `weights_proj`'s output), kept in `kv` for the next sparse
    /// [`Device::attention`].
    fn dsa_select(
        &self,
        step: &Self::Step<'_>,
        kv: &mut Self::Kv,
        call: &DsaCall<'_, Self>,
        q: &mut Self::Buf,
        k: &mut Self::Buf,
        w: &Self::Buf,
    ) -> DevResult<()>;
    /// Qwen4-Exp's QSA indexer ([`crate::kernels::qsa`]): `q` (`[T, heads · head_dim]`)
    /// RMSNormed and rotated in place, the raw keys `k` (`[T, head_dim]`) into the index cache,
    /// then each token past `budget + ratio - 1` keys picks its blocks' keys, kept in `kv`
    /// for the next sparse [`Device::attention`] (`sparse: Some(dense_len)`).
    fn qsa_select(
        &self,
        step: &Self::Step<'_>,
        kv: &mut Self::Kv,
        call: &QsaCall<'_, Self>,
        q: &mut Self::Buf,
        k: &Self::Buf,
    ) -> DevResult<()>;
    /// Multi-head latent attention's heads as a fused projection for [`Device::attention`]:
    /// `out` `[T, 3 · heads · D]` = `[q | k | v]`, `D` = [`MlaDims::head_dim`]. A q or k head is
    /// its rotated dims (in `rotate_half` order, [`MlaDims::rope_source`]) then its `nope` dims;
    /// every k head's rotated dims are the shared `k_rope`; a v head is its `v` dims then zeros.
    /// Inputs, f32: `q` `[T, heads · D]` (per head `nope | rope`), `kv` `[T, heads · (nope +
    /// v)]` (per head `nope | v`), `k_rope` `[T, rope]`.
    fn mla_heads(
        &self,
        q: &Self::Buf,
        kv: &Self::Buf,
        k_rope: &Self::Buf,
        dims: &MlaDims,
        out: &mut Self::Buf,
    ) -> DevResult<()>;
    /// `out = f(x, g)` element by element over two column ranges of one width (of the same
    /// rows), written in `out`'s dtype ([`GateFn`]: gated attention's `x · sigmoid(g)`, Gemma 4's
    /// per-layer input gate `gelu_tanh(x) · g`, LFM2's short-conv gates `x · g`).
    fn gate(
        &self,
        x: Cols<'_, Self::Buf>,
        g: Cols<'_, Self::Buf>,
        f: GateFn,
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
    /// Gemma's GeGLU: `out[t, i] = gelu_tanh(gu[t, i]) · gu[t, I + i]` for `gu` `[T, 2I]`
    /// (torch's tanh-approximated GELU, f32).
    fn gelu_tanh_mul(&self, gate_up: &Self::Buf, out: &mut Self::Buf) -> DevResult<()>;
    /// `out = f(x)` element by element (an MLP's activation without a gate).
    fn unary(&self, x: &Self::Buf, f: UnaryAct, out: &mut Self::Buf) -> DevResult<()>;
    /// Causal depthwise conv1d over `x`'s columns (then SiLU where `call.silu`), the conv state
    /// carried per slot.
    fn conv1d(
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
    /// Per-head `w · rms_norm(x) · silu(z)` (heads of `w`'s length), or `· sigmoid(z)`.
    fn gdn_gated_norm(
        &self,
        x: &Self::Buf,
        z: Cols<'_, Self::Buf>,
        w: &Self::Vector,
        norm: (f64, NormGate),
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
    /// The Mamba-1 selective scan token by token: per channel `c` of the conv output `x`
    /// (`[T, inner]`) with `dt = softplus(dt[t, c] + dt_bias[c])`, state row
    /// `h[c] = exp(dt · A[c]) ⊙ h[c] + (dt · B) · x`, `y = C · h[c] + D[c] · x`; `bc` holds
    /// `[B | C]` (`d_state` each), each value times its `p.bc_weight`; into `out` (`[T, inner]`,
    /// f32).
    #[allow(clippy::too_many_arguments)]
    fn mamba1_scan(
        &self,
        step: &Self::Step<'_>,
        states: &mut Self::States,
        state_layer: usize,
        x_dt: (&Self::Buf, &Self::Buf),
        bc: Cols<'_, Self::Buf>,
        p: &Mamba1Params<'_, Self>,
        out: &mut Self::Buf,
    ) -> DevResult<()>;
    /// The Mamba-2 output `y` (f32) met by its gate `z` as `gate` says, into `out` (the
    /// out_proj GEMM's input).
    fn mamba2_gated_norm(
        &self,
        y: &Self::Buf,
        z: Cols<'_, Self::Buf>,
        gate: MambaGate<'_, Self::Vector>,
        out: &mut Self::Buf,
    ) -> DevResult<()>;
    /// Softmax over the router's logits `[T, E]`, top-k (lower index first on ties),
    /// optionally renormalised, planned on the host.
    fn moe_route(&self, logits: &Self::Buf, top_k: usize, renorm: bool) -> DevResult<Routing>;
    /// `out[i] = x[routing.rows[i]]` (expert order; `x`'s kind), times `scale[i]` where given
    /// (one per row, rounded to `x`'s kind once: Llama-4 scales the experts' inputs).
    fn moe_gather(
        &self,
        x: &Self::Buf,
        routing: &Routing,
        scale: Option<&[f32]>,
        out: &mut Self::Buf,
    ) -> DevResult<()>;
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
    /// One step of a hyper-connection (Qwen4-Exp's residual streams).
    fn hyper(&self, op: HyperOp<'_, Self>) -> DevResult<()>;
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

/// How a Mamba-2 mixer's scan output `y` meets its gate `z` before `out_proj`.
pub enum MambaGate<'a, V> {
    /// `h = y · silu(z)`, then `w · rms_norm(h)` over groups (Nemotron-H, Bamba, Granite 4.0;
    /// Falcon-H1 with `mamba_rms_norm` and not `mamba_norm_before_gate`).
    GateThenNorm(GroupNorm<'a, V>),
    /// `w · rms_norm(y)` over groups, then `· silu(z)` (Falcon-H1 with `mamba_rms_norm` and
    /// `mamba_norm_before_gate`).
    NormThenGate(GroupNorm<'a, V>),
    /// `y · silu(z)`, no norm (Falcon-H1 without `mamba_rms_norm`, as released).
    GateOnly,
}

/// An RMSNorm over groups of `group_size` channels with weight `w` (one value per channel).
pub struct GroupNorm<'a, V> {
    pub w: &'a V,
    pub group_size: usize,
    pub eps: f64,
}

impl<V> GroupNorm<'_, V> {
    /// Fails unless a weight of `len` values in groups of `group_size` covers rows of `width`
    /// (both devices' check).
    pub fn check(&self, len: usize, width: usize) -> DevResult<()> {
        let fits = len == width && self.group_size > 0 && width.is_multiple_of(self.group_size);
        match fits {
            true => Ok(()),
            false => Err(DeviceError::Invalid(format!(
                "Mamba-2 gated norm: a {len}-value weight in groups of {} over {width}-wide rows",
                self.group_size
            ))),
        }
    }
}

// By hand: a derive would ask `V: Copy` of the borrowed weight.
impl<V> Clone for GroupNorm<'_, V> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<V> Copy for GroupNorm<'_, V> {}
impl<V> Clone for MambaGate<'_, V> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<V> Copy for MambaGate<'_, V> {}
