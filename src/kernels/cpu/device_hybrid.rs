//! The CPU device's hybrid-layer ops (causal conv, Gated DeltaNet, Mamba-2 and their gated
//! norms): the bodies of `CpuDevice`'s trait methods of those names.

use super::{CpuBuf, CpuDevice, CpuStates, CpuStep, check_gate, col_rows, gather_cols, set};
use crate::kernels::cpu::recurrent;
use crate::kernels::cpu::{gdn, mamba, mamba1};
use crate::kernels::device::{
    Cols, ConvCall, DevResult, DeviceError, GdnParams, Mamba1Params, MambaGate, MambaParams,
    NormGate,
};

pub(super) fn conv1d(
    step: &CpuStep<'_>,
    states: &mut CpuStates,
    x: Cols<'_, CpuBuf>,
    call: &ConvCall<'_, CpuDevice>,
    out: &mut CpuBuf,
) -> DevResult<()> {
    gather_cols(x, &mut states.first);
    let st = states.cache.layer_mut(call.state_layer);
    recurrent::causal_conv(
        &states.first,
        x.width,
        call.weight,
        call.bias.map(|b| b.as_slice()),
        (call.kernel, call.silu),
        step.seqs,
        &mut st.conv,
        &mut out.data,
    );
    set(out, x.width);
    Ok(())
}

pub(super) fn gated_delta_rule(
    step: &CpuStep<'_>,
    states: &mut CpuStates,
    state_layer: usize,
    qkv: &mut CpuBuf,
    (beta, alpha): (Cols<'_, CpuBuf>, Cols<'_, CpuBuf>),
    p: &GdnParams<'_, CpuDevice>,
    out: &mut CpuBuf,
) -> DevResult<()> {
    let d = p.dims;
    if beta.width != d.nv || alpha.width != p.gate_width() || beta.buf.rows() != qkv.rows() {
        return Err(DeviceError::Invalid(format!(
            "gated delta rule {d:?}: beta / alpha of {} / {} columns for {} rows of q | k | v",
            beta.width,
            alpha.width,
            qkv.rows()
        )));
    }
    gather_cols(beta, &mut states.first);
    gather_cols(alpha, &mut states.second);
    let params = gdn::GdnParams {
        dims: d,
        neg_a: p.neg_a,
        dt_bias: p.dt_bias,
        beta_scale: p.beta_scale,
        per_channel: p.per_channel,
    };
    let st = states.cache.layer_mut(state_layer);
    gdn::gated_delta_rule(
        &qkv.data,
        &states.first,
        &states.second,
        &params,
        step.seqs,
        &mut st.ssm,
        &mut out.data,
    );
    set(out, d.nv * d.dv);
    Ok(())
}

pub(super) fn gdn_gated_norm(
    x: &CpuBuf,
    z: Cols<'_, CpuBuf>,
    w: &[f32],
    norm: (f64, NormGate),
    out: &mut CpuBuf,
) -> DevResult<()> {
    check_gate("gdn_gated_norm", &Cols::new(x, 0, x.width), &z)?;
    out.data.clear();
    out.data.extend_from_slice(&x.data);
    recurrent::gated_rms_norm_then_gate(&mut out.data, col_rows(z), w, norm);
    set(out, x.width);
    Ok(())
}

pub(super) fn mamba2_scan(
    step: &CpuStep<'_>,
    states: &mut CpuStates,
    state_layer: usize,
    xbc: &CpuBuf,
    dt: Cols<'_, CpuBuf>,
    p: &MambaParams<'_, CpuDevice>,
    out: &mut CpuBuf,
) -> DevResult<()> {
    gather_cols(dt, &mut states.first);
    let d = p.dims;
    let params = mamba::MambaParams {
        heads: d.heads,
        head_dim: d.head_dim,
        d_state: d.d_state,
        groups: d.groups,
        neg_a: p.neg_a,
        d: p.d,
        dt_bias: p.dt_bias,
        dt_min: d.dt_min,
    };
    let st = states.cache.layer_mut(state_layer);
    mamba::mamba2_scan(
        &xbc.data,
        &states.first,
        &params,
        step.seqs,
        &mut st.ssm,
        &mut out.data,
    );
    set(out, d.heads * d.head_dim);
    Ok(())
}

pub(super) fn mamba1_scan(
    step: &CpuStep<'_>,
    states: &mut CpuStates,
    state_layer: usize,
    (x, dt): (&CpuBuf, &CpuBuf),
    bc: Cols<'_, CpuBuf>,
    p: &Mamba1Params<'_, CpuDevice>,
    out: &mut CpuBuf,
) -> DevResult<()> {
    let (inner, n) = (p.d.len(), p.d_state);
    let st = states.cache.layer_mut(state_layer);
    let shapes_ok = x.width == inner
        && dt.width == inner
        && x.rows() == dt.rows()
        && bc.buf.rows() == x.rows()
        && bc.width == 2 * n
        && bc.col + bc.width <= bc.buf.width
        && p.neg_a.len() == inner * n
        && p.dt_bias.len() == inner
        && p.bc_weight.len() == 2 * n
        && st.ssm_per_slot() == inner * n;
    if !shapes_ok {
        return Err(DeviceError::Invalid(format!(
            "mamba1_scan: {inner} channels × {n} states over x {}, dt {}, B|C {} wide",
            x.width, dt.width, bc.width
        )));
    }
    let io = mamba1::Mamba1Inputs {
        x: &x.data,
        dt: &dt.data,
        bc: bc.buf.data.get(bc.col..).unwrap_or_default(),
        bc_stride: bc.buf.width,
    };
    let params = mamba1::Mamba1Params {
        d_state: n,
        neg_a: p.neg_a,
        d: p.d,
        dt_bias: p.dt_bias,
        bc_weight: p.bc_weight,
    };
    mamba1::mamba1_scan(&io, &params, step.seqs, &mut st.ssm, &mut out.data);
    set(out, inner);
    Ok(())
}

pub(super) fn mamba2_gated_norm(
    y: &CpuBuf,
    z: Cols<'_, CpuBuf>,
    gate: MambaGate<'_, Vec<f32>>,
    out: &mut CpuBuf,
) -> DevResult<()> {
    check_gate("mamba2_gated_norm", &Cols::new(y, 0, y.width), &z)?;
    out.data.clear();
    out.data.extend_from_slice(&y.data);
    match gate {
        MambaGate::GateThenNorm(n) | MambaGate::NormThenGate(n) => {
            n.check(n.w.len(), y.width)?;
            let norm_first = matches!(gate, MambaGate::NormThenGate(_));
            let norm = (&n.w[..], n.group_size, n.eps);
            recurrent::gated_grouped_rms_norm(&mut out.data, col_rows(z), norm, norm_first)
        }
        MambaGate::GateOnly => recurrent::silu_gate(&mut out.data, col_rows(z), y.width),
    }
    set(out, y.width);
    Ok(())
}
