//! [`CudaDevice`]: the [`Device`] ops on the CUDA kernels of this module. Memory, the step
//! plan and the simple ops are here; the ops with more geometry to check (GEMMs, attention,
//! the recurrent layers, MoE) are in `device_ops`, the associated types in `device_types`.
//!
//! Every op checks its operands' kinds, widths and row counts and its output's capacity on
//! the host before it launches anything: a kernel takes raw addresses and would otherwise
//! read or write past a buffer. All work is issued on the compute stream in order; only
//! [`Device::download`], [`Device::argmax`], [`Device::moe_route`] and the capture's finish
//! wait for it.

use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};

use super::api::{CudaUnavailable, DeviceInfo};
use super::capture::Capture;
use super::context::{CudaError, DevBuf, Gpu, panic_message, probe};
use super::device_ops::GatedNormKind;
use super::device_types::{
    CudaBuf, CudaLinear, CudaRope, CudaStep, check_len, glu_shape, invalid, same_f32,
};
use super::gated_norm;
use super::gemm::DevWeight;
use super::kv_cache::{DevKvCache, DevPlan};
use super::ops::{self, i32_of};
use super::recurrent::{DevSeqs, StateSlots};
use super::table::{CudaTable, HOST_TABLE_BYTES};
use crate::kernels::device::{
    AttnCall, BufKind, CaptureSpec, Captured, Cols, ConvCall, DevResult, Device, DsaCall, GateFn,
    GdnParams, HostMatrix, HostTable, HyperOp, KvShape, Mamba1Params, MambaGate, MambaParams,
    MlaDims, NormGate, QsaCall, RowNorm, UnaryAct, check_slot_copies,
};
use crate::kernels::dtype::{WeightDtype, dtype_size};
use crate::kernels::plan::{BatchPlan, SeqState};
use crate::kernels::rope::Rope;
use crate::kernels::routing::{GroupedTopK, Routing};

/// One CUDA device and the compute dtype of the model on it (the dtype of GEMM inputs,
/// weights and the KV cache). `Gpu` is `Send + Sync` (its `DeviceApi` is); the ops take `&self` and share no mutable host state, and the
/// caller (`ModelBackend`) drives one forward at a time.
pub struct CudaDevice {
    pub(super) gpu: Gpu,
    pub(super) dtype: WeightDtype,
    /// Gather-only tables larger than this stay on the host ([`HOST_TABLE_BYTES`]).
    pub(super) host_tables_above: usize,
}

impl CudaDevice {
    /// Probes device `ordinal`, creates its context and streams and compiles the kernels.
    pub fn new(ordinal: usize, dtype: WeightDtype) -> Result<Self, CudaError> {
        probe(ordinal)?;
        let gpu = catch_unwind(AssertUnwindSafe(|| Gpu::new(ordinal))).unwrap_or_else(|p| {
            Err(CudaError::Unavailable(CudaUnavailable::Init(format!(
                "CUDA set-up panicked: {}",
                panic_message(p.as_ref())
            ))))
        })?;
        tracing::info!(
            device = ordinal,
            name = %gpu.info.name,
            cc = ?gpu.info.compute_capability,
            dtype = dtype.torch_name(),
            "cuda device ready"
        );
        Ok(Self {
            gpu,
            dtype,
            host_tables_above: HOST_TABLE_BYTES,
        })
    }

    /// Gather-only tables of more than `bytes` stay on the host, their rows gathered there.
    pub fn with_host_tables_above(self, bytes: usize) -> Self {
        Self {
            host_tables_above: bytes,
            ..self
        }
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.gpu.info
    }

    /// The element type of a buffer of `kind`.
    fn kind_dtype(&self, kind: BufKind) -> WeightDtype {
        match kind {
            BufKind::F32 => WeightDtype::F32,
            BufKind::GemmIn => self.dtype,
        }
    }
}

impl Device for CudaDevice {
    type Buf = CudaBuf;
    type Linear = CudaLinear;
    type Table = CudaTable;
    type Vector = DevBuf<f32>;
    type Rope = CudaRope;
    type Kv = DevKvCache;
    type States = StateSlots;
    type Capture = Capture;
    type Step<'a> = CudaStep<'a>;

    fn describe(&self) -> String {
        let i = &self.gpu.info;
        let (major, minor) = i.compute_capability;
        let dtype = self.dtype.torch_name();
        format!("cuda:{} {} (sm_{major}{minor}, {dtype})", i.ordinal, i.name)
    }

    fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        f()
    }

    fn linear(&self, weight: HostMatrix<'_>, bias: Option<Vec<f32>>) -> DevResult<CudaLinear> {
        // Only a matrix stored in another dtype is converted; the rest go up as they are.
        let weight = match weight.dtype == self.dtype {
            true => weight,
            false => weight.to_dtype(self.dtype),
        };
        if let Some(b) = bias.as_ref().filter(|b| b.len() != weight.rows) {
            return invalid(format!("bias of {} for {} rows", b.len(), weight.rows));
        }
        Ok(CudaLinear {
            w: DevWeight::upload(&self.gpu, &weight)?,
            bias: bias.map(|b| self.gpu.upload(&b)).transpose()?,
        })
    }

    fn table(&self, table: HostTable) -> DevResult<CudaTable> {
        self.table_op(table)
    }

    fn vector(&self, values: &[f32]) -> DevResult<DevBuf<f32>> {
        Ok(self.gpu.upload(values)?)
    }

    fn rope_table(&self, rope: &Rope) -> DevResult<CudaRope> {
        Ok(CudaRope {
            inv_freq: self.gpu.upload(rope.inv_freq())?,
            scale: rope.scale(),
        })
    }

    fn buffer(&self, rows: usize, width: usize, kind: BufKind) -> DevResult<CudaBuf> {
        let dtype = self.kind_dtype(kind);
        let bytes = rows
            .checked_mul(width)
            .and_then(|n| n.checked_mul(dtype_size(dtype)));
        let Some(bytes) = bytes else {
            return invalid(format!("a [{rows}, {width}] buffer overflows"));
        };
        let mem = self.gpu.zeros(bytes)?;
        Ok(CudaBuf::new(mem, dtype, rows * width, width))
    }

    fn kv_cache(&self, s: KvShape) -> DevResult<DevKvCache> {
        // The kernels take these as i32.
        i32_of(s.num_blocks, "num_blocks")?;
        i32_of(s.block_size, "block_size")?;
        i32_of(s.kv_dim, "kv_dim")?;
        let g = &self.gpu;
        let cache = DevKvCache::new(g, s, self.dtype)?;
        Ok(cache)
    }

    fn state_cache(&self, shapes: &[(usize, usize)], slots: usize) -> DevResult<StateSlots> {
        Ok(StateSlots::new(&self.gpu, shapes, slots)?)
    }

    fn copy_state_slots(
        &self,
        states: &mut StateSlots,
        copies: &[(usize, usize)],
    ) -> DevResult<()> {
        check_slot_copies(copies, states.num_slots())?;
        Ok(states.copy_slots(&self.gpu, copies)?)
    }

    fn capture_buffer(&self, spec: CaptureSpec) -> DevResult<Capture> {
        Ok(Capture::new(&self.gpu, spec)?)
    }

    fn upload(&self, rows: &[f32], width: usize, out: &mut CudaBuf) -> DevResult<()> {
        out.upload(&self.gpu, rows, width)
    }

    fn download(&self, x: &CudaBuf) -> DevResult<Vec<f32>> {
        x.download(&self.gpu)
    }

    fn begin<'a>(
        &self,
        tokens: &'a [u32],
        plan: &'a BatchPlan<'a>,
        seqs: &'a [SeqState],
        states: Option<&mut StateSlots>,
    ) -> DevResult<CudaStep<'a>> {
        let t = plan.num_tokens();
        if tokens.len() != t {
            return invalid(format!("{} token ids for a plan of {t}", tokens.len()));
        }
        let gpu = &self.gpu;
        let dev_plan = DevPlan::new(gpu, tokens, plan)?;
        let dev_seqs = match states {
            Some(states) => {
                let s = DevSeqs::new(gpu, seqs, t)?;
                states.reset_fresh(gpu, &s)?;
                Some(s)
            }
            None => None,
        };
        Ok(CudaStep::new(dev_plan, dev_seqs, tokens))
    }

    fn embed(
        &self,
        step: &CudaStep<'_>,
        table: &CudaLinear,
        scale: f32,
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        let t = step.plan.num_tokens;
        out.f32("embed")?;
        out.set(t, table.w.cols, "embed")?;
        let tokens = step.plan.tokens.ptr();
        Ok(ops::embed(
            &self.gpu,
            (tokens, &table.w, scale),
            out.ptr(),
            t,
        )?)
    }

    fn embed_table(
        &self,
        step: &CudaStep<'_>,
        table: &CudaTable,
        scale: f32,
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        self.embed_table_op(step, table, scale, out)
    }

    fn table_rows(&self, t: &CudaTable, ids: &[u32], k: usize, out: &mut CudaBuf) -> DevResult<()> {
        self.table_rows_op(t, ids, k, out)
    }

    fn matmul(&self, x: &CudaBuf, w: &CudaLinear, out: &mut CudaBuf) -> DevResult<()> {
        self.matmul_rows_into(x, 0..x.rows(), w, out, true)
    }

    fn matmul_rows(
        &self,
        x: &CudaBuf,
        rows: Range<usize>,
        w: &CudaLinear,
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        self.matmul_rows_into(x, rows, w, out, false)
    }

    fn resize(&self, out: &mut CudaBuf, n: usize, width: usize) -> DevResult<()> {
        out.set(n, width, "resize")?;
        Ok(self.gpu.memset_zero(out.ptr(), n * width * out.elem())?)
    }

    fn norm(&self, x: &CudaBuf, w: &DevBuf<f32>, op: RowNorm, out: &mut CudaBuf) -> DevResult<()> {
        x.f32("norm input")?;
        let per = op.kind.weights_per_value();
        let n = w.len() / per;
        if n == 0 || n * per != w.len() || !x.width().is_multiple_of(n) {
            let what = format!("norm: weight of {} for rows of {}", w.len(), x.width());
            return invalid(what);
        }
        out.set(x.rows(), x.width(), "norm")?;
        // Dense rows: each row's `width / n` pieces are rows of `n` one after another.
        let rows = x.rows() * (x.width() / n);
        let (g, dt) = (&self.gpu, out.dtype());
        Ok(ops::norm(g, x.ptr(), w.ptr(), out.ptr(), dt, rows, n, op)?)
    }

    fn add_norm(
        &self,
        x: &mut CudaBuf,
        y: &CudaBuf,
        w: &DevBuf<f32>,
        norm: RowNorm,
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        same_f32(x, y, "add_norm")?;
        check_len(
            w,
            x.width() * norm.kind.weights_per_value(),
            "add_norm weight",
        )?;
        out.set(x.rows(), x.width(), "add_norm")?;
        let (g, rows, n) = (&self.gpu, x.rows(), x.width());
        let (xp, yp, op) = (x.ptr(), y.ptr(), out.ptr());
        Ok(ops::add_norm(
            g,
            xp,
            yp,
            w.ptr(),
            op,
            out.dtype(),
            rows,
            n,
            norm,
        )?)
    }

    fn add(&self, x: &mut CudaBuf, y: &CudaBuf) -> DevResult<()> {
        same_f32(x, y, "add")?;
        Ok(ops::add(&self.gpu, x.ptr(), y.ptr(), x.len())?)
    }

    fn scale(&self, x: &mut CudaBuf, factor: f32) -> DevResult<()> {
        Ok(ops::scale(&self.gpu, x.ptr(), x.dtype(), factor, x.len())?)
    }

    fn clamp(&self, x: &mut CudaBuf, limit: f32) -> DevResult<()> {
        Ok(ops::clamp(&self.gpu, x.ptr(), x.dtype(), limit, x.len())?)
    }

    fn attention(
        &self,
        step: &CudaStep<'_>,
        kv: &mut DevKvCache,
        qkv: &mut CudaBuf,
        call: &AttnCall<'_, Self>,
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        self.attention_op(step, kv, qkv, call, out)
    }

    fn dsa_select(
        &self,
        step: &CudaStep<'_>,
        kv: &mut DevKvCache,
        call: &DsaCall<'_, Self>,
        q: &mut CudaBuf,
        k: &mut CudaBuf,
        w: &CudaBuf,
    ) -> DevResult<()> {
        self.dsa_select_op(step, kv, call, (q, k, w))
    }

    fn qsa_select(
        &self,
        step: &CudaStep<'_>,
        kv: &mut DevKvCache,
        call: &QsaCall<'_, Self>,
        q: &mut CudaBuf,
        k: &CudaBuf,
    ) -> DevResult<()> {
        self.qsa_select_op(step, kv, call, (q, k))
    }

    fn mla_heads(
        &self,
        q: &CudaBuf,
        kv: &CudaBuf,
        k_rope: &CudaBuf,
        dims: &MlaDims,
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        let Some(widths) = dims.input_widths() else {
            return invalid(format!("mla_heads: v wider than a head in {dims:?}"));
        };
        for (b, w) in [q, kv, k_rope].into_iter().zip(widths) {
            b.f32("mla_heads input")?;
            if b.width() != w || b.rows() != q.rows() {
                return invalid(format!("mla_heads: inputs do not fit {dims:?}"));
            }
        }
        out.set(q.rows(), dims.out_width(), "mla_heads")?;
        let inputs = (q.ptr(), kv.ptr(), k_rope.ptr());
        Ok(ops::mla_heads(
            &self.gpu,
            inputs,
            out.ptr(),
            q.rows(),
            dims,
        )?)
    }

    fn gate(
        &self,
        x: Cols<'_, CudaBuf>,
        g: Cols<'_, CudaBuf>,
        f: GateFn,
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        self.gate_op(x, g, f, out)
    }

    fn silu_mul(&self, gate_up: &CudaBuf, out: &mut CudaBuf) -> DevResult<()> {
        let (rows, inter) = glu_shape(gate_up, out, "silu_mul")?;
        let (g, dt) = (&self.gpu, out.dtype());
        Ok(ops::silu_mul(g, gate_up.ptr(), out.ptr(), dt, rows, inter)?)
    }

    fn swiglu_clamped(
        &self,
        gate_up: &CudaBuf,
        alpha_limit: (f32, f32),
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        let (rows, inter) = glu_shape(gate_up, out, "swiglu_clamped")?;
        let (g, dt) = (&self.gpu, out.dtype());
        let io = (gate_up.ptr(), out.ptr());
        Ok(ops::swiglu_clamped(g, io, dt, (rows, inter), alpha_limit)?)
    }

    fn gelu_tanh_mul(&self, gate_up: &CudaBuf, out: &mut CudaBuf) -> DevResult<()> {
        let (rows, inter) = glu_shape(gate_up, out, "gelu_tanh_mul")?;
        let (g, dt) = (&self.gpu, out.dtype());
        Ok(ops::gelu_tanh_mul(
            g,
            (gate_up.ptr(), out.ptr()),
            dt,
            (rows, inter),
        )?)
    }

    fn unary(&self, x: &CudaBuf, f: UnaryAct, out: &mut CudaBuf) -> DevResult<()> {
        x.f32("activation input")?;
        out.set(x.rows(), x.width(), "activation")?;
        let (g, dt) = (&self.gpu, out.dtype());
        Ok(gated_norm::unary(g, (x.ptr(), out.ptr()), f, dt, x.len())?)
    }

    fn conv1d(
        &self,
        step: &CudaStep<'_>,
        states: &mut StateSlots,
        x: Cols<'_, CudaBuf>,
        call: &ConvCall<'_, Self>,
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        self.conv1d_op(step, states, x, call, out)
    }

    fn gated_delta_rule(
        &self,
        step: &CudaStep<'_>,
        states: &mut StateSlots,
        state_layer: usize,
        qkv: &mut CudaBuf,
        beta_alpha: (Cols<'_, CudaBuf>, Cols<'_, CudaBuf>),
        p: &GdnParams<'_, Self>,
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        self.gated_delta_op(step, states, state_layer, qkv, beta_alpha, p, out)
    }

    fn gdn_gated_norm(
        &self,
        x: &CudaBuf,
        z: Cols<'_, CudaBuf>,
        w: &DevBuf<f32>,
        (eps, gate): (f64, NormGate),
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        self.gated_norm_op(x, z, GatedNormKind::PerHead(w, gate, eps), out)
    }

    fn mamba2_scan(
        &self,
        step: &CudaStep<'_>,
        states: &mut StateSlots,
        state_layer: usize,
        xbc: &CudaBuf,
        dt: Cols<'_, CudaBuf>,
        p: &MambaParams<'_, Self>,
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        self.mamba2_scan_op(step, states, state_layer, xbc, dt, p, out)
    }

    fn mamba1_scan(
        &self,
        step: &CudaStep<'_>,
        states: &mut StateSlots,
        state_layer: usize,
        x_dt: (&CudaBuf, &CudaBuf),
        bc: Cols<'_, CudaBuf>,
        p: &Mamba1Params<'_, Self>,
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        self.mamba1_scan_op(step, states, state_layer, x_dt, bc, p, out)
    }

    fn mamba2_gated_norm(
        &self,
        y: &CudaBuf,
        z: Cols<'_, CudaBuf>,
        gate: MambaGate<'_, DevBuf<f32>>,
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        self.gated_norm_op(y, z, GatedNormKind::Mamba(gate), out)
    }

    fn moe_route(&self, logits: &CudaBuf, top_k: usize, renorm: bool) -> DevResult<Routing> {
        self.moe_route_op(logits, top_k, renorm)
    }

    fn moe_gather(
        &self,
        x: &CudaBuf,
        routing: &Routing,
        scale: Option<&[f32]>,
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        self.moe_gather_op(x, routing, scale, out)
    }

    fn moe_shared_gate(&self, x: &CudaBuf, w: &DevBuf<f32>, out: &mut CudaBuf) -> DevResult<()> {
        self.moe_shared_gate_op(x, w, out)
    }

    fn moe_combine(
        &self,
        y: &CudaBuf,
        routing: &Routing,
        shared: Option<(&CudaBuf, &CudaBuf)>,
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        self.moe_combine_op(y, routing, shared, out)
    }

    fn moe_route_grouped(
        &self,
        logits: &CudaBuf,
        bias: &DevBuf<f32>,
        router: &GroupedTopK,
    ) -> DevResult<Routing> {
        self.moe_route_grouped_op(logits, bias, router)
    }

    fn moe_weighted_sum(
        &self,
        y: &CudaBuf,
        routing: &Routing,
        tokens: usize,
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        self.moe_weighted_sum_op(y, routing, tokens, out)
    }

    fn hyper(&self, op: HyperOp<'_, Self>) -> DevResult<()> {
        self.hyper_op(op)
    }

    fn cast(&self, x: &CudaBuf, out: &mut CudaBuf) -> DevResult<()> {
        self.cast_op(x, out)
    }

    fn gather_rows(&self, x: &CudaBuf, rows: &[usize], out: &mut CudaBuf) -> DevResult<()> {
        self.gather_rows_op(x, rows, out)
    }

    fn argmax(&self, logits: &CudaBuf) -> DevResult<Vec<u32>> {
        logits.f32("argmax")?;
        let (g, n) = (&self.gpu, logits.rows());
        let out: DevBuf<u32> = g.zeros(n)?;
        ops::argmax(g, logits.ptr(), n, logits.width(), out.ptr())?;
        Ok(g.download(&out, n)?)
    }

    fn capture_begin(&self, cap: &mut Capture) -> DevResult<()> {
        Ok(cap.begin()?)
    }

    fn capture(&self, cap: &mut Capture, slot: usize, x: &CudaBuf) -> DevResult<()> {
        x.f32("capture")?;
        if x.width() != cap.hidden() {
            return invalid(format!(
                "capture of {}-wide rows (hidden {})",
                x.width(),
                cap.hidden()
            ));
        }
        Ok(cap.capture(&self.gpu, slot, x.ptr(), x.rows())?)
    }

    fn capture_finish(&self, cap: &mut Capture, rows: usize) -> DevResult<Captured> {
        Ok(cap.finish(&self.gpu, rows)?)
    }

    fn capture_recycle(&self, cap: &mut Capture, bytes: Vec<u8>) {
        cap.recycle(bytes);
    }
}

#[cfg(test)]
#[path = "device_tests.rs"]
mod tests;
