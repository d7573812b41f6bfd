//! [`CpuDevice`]: the [`Device`] ops on the CPU kernels of this module, every op inside the
//! device's rayon pool. Activations are f32; bf16 weights stay bf16 and are multiplied by the
//! [`Bf16Kernel`] chosen at start (f16 weights are widened to f32 at load).

use std::sync::atomic::{AtomicBool, Ordering};

use std::ops::Range;

use super::bf16::{Bf16Kernel, Half};
use super::capture::CpuCapture;
use super::exp::gelu_tanh_times;
use super::matmul::{Linear, Weight};
use super::moe::route_top_k;
use super::moe_grouped::{route_grouped, weighted_sum};
use super::recurrent::sigmoid;
use super::{norm, ops};
use crate::kernels::device::{
    AttnCall, BufKind, CaptureSpec, Captured, Cols, ConvCall, DevResult, Device, DeviceError,
    DsaCall, GateFn, GdnParams, HostMatrix, HostTable, HyperOp, KvShape, Mamba1Params, MambaGate,
    MambaParams, MlaDims, NormGate, QsaCall, RowNorm, UnaryAct, check_slot_copies, table_id_rows,
};
use crate::kernels::dtype::WeightDtype;
use crate::kernels::plan::{BatchPlan, SeqState};
use crate::kernels::rope::Rope;
use crate::kernels::routing::{GroupedTopK, Routing};

/// The CPU: a private rayon pool of `threads` threads.
pub struct CpuDevice {
    pool: rayon::ThreadPool,
    threads: usize,
    bf16: Bf16Kernel,
    /// A bf16 weight was loaded: the model is bf16, so its attention may round to bf16 too
    /// (the AMX attention task).
    bf16_weights: AtomicBool,
    /// An f16 weight was loaded (multiplied on `bf16.for_f16()`).
    f16_weights: AtomicBool,
}

#[path = "device_setup.rs"]
mod device_setup;

#[path = "device_types.rs"]
mod types;
pub use types::{CpuBuf, CpuKv, CpuStates, CpuStep};
use types::{check_gate, col_rows, expert_rows, gate_rows, gather_cols, gather_scaled, set};

#[path = "device_attention.rs"]
mod device_attention;
#[path = "device_hybrid.rs"]
mod device_hybrid;
#[path = "device_hyper.rs"]
mod device_hyper;
#[path = "device_moe.rs"]
mod device_moe;

impl Device for CpuDevice {
    type Buf = CpuBuf;
    type Linear = Linear;
    type Table = HostTable;
    type Vector = Vec<f32>;
    type Rope = Rope;
    type Kv = CpuKv;
    type States = CpuStates;
    type Capture = CpuCapture;
    type Step<'a> = CpuStep<'a>;

    fn describe(&self) -> String {
        self.description()
    }

    fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    fn linear(&self, weight: HostMatrix<'_>, bias: Option<Vec<f32>>) -> DevResult<Linear> {
        let (out, inp) = (weight.rows, weight.cols);
        let w = match weight.dtype {
            // (In the device's pool: `to_f32` and the packing run on rayon.)
            WeightDtype::F32 => Weight::F32(self.pool.install(|| weight.to_f32())),
            WeightDtype::Bf16 => self.packed(&weight, Half::Bf16),
            WeightDtype::F16 => self.packed(&weight, Half::F16),
        };
        Ok(Linear {
            w,
            b: bias,
            out,
            inp,
        })
    }

    fn table(&self, table: HostTable) -> DevResult<HostTable> {
        // Rows are read where the checkpoint maps them: nothing copied.
        Ok(table)
    }

    fn vector(&self, values: &[f32]) -> DevResult<Vec<f32>> {
        Ok(values.to_vec())
    }

    fn rope_table(&self, rope: &Rope) -> DevResult<Rope> {
        Ok(rope.clone())
    }

    fn buffer(&self, _rows: usize, width: usize, _kind: BufKind) -> DevResult<CpuBuf> {
        Ok(CpuBuf {
            data: Vec::new(),
            width,
        })
    }

    fn kv_cache(&self, s: KvShape) -> DevResult<CpuKv> {
        CpuKv::new(s)
    }

    fn state_cache(&self, shapes: &[(usize, usize)], slots: usize) -> DevResult<CpuStates> {
        CpuStates::new(shapes, slots)
    }

    fn copy_state_slots(&self, states: &mut CpuStates, copies: &[(usize, usize)]) -> DevResult<()> {
        check_slot_copies(copies, states.cache.num_slots())?;
        states.cache.copy_slots(copies);
        Ok(())
    }

    fn capture_buffer(&self, spec: CaptureSpec) -> DevResult<CpuCapture> {
        Ok(CpuCapture::new(spec))
    }

    fn upload(&self, rows: &[f32], width: usize, out: &mut CpuBuf) -> DevResult<()> {
        out.data.clear();
        out.data.extend_from_slice(rows);
        set(out, width);
        Ok(())
    }

    fn download(&self, x: &CpuBuf) -> DevResult<Vec<f32>> {
        Ok(x.data.clone())
    }

    fn begin<'a>(
        &self,
        tokens: &'a [u32],
        plan: &'a BatchPlan<'a>,
        seqs: &'a [SeqState],
        states: Option<&mut CpuStates>,
    ) -> DevResult<CpuStep<'a>> {
        if let Some(s) = states {
            s.cache.reset_fresh(seqs);
        }
        Ok(CpuStep { tokens, plan, seqs })
    }

    fn embed(
        &self,
        step: &CpuStep<'_>,
        table: &Linear,
        scale: f32,
        out: &mut CpuBuf,
    ) -> DevResult<()> {
        gather_scaled(step.tokens, (table.inp, scale), out, |t, row| {
            if t >= table.out {
                return Err(format!("token {t} past an embedding of {}", table.out));
            }
            table.row_into(t, row);
            Ok(())
        })
    }

    fn embed_table(
        &self,
        step: &CpuStep<'_>,
        table: &HostTable,
        scale: f32,
        out: &mut CpuBuf,
    ) -> DevResult<()> {
        gather_scaled(step.tokens, (table.cols, scale), out, |t, row| {
            table.row_into(t, row)
        })
    }

    fn table_rows(
        &self,
        table: &HostTable,
        ids: &[u32],
        per_row: usize,
        out: &mut CpuBuf,
    ) -> DevResult<()> {
        table_id_rows(ids.len(), per_row)?;
        gather_scaled(ids, (table.cols, 1.0), out, |t, row| table.row_into(t, row))?;
        set(out, per_row * table.cols);
        Ok(())
    }

    fn matmul(&self, x: &CpuBuf, w: &Linear, out: &mut CpuBuf) -> DevResult<()> {
        w.forward(&x.data, x.rows(), &mut out.data, self.threads);
        set(out, w.out);
        Ok(())
    }

    fn matmul_rows(
        &self,
        x: &CpuBuf,
        rows: Range<usize>,
        w: &Linear,
        out: &mut CpuBuf,
    ) -> DevResult<()> {
        let (xs, ys) = expert_rows("matmul_rows", x, rows.clone(), (w.inp, w.out), out)?;
        // Straight into the rows of `out`: no per-expert buffer, zeroing or copy.
        w.forward_into(xs, rows.len(), ys, self.threads);
        Ok(())
    }

    fn matmul_rows_silu_mul(
        &self,
        x: &CpuBuf,
        rows: Range<usize>,
        w: &Linear,
        out: &mut CpuBuf,
    ) -> DevResult<bool> {
        let shape = (w.inp, w.out / 2);
        let (xs, ys) = expert_rows("matmul_rows_silu_mul", x, rows.clone(), shape, out)?;
        Ok(w.forward_silu_mul_into(xs, rows.len(), ys, self.threads))
    }

    fn resize(&self, out: &mut CpuBuf, n: usize, width: usize) -> DevResult<()> {
        // Zeroes only growth (the trait's contract: every row is written before it is read).
        out.data.resize(n * width, 0.0);
        set(out, width);
        Ok(())
    }

    fn norm(&self, x: &CpuBuf, w: &Vec<f32>, op: RowNorm, out: &mut CpuBuf) -> DevResult<()> {
        let per = op.kind.weights_per_value();
        if w.is_empty() || !w.len().is_multiple_of(per) || !x.width.is_multiple_of(w.len() / per) {
            return Err(DeviceError::Invalid(format!(
                "norm: weight of {} for rows of {}",
                w.len(),
                x.width
            )));
        }
        norm::norm(&x.data, w, op, &mut out.data);
        set(out, x.width);
        Ok(())
    }

    fn add_norm(
        &self,
        x: &mut CpuBuf,
        y: &CpuBuf,
        w: &Vec<f32>,
        op: RowNorm,
        out: &mut CpuBuf,
    ) -> DevResult<()> {
        if x.data.len() != y.data.len() || x.width * op.kind.weights_per_value() != w.len() {
            return Err(DeviceError::Invalid(format!(
                "add_norm: x [{}, {}], y [{}, {}], weight {}",
                x.rows(),
                x.width,
                y.rows(),
                y.width,
                w.len()
            )));
        }
        norm::add_norm(&mut x.data, &y.data, w, op, &mut out.data);
        set(out, x.width);
        Ok(())
    }

    fn add(&self, x: &mut CpuBuf, y: &CpuBuf) -> DevResult<()> {
        ops::add_inplace(&mut x.data, &y.data);
        Ok(())
    }

    fn scale(&self, x: &mut CpuBuf, factor: f32) -> DevResult<()> {
        ops::scale_inplace(&mut x.data, factor);
        Ok(())
    }

    fn clamp(&self, x: &mut CpuBuf, limit: f32) -> DevResult<()> {
        ops::clamp_inplace(&mut x.data, limit);
        Ok(())
    }

    fn attention(
        &self,
        step: &CpuStep<'_>,
        kv: &mut CpuKv,
        qkv: &mut CpuBuf,
        call: &AttnCall<'_, Self>,
        out: &mut CpuBuf,
    ) -> DevResult<()> {
        let bf16 = self
            .bf16_weights
            .load(Ordering::Relaxed)
            .then_some(self.bf16);
        device_attention::attention(step, kv, qkv, call, out, bf16)
    }

    fn dsa_select(
        &self,
        step: &CpuStep<'_>,
        kv: &mut CpuKv,
        call: &DsaCall<'_, Self>,
        q: &mut CpuBuf,
        k: &mut CpuBuf,
        w: &CpuBuf,
    ) -> DevResult<()> {
        device_attention::dsa_select(step, kv, call, (q, k, w))
    }

    fn qsa_select(
        &self,
        step: &CpuStep<'_>,
        kv: &mut CpuKv,
        call: &QsaCall<'_, Self>,
        q: &mut CpuBuf,
        k: &CpuBuf,
    ) -> DevResult<()> {
        device_attention::qsa_select(step, kv, call, (q, k))
    }

    fn mla_heads(
        &self,
        q: &CpuBuf,
        kv: &CpuBuf,
        k_rope: &CpuBuf,
        dims: &MlaDims,
        out: &mut CpuBuf,
    ) -> DevResult<()> {
        device_attention::mla_heads(q, kv, k_rope, dims, out)
    }

    fn gate(
        &self,
        x: Cols<'_, CpuBuf>,
        g: Cols<'_, CpuBuf>,
        f: GateFn,
        out: &mut CpuBuf,
    ) -> DevResult<()> {
        match f {
            GateFn::Sigmoid => gate_rows("sigmoid gate", x, g, out, |a, g| a * sigmoid(g)),
            GateFn::GeluTanh => gate_rows("gelu_tanh gate", x, g, out, gelu_tanh_times),
            GateFn::Product => gate_rows("product gate", x, g, out, |a, g| a * g),
        }
    }

    fn silu_mul(&self, gate_up: &CpuBuf, out: &mut CpuBuf) -> DevResult<()> {
        let inter = gate_up.width / 2;
        ops::silu_mul(&gate_up.data, inter, &mut out.data);
        set(out, inter);
        Ok(())
    }

    fn matmul_silu_mul(
        &self,
        x: &CpuBuf,
        w: &Linear,
        wide: &mut CpuBuf,
        out: &mut CpuBuf,
    ) -> DevResult<()> {
        if w.forward_silu_mul(&x.data, x.rows(), &mut out.data, self.threads) {
            set(out, w.out / 2);
            return Ok(());
        }
        self.matmul(x, w, wide)?;
        self.silu_mul(wide, out)
    }

    fn swiglu_mlp(
        &self,
        x: &CpuBuf,
        (w, down): (&Linear, &Linear),
        (wide, act): (&mut CpuBuf, &mut CpuBuf),
        out: &mut CpuBuf,
    ) -> DevResult<()> {
        if w.forward_swiglu_down(down, &x.data, x.rows(), &mut out.data, self.threads) {
            set(out, down.out);
            return Ok(());
        }
        self.matmul_silu_mul(x, w, wide, act)?;
        self.matmul(act, down, out)
    }

    fn swiglu_clamped(
        &self,
        gate_up: &CpuBuf,
        alpha_limit: (f32, f32),
        out: &mut CpuBuf,
    ) -> DevResult<()> {
        let inter = gate_up.width / 2;
        ops::swiglu_clamped(&gate_up.data, inter, alpha_limit, &mut out.data);
        set(out, inter);
        Ok(())
    }

    fn gelu_tanh_mul(&self, gate_up: &CpuBuf, out: &mut CpuBuf) -> DevResult<()> {
        let inter = gate_up.width / 2;
        ops::gelu_tanh_mul(&gate_up.data, inter, &mut out.data);
        set(out, inter);
        Ok(())
    }

    fn unary(&self, x: &CpuBuf, f: UnaryAct, out: &mut CpuBuf) -> DevResult<()> {
        super::unary::unary(&x.data, f, &mut out.data);
        set(out, x.width);
        Ok(())
    }

    fn conv1d(
        &self,
        step: &CpuStep<'_>,
        states: &mut CpuStates,
        x: Cols<'_, CpuBuf>,
        call: &ConvCall<'_, Self>,
        out: &mut CpuBuf,
    ) -> DevResult<()> {
        device_hybrid::conv1d(step, states, x, call, out)
    }

    fn gated_delta_rule(
        &self,
        step: &CpuStep<'_>,
        states: &mut CpuStates,
        state_layer: usize,
        qkv: &mut CpuBuf,
        (beta, alpha): (Cols<'_, CpuBuf>, Cols<'_, CpuBuf>),
        p: &GdnParams<'_, Self>,
        out: &mut CpuBuf,
    ) -> DevResult<()> {
        device_hybrid::gated_delta_rule(step, states, state_layer, qkv, (beta, alpha), p, out)
    }

    fn gdn_gated_norm(
        &self,
        x: &CpuBuf,
        z: Cols<'_, CpuBuf>,
        w: &Vec<f32>,
        norm: (f64, NormGate),
        out: &mut CpuBuf,
    ) -> DevResult<()> {
        device_hybrid::gdn_gated_norm(x, z, w, norm, out)
    }

    fn mamba2_scan(
        &self,
        step: &CpuStep<'_>,
        states: &mut CpuStates,
        state_layer: usize,
        xbc: &CpuBuf,
        dt: Cols<'_, CpuBuf>,
        p: &MambaParams<'_, Self>,
        out: &mut CpuBuf,
    ) -> DevResult<()> {
        device_hybrid::mamba2_scan(step, states, state_layer, xbc, dt, p, out)
    }

    fn mamba1_scan(
        &self,
        step: &CpuStep<'_>,
        states: &mut CpuStates,
        state_layer: usize,
        x_dt: (&CpuBuf, &CpuBuf),
        bc: Cols<'_, CpuBuf>,
        p: &Mamba1Params<'_, Self>,
        out: &mut CpuBuf,
    ) -> DevResult<()> {
        device_hybrid::mamba1_scan(step, states, state_layer, x_dt, bc, p, out)
    }

    fn mamba2_gated_norm(
        &self,
        y: &CpuBuf,
        z: Cols<'_, CpuBuf>,
        gate: MambaGate<'_, Vec<f32>>,
        out: &mut CpuBuf,
    ) -> DevResult<()> {
        device_hybrid::mamba2_gated_norm(y, z, gate, out)
    }

    fn moe_route(&self, logits: &CpuBuf, top_k: usize, renorm: bool) -> DevResult<Routing> {
        let (ids, weights) = route_top_k(&logits.data, logits.width, top_k, renorm);
        Routing::build(&ids, &weights, logits.rows(), top_k, logits.width)
            .map_err(DeviceError::Invalid)
    }

    fn moe_gather(
        &self,
        x: &CpuBuf,
        routing: &Routing,
        scale: Option<&[f32]>,
        out: &mut CpuBuf,
    ) -> DevResult<()> {
        let rows: Vec<usize> = routing.rows.iter().map(|&r| r as usize).collect();
        self.gather_rows(x, &rows, out)?;
        device_moe::scale_rows(out, scale)
    }

    fn moe_shared_gate(&self, x: &CpuBuf, w: &Vec<f32>, out: &mut CpuBuf) -> DevResult<()> {
        device_moe::moe_shared_gate(x, w, out)
    }

    fn moe_combine(
        &self,
        y: &CpuBuf,
        routing: &Routing,
        shared: Option<(&CpuBuf, &CpuBuf)>,
        out: &mut CpuBuf,
    ) -> DevResult<()> {
        device_moe::moe_combine(y, routing, shared, out)
    }

    fn moe_route_grouped(
        &self,
        logits: &CpuBuf,
        bias: &Vec<f32>,
        router: &GroupedTopK,
    ) -> DevResult<Routing> {
        let e = logits.width;
        let (ids, weights) =
            route_grouped(&logits.data, bias, e, router).map_err(DeviceError::Invalid)?;
        Routing::build(&ids, &weights, logits.rows(), router.top_k, e).map_err(DeviceError::Invalid)
    }

    fn moe_weighted_sum(
        &self,
        y: &CpuBuf,
        routing: &Routing,
        tokens: usize,
        out: &mut CpuBuf,
    ) -> DevResult<()> {
        weighted_sum(&y.data, routing, tokens, y.width, &mut out.data);
        set(out, y.width);
        Ok(())
    }

    fn hyper(&self, op: HyperOp<'_, Self>) -> DevResult<()> {
        device_hyper::hyper(op)
    }

    fn cast(&self, x: &CpuBuf, out: &mut CpuBuf) -> DevResult<()> {
        out.data.clear();
        out.data.extend_from_slice(&x.data);
        set(out, x.width);
        Ok(())
    }

    fn gather_rows(&self, x: &CpuBuf, rows: &[usize], out: &mut CpuBuf) -> DevResult<()> {
        types::gather_rows(x, rows, out)
    }

    fn argmax(&self, logits: &CpuBuf) -> DevResult<Vec<u32>> {
        Ok(logits
            .data
            .chunks_exact(logits.width.max(1))
            .map(|l| ops::argmax(l) as u32)
            .collect())
    }

    fn capture_begin(&self, cap: &mut CpuCapture) -> DevResult<()> {
        cap.begin();
        Ok(())
    }

    fn capture(&self, cap: &mut CpuCapture, slot: usize, x: &CpuBuf) -> DevResult<()> {
        cap.capture(slot, &x.data, x.width)
    }

    fn capture_finish(&self, cap: &mut CpuCapture, rows: usize) -> DevResult<Captured> {
        Ok(cap.finish(rows))
    }

    fn capture_recycle(&self, cap: &mut CpuCapture, bytes: Vec<u8>) {
        cap.recycle(bytes);
    }
}
