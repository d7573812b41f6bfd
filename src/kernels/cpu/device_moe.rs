//! The CPU device's MoE ops (the gathered rows' scales, the shared expert's gate, the
//! weighted sum of the experts' rows plus the gated shared expert): the bodies of
//! `CpuDevice`'s trait methods of those names.

use super::super::moe_grouped::weighted_sum;
use super::super::recurrent::sigmoid;
use super::{CpuBuf, set};
use crate::kernels::device::{DevResult, DeviceError};
use crate::kernels::routing::Routing;

pub(super) fn moe_shared_gate(x: &CpuBuf, w: &[f32], out: &mut CpuBuf) -> DevResult<()> {
    out.data.clear();
    out.data.extend(x.data.chunks_exact(x.width).map(|xr| {
        // A plain fixed-order dot per row (gemm with N = 1 was measured not to be
        // row-invariant for large M).
        let g: f32 = xr.iter().zip(w).map(|(a, b)| a * b).sum();
        sigmoid(g)
    }));
    set(out, 1);
    Ok(())
}

pub(super) fn moe_combine(
    y: &CpuBuf,
    routing: &Routing,
    shared: Option<(&CpuBuf, &CpuBuf)>,
    out: &mut CpuBuf,
) -> DevResult<()> {
    let h = y.width;
    let t = routing.tokens;
    if let Some((shared, gate)) = shared
        && (shared.data.len() != t * h || gate.data.len() != t)
    {
        return Err(DeviceError::Invalid(format!(
            "moe combine of {t} tokens with a shared expert of {} values, gate {}",
            shared.data.len(),
            gate.data.len()
        )));
    }
    weighted_sum(&y.data, routing, t, h, &mut out.data);
    if let Some((shared, gate)) = shared {
        for (tok, o) in out.data.chunks_exact_mut(h).enumerate() {
            let sg = gate.data[tok];
            for (oi, &si) in o.iter_mut().zip(&shared.data[tok * h..(tok + 1) * h]) {
                *oi += sg * si;
            }
        }
    }
    set(out, h);
    Ok(())
}

/// Row i of `x` times `scale[i]` (`None`: unchanged).
pub(super) fn scale_rows(x: &mut CpuBuf, scale: Option<&[f32]>) -> DevResult<()> {
    let Some(scale) = scale else { return Ok(()) };
    let w = x.width.max(1);
    if scale.len() * w != x.data.len() {
        return Err(DeviceError::Invalid(format!(
            "moe gather of {} rows with {} scales",
            x.data.len() / w,
            scale.len()
        )));
    }
    for (row, &s) in x.data.chunks_exact_mut(w).zip(scale) {
        row.iter_mut().for_each(|v| *v *= s);
    }
    Ok(())
}
