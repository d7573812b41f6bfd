//! The [`CudaDevice`] ops with the most geometry to check: GEMMs on whole buffers or row
//! ranges, attention over the paged cache, the recurrent layers (conv1d, Gated DeltaNet,
//! Mamba-2, their gated norms), MoE and row gathers. Each checks its operands on the host, then
//! calls the launchers of [`super::gemm`], [`super::kv_cache`], [`super::recurrent`],
//! [`super::moe`] and [`super::ops`] with the argument lists the per-architecture CUDA code used
//! before the device-ops trait.

use std::ops::Range;

use super::context::DevBuf;
use super::device::CudaDevice;
use super::device_types::{CudaBuf, CudaLinear, CudaStep, check_len, cols, invalid};
use super::gated_norm::{self, GatedNormIo};
use super::gemm;
use super::kv_cache::{DevKvCache, DevSoftmax, QkvRows};
use super::moe::{self, CombineIo};
use super::ops;
use super::recurrent::{self, ConvIo, GdnIo, MambaIo, StateSlots};
use super::recurrent_chunked::Recurrence;
use crate::kernels::device::{
    AttnCall, Cols, ConvCall, DevResult, GateFn, GdnParams, MambaGate, MambaParams, NormGate,
};
use crate::kernels::routing::Routing;

/// Fails unless `rows` (of `what`) is the step's token count.
pub(super) fn check_rows(rows: usize, t: usize, what: &str) -> DevResult<()> {
    if rows != t {
        return invalid(format!("{what}: {rows} rows for a step of {t} tokens"));
    }
    Ok(())
}

/// Fails unless every index of `v` is in `0..limit` (the kernels read the rows they name).
fn indices(v: &[i32], limit: usize, what: &str) -> DevResult<()> {
    match v.iter().find(|&&r| r < 0 || r as usize >= limit) {
        Some(r) => invalid(format!("{what}: row {r} of {limit}")),
        None => Ok(()),
    }
}

/// Which gated RMSNorm [`CudaDevice::gated_norm_op`] runs.
pub(super) enum GatedNormKind<'a> {
    /// Per head of the weight's length, with this gate and epsilon (Gated DeltaNet, Kimi
    /// Delta Attention).
    PerHead(&'a DevBuf<f32>, NormGate, f64),
    /// Mamba-2's.
    Mamba(MambaGate<'a, DevBuf<f32>>),
}

impl CudaDevice {
    /// The form of the recurrences for this model's weights on this GPU.
    fn recurrence(&self) -> Recurrence {
        Recurrence::pick(self.dtype, self.gpu.info.compute_capability)
    }

    pub(super) fn attention_op(
        &self,
        step: &CudaStep<'_>,
        kv: &mut DevKvCache,
        qkv: &mut CudaBuf,
        call: &AttnCall<'_, Self>,
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        let plan = &step.plan;
        let t = plan.num_tokens;
        let l = call.layout;
        let hd = l.head_dim;
        qkv.f32("attention qkv")?;
        check_rows(qkv.rows(), t, "attention qkv")?;
        if l.k_col < l.heads * hd || l.width(call.shared_kv) > qkv.width() {
            return invalid(format!(
                "attention layout {l:?} in {}-wide qkv rows",
                qkv.width()
            ));
        }
        let norms = match (call.qk_norm, call.norm_pieces(|w| w.len())?) {
            (Some((q, k, eps)), Some(pieces)) => {
                let k = k.map_or(0, |k| k.ptr());
                Some((q.ptr(), k, eps, pieces, call.norm_form))
            }
            _ => None,
        };
        let v_norm = match call.v_norm {
            Some((w, _)) if w.len() != hd => {
                return invalid(format!("v_norm of {} values for heads of {hd}", w.len()));
            }
            Some((w, eps)) => Some((w.ptr(), eps)),
            None => None,
        };
        if let Some((rope, rot)) = call.rope
            && rot / 2 > rope.inv_freq.len()
        {
            return invalid(format!(
                "{rot} rotary dims with {} frequencies",
                rope.inv_freq.len()
            ));
        }
        // The kernel writes f32 or the cache dtype: exactly the two buffer kinds.
        out.set(t, l.heads * hd, "attention")?;
        let rows = QkvRows {
            base: qkv.ptr(),
            width: qkv.width(),
            k_col: l.k_col,
            heads: l.heads,
            kv_heads: l.kv_heads,
            head_dim: hd,
            shared_kv: call.shared_kv,
        };
        let rope = call.rope.map(|(r, rot)| (rot, (r.inv_freq.ptr(), r.scale)));
        let sm = &call.softmax;
        if let Some(s) = sm.sinks {
            check_len(s, l.heads, "attention sinks")?;
        }
        sm.check()?;
        let softmax = DevSoftmax {
            shape: sm.shape(l.heads, l.kv_heads, hd),
            sinks: sm.sinks.map_or(0, |s| s.ptr()),
            window: sm.window.unwrap_or(0),
            chunk: sm.chunk.unwrap_or(0),
            temperature: sm.temperature,
            dense_below: sm.sparse.unwrap_or(0),
            softcap: sm.softcap.unwrap_or(0.0),
        };
        let o = (out.ptr(), out.dtype());
        kv.attend(
            &self.gpu,
            call.kv_layer,
            rows,
            (norms, v_norm),
            rope,
            softmax,
            o,
            plan,
        )?;
        if sm.sparse.is_some() {
            let q = (qkv.ptr(), qkv.width());
            kv.attend_selected(&self.gpu, call.kv_layer, q, softmax.shape, o, plan)?;
        }
        Ok(())
    }

    /// [`Device::gate`].
    pub(super) fn gate_op(
        &self,
        x: Cols<'_, CudaBuf>,
        g: Cols<'_, CudaBuf>,
        f: GateFn,
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        let what = "gate";
        let (xa, ga) = (cols(x, what)?, cols(g, what)?);
        if g.width != x.width || g.buf.rows() != x.buf.rows() {
            return invalid(format!(
                "{what}: gate [{}, {}] for input [{}, {}]",
                g.buf.rows(),
                g.width,
                x.buf.rows(),
                x.width
            ));
        }
        out.set(x.buf.rows(), x.width, what)?;
        let io = (x.buf.rows(), x.width);
        Ok(ops::gate(
            &self.gpu,
            xa,
            ga,
            (out.ptr(), out.dtype()),
            io,
            f,
        )?)
    }

    pub(super) fn conv1d_op(
        &self,
        step: &CudaStep<'_>,
        states: &mut StateSlots,
        x: Cols<'_, CudaBuf>,
        call: &ConvCall<'_, Self>,
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        let seqs = step.seqs()?;
        let t = seqs.num_tokens;
        let (xa, stride) = cols(x, "conv1d input")?;
        check_rows(x.buf.rows(), t, "conv1d input")?;
        let (ch, k) = (x.width, call.kernel);
        if k == 0 {
            return invalid("conv1d with kernel size 0".into());
        }
        check_len(call.weight, ch * k, "conv1d weight")?;
        if let Some(b) = call.bias {
            check_len(b, ch, "conv1d bias")?;
        }
        let (conv_per, _) = states.shape(call.state_layer)?;
        if conv_per != (k - 1) * ch {
            return invalid(format!(
                "conv1d of {ch} channels, kernel {k}: state slots of {conv_per} floats"
            ));
        }
        out.f32("conv1d output")?;
        out.set(t, ch, "conv1d")?;
        let io = ConvIo {
            x: xa,
            stride,
            ch,
            k,
            w: call.weight.ptr(),
            bias: call.bias.map_or(0, |b| b.ptr()),
            state: states.conv(call.state_layer)?,
            out: out.ptr(),
            silu: call.silu,
        };
        Ok(recurrent::conv(&self.gpu, io, seqs)?)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn gated_delta_op(
        &self,
        step: &CudaStep<'_>,
        states: &mut StateSlots,
        layer: usize,
        qkv: &mut CudaBuf,
        (beta, alpha): (Cols<'_, CudaBuf>, Cols<'_, CudaBuf>),
        p: &GdnParams<'_, Self>,
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        let seqs = step.seqs()?;
        let t = seqs.num_tokens;
        let d = p.dims;
        qkv.f32("gated delta qkv")?;
        check_rows(qkv.rows(), t, "gated delta qkv")?;
        // The kernels take q | k | v as whole rows of the conv output.
        if qkv.width() != 2 * d.nk * d.dk + d.nv * d.dv {
            return invalid(format!("gated delta {d:?} over {}-wide rows", qkv.width()));
        }
        let (b, b_stride) = cols(beta, "gated delta beta")?;
        let (a, a_stride) = cols(alpha, "gated delta alpha")?;
        check_rows(beta.buf.rows(), t, "gated delta beta")?;
        check_rows(alpha.buf.rows(), t, "gated delta alpha")?;
        if beta.width != d.nv || alpha.width != p.gate_width() {
            return invalid(format!(
                "gated delta beta / alpha of {} / {} columns, {} expected",
                beta.width,
                alpha.width,
                p.gate_width()
            ));
        }
        check_len(p.neg_a, d.nv, "gated delta A")?;
        check_len(p.dt_bias, p.gate_width(), "gated delta dt bias")?;
        let (_, ssm_per) = states.shape(layer)?;
        if ssm_per != d.nv * d.dk * d.dv {
            return invalid(format!(
                "gated delta {d:?}: state slots of {ssm_per} floats"
            ));
        }
        out.f32("gated delta output")?;
        out.set(t, d.nv * d.dv, "gated delta")?;
        let io = GdnIo {
            nk: d.nk,
            nv: d.nv,
            dk: d.dk,
            dv: d.dv,
            qkv: qkv.ptr(),
            b,
            a,
            ba_stride: b_stride,
            a_stride,
            neg_a: p.neg_a.ptr(),
            dt_bias: p.dt_bias.ptr(),
            state: states.ssm(layer)?,
            out: out.ptr(),
            beta_scale: p.beta_scale,
            per_channel: p.per_channel,
        };
        Ok(recurrent::gated_delta(
            &self.gpu,
            io,
            seqs,
            self.recurrence(),
        )?)
    }

    /// The gated norms: per head of `w.len()` values (Gated DeltaNet
    /// `w · norm(x) · silu(z)`, Kimi Delta Attention's `· sigmoid(z)`) or Mamba-2's (the
    /// [`MambaGate`] forms).
    pub(super) fn gated_norm_op(
        &self,
        x: &CudaBuf,
        z: Cols<'_, CudaBuf>,
        kind: GatedNormKind<'_>,
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        x.f32("gated norm input")?;
        let (za, z_stride) = cols(z, "gated norm gate")?;
        let (t, width) = (x.rows(), x.width());
        if z.width != width || z.buf.rows() != t {
            return invalid(format!(
                "gated norm: gate [{}, {}] for input [{t}, {width}]",
                z.buf.rows(),
                z.width
            ));
        }
        out.set(t, width, "gated norm")?;
        let io = |w: u64, eps| GatedNormIo {
            x: x.ptr(),
            z: za,
            z_stride,
            w,
            out: out.ptr(),
            dtype: out.dtype(),
            t,
            eps,
        };
        let g = &self.gpu;
        let (norm, mode) = match kind {
            GatedNormKind::PerHead(w, gate, eps) => {
                let dv = w.len();
                if dv == 0 || !width.is_multiple_of(dv) {
                    return invalid(format!("gated norm of {dv} over {width}-wide rows"));
                }
                let dims = (width / dv, dv);
                return Ok(gated_norm::gdn_gated_norm(g, io(w.ptr(), eps), dims, gate)?);
            }
            GatedNormKind::Mamba(MambaGate::GateOnly) => {
                return Ok(gated_norm::mamba2_gated_norm(
                    g,
                    io(0, 0.0),
                    width,
                    width,
                    2,
                )?);
            }
            GatedNormKind::Mamba(MambaGate::GateThenNorm(n)) => (n, 0),
            GatedNormKind::Mamba(MambaGate::NormThenGate(n)) => (n, 1),
        };
        norm.check(norm.w.len(), width)?;
        let n = io(norm.w.ptr(), norm.eps);
        Ok(gated_norm::mamba2_gated_norm(
            g,
            n,
            width,
            norm.group_size,
            mode,
        )?)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn mamba2_scan_op(
        &self,
        step: &CudaStep<'_>,
        states: &mut StateSlots,
        layer: usize,
        xbc: &CudaBuf,
        dt: Cols<'_, CudaBuf>,
        p: &MambaParams<'_, Self>,
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        let seqs = step.seqs()?;
        let t = seqs.num_tokens;
        let d = p.dims;
        let inner = d.heads * d.head_dim;
        xbc.f32("mamba2 xBC")?;
        check_rows(xbc.rows(), t, "mamba2 xBC")?;
        // The kernel takes x | B | C as whole rows of the conv output.
        if xbc.width() != inner + 2 * d.groups * d.d_state {
            return invalid(format!("mamba2 {d:?} over {}-wide rows", xbc.width()));
        }
        let (dta, dt_stride) = cols(dt, "mamba2 dt")?;
        check_rows(dt.buf.rows(), t, "mamba2 dt")?;
        if dt.width != d.heads {
            return invalid(format!("mamba2 dt of {} columns", dt.width));
        }
        check_len(p.neg_a, d.heads, "mamba2 A")?;
        check_len(p.d, d.heads, "mamba2 D")?;
        check_len(p.dt_bias, d.heads, "mamba2 dt bias")?;
        let (_, ssm_per) = states.shape(layer)?;
        if ssm_per != inner * d.d_state {
            return invalid(format!("mamba2 {d:?}: state slots of {ssm_per} floats"));
        }
        out.f32("mamba2 output")?;
        out.set(t, inner, "mamba2")?;
        let io = MambaIo {
            heads: d.heads,
            head_dim: d.head_dim,
            d_state: d.d_state,
            groups: d.groups,
            xbc: xbc.ptr(),
            dt: dta,
            dt_stride,
            neg_a: p.neg_a.ptr(),
            d: p.d.ptr(),
            dt_bias: p.dt_bias.ptr(),
            dt_min: d.dt_min,
            state: states.ssm(layer)?,
            y: out.ptr(),
        };
        Ok(recurrent::mamba2_scan(
            &self.gpu,
            io,
            seqs,
            self.recurrence(),
        )?)
    }

    /// Softmax top-k on the device, the choice copied back (one wait for the compute stream
    /// per MoE layer: the routing decides the expert GEMMs' sizes) and planned on the host.
    pub(super) fn moe_route_op(
        &self,
        logits: &CudaBuf,
        top_k: usize,
        renorm: bool,
    ) -> DevResult<Routing> {
        logits.f32("moe router logits")?;
        let (g, t, e) = (&self.gpu, logits.rows(), logits.width());
        let n = t * top_k;
        let ids: DevBuf<i32> = g.zeros(n)?;
        let wts: DevBuf<f32> = g.zeros(n)?;
        moe::route(
            g,
            logits.ptr(),
            (ids.ptr(), wts.ptr()),
            t,
            (e, top_k),
            renorm,
        )?;
        let (ids, wts) = (g.download(&ids, n)?, g.download(&wts, n)?);
        Routing::build(&ids, &wts, t, top_k, e).map_err(crate::kernels::DeviceError::Invalid)
    }

    pub(super) fn moe_gather_op(
        &self,
        x: &CudaBuf,
        routing: &Routing,
        scale: Option<&[f32]>,
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        let n = routing.rows.len();
        indices(&routing.rows, x.rows(), "moe gather")?;
        if scale.is_some_and(|s| s.len() != n) {
            return invalid(format!("moe gather of {n} rows with other than {n} scales"));
        }
        if out.dtype() != x.dtype() {
            return invalid(format!(
                "moe gather of {:?} rows into a {:?} buffer",
                x.dtype(),
                out.dtype()
            ));
        }
        out.set(n, x.width(), "moe gather")?;
        let g = &self.gpu;
        let rows = g.upload(&routing.rows)?;
        let scale = scale.map(|s| g.upload(s)).transpose()?;
        let io = (x.ptr(), rows.ptr(), out.ptr());
        let scale_ptr = scale.as_ref().map(|s| s.ptr());
        Ok(moe::gather_rows(
            g,
            io,
            scale_ptr,
            x.dtype(),
            (n, x.width()),
        )?)
    }

    pub(super) fn moe_shared_gate_op(
        &self,
        x: &CudaBuf,
        w: &DevBuf<f32>,
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        check_len(w, x.width(), "shared expert gate")?;
        out.f32("shared expert gate output")?;
        out.set(x.rows(), 1, "shared expert gate")?;
        let io = (x.ptr(), w.ptr(), out.ptr());
        Ok(moe::shared_gate(
            &self.gpu,
            io,
            x.dtype(),
            x.rows(),
            x.width(),
        )?)
    }

    pub(super) fn moe_combine_op(
        &self,
        y: &CudaBuf,
        routing: &Routing,
        shared: Option<(&CudaBuf, &CudaBuf)>,
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        y.f32("moe expert outputs")?;
        let (t, h) = (routing.tokens, y.width());
        let k = routing.tok_pos.len().checked_div(t).unwrap_or(0);
        if let Some((shared, gate)) = shared {
            shared.f32("shared expert output")?;
            gate.f32("shared expert gate")?;
            if (shared.rows(), shared.width(), gate.rows(), gate.width()) != (t, h, t, 1) {
                return invalid(format!(
                    "moe combine of [{t}, {h}]: shared [{}, {}], gate [{}, {}]",
                    shared.rows(),
                    shared.width(),
                    gate.rows(),
                    gate.width()
                ));
            }
        }
        if routing.tok_pos.len() != t * k || routing.tok_w.len() != t * k {
            return invalid(format!(
                "moe combine: {t} tokens, {} routes, {} weights",
                routing.tok_pos.len(),
                routing.tok_w.len()
            ));
        }
        indices(&routing.tok_pos, y.rows(), "moe combine")?;
        out.f32("moe combine output")?;
        out.set(t, h, "moe combine")?;
        let g = &self.gpu;
        let (tok_pos, tok_w) = (g.upload(&routing.tok_pos)?, g.upload(&routing.tok_w)?);
        let io = CombineIo {
            y: y.ptr(),
            tok_pos: tok_pos.ptr(),
            tok_w: tok_w.ptr(),
            shared: shared.map(|(s, g)| (s.ptr(), g.ptr())),
            out: out.ptr(),
        };
        Ok(moe::combine(g, io, t, k, h)?)
    }

    /// `out[rows] = x[rows] · Wᵀ (+ b)`; `whole`: `out` becomes `[x.rows(), N]` (matmul), else
    /// it must already hold those rows (matmul_rows, the MoE experts).
    pub(super) fn matmul_rows_into(
        &self,
        x: &CudaBuf,
        rows: Range<usize>,
        w: &CudaLinear,
        out: &mut CudaBuf,
        whole: bool,
    ) -> DevResult<()> {
        let (n, k) = (w.w.rows, w.w.cols);
        if x.dtype() != w.w.data.dtype() || x.width() != k || rows.end > x.rows() {
            return invalid(format!(
                "matmul of rows {rows:?} of [{}, {}] {:?} by a [{n}, {k}] {:?} weight",
                x.rows(),
                x.width(),
                x.dtype(),
                w.w.data.dtype()
            ));
        }
        out.f32("matmul output")?;
        if whole {
            out.set(x.rows(), n, "matmul")?;
        } else if out.width() != n || out.rows() < rows.end {
            return invalid(format!(
                "matmul_rows {rows:?}: output [{}, {}] (weight {n})",
                out.rows(),
                out.width()
            ));
        }
        let m = rows.len();
        let xa = x.ptr() + (rows.start * k * x.elem()) as u64;
        let ya = out.ptr() + (rows.start * n * 4) as u64;
        gemm::linear(&self.gpu, xa, &w.w, ya, m)?;
        if let Some(b) = &w.bias {
            ops::bias_add(&self.gpu, ya, b.ptr(), m, n)?;
        }
        Ok(())
    }

    /// `out[i] = x[rows[i]]` (f32), every row index checked on the host.
    pub(super) fn gather_rows_op(
        &self,
        x: &CudaBuf,
        rows: &[usize],
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        x.f32("gather_rows input")?;
        out.f32("gather_rows output")?;
        let idx = rows
            .iter()
            .map(|&r| match r < x.rows() {
                true => Ok(r as u32),
                false => invalid(format!("gather of row {r} of {}", x.rows())),
            })
            .collect::<DevResult<Vec<u32>>>()?;
        out.set(rows.len(), x.width(), "gather_rows")?;
        let g = &self.gpu;
        let dev_rows = g.upload(&idx)?;
        Ok(ops::gather_rows(
            g,
            x.ptr(),
            dev_rows.ptr(),
            out.ptr(),
            idx.len(),
            x.width(),
        )?)
    }
}
