//! The CPU device's attention ops (softmax attention over the KV cache, MLA's per-head
//! assembly): the bodies of `CpuDevice`'s trait methods of those names.

use super::{CpuBuf, CpuDevice, CpuKv, CpuStep, set};
use crate::kernels::cpu::attention::{self, attention as attend};
use crate::kernels::cpu::bf16::Bf16Kernel;
use crate::kernels::cpu::{mla, ops};
use crate::kernels::device::{AttnCall, DevResult, DeviceError, MlaDims};

/// q/k norms and RoPE, the step's K/V into the cache, then attention into `out`; `bf16`: a
/// bf16 model's GEMM path (its attention on bf16 products where that path has them).
pub(super) fn attention(
    step: &CpuStep<'_>,
    kv: &mut CpuKv,
    qkv: &mut CpuBuf,
    call: &AttnCall<'_, CpuDevice>,
    out: &mut CpuBuf,
    bf16: Option<Bf16Kernel>,
) -> DevResult<()> {
    let l = call.layout;
    let hd = l.head_dim;
    let (qd, kvd) = (l.heads * hd, l.kv_heads * hd);
    let plan = step.plan;
    if let Some((qn, kn, _)) = call.qk_norm {
        l.norm_pieces((qn.len(), kn.len()))
            .map_err(DeviceError::Invalid)?;
    }
    if let Some((vn, _)) = call.v_norm.filter(|(vn, _)| vn.len() != hd) {
        return Err(DeviceError::Invalid(format!(
            "v_norm of {} values for heads of {hd}",
            vn.len()
        )));
    }
    let split = ops::QkvSplit {
        width: qkv.width,
        q_dim: qd,
        k_col: l.k_col,
        v_col: l.v_col(),
        kv_dim: kvd,
        head_dim: hd,
        norm: call.qk_norm.map(|(qn, kn, eps)| (&qn[..], &kn[..], eps)),
        v_norm: call.v_norm.map(|(vn, eps)| (&vn[..], eps)),
        rope: call.rope,
        positions: &plan.positions,
    };
    ops::split_qkv(&qkv.data, &split, (&mut kv.q, &mut kv.k, &mut kv.v));
    kv.cache.write(call.kv_layer, &plan.slots, &kv.k, &kv.v);
    let (kc, vc) = kv.cache.layer(call.kv_layer);
    let sm = &call.softmax;
    sm.check()?;
    if sm.sinks.is_some_and(|s| s.len() != l.heads) {
        return Err(DeviceError::Invalid(format!(
            "attention sinks for {} heads",
            l.heads
        )));
    }
    let shape = sm.shape(l.heads, l.kv_heads, hd);
    let softmax = attention::Softmax {
        window: sm.window,
        chunk: sm.chunk,
        sinks: sm.sinks.map(|s| &s[..]),
        temperature: sm.temperature,
    };
    attend(&kv.q, kc, vc, plan, shape, softmax, &mut out.data, bf16);
    set(out, qd);
    Ok(())
}

/// MLA's per-head q / k / v rows (`[T, 3 · heads · D]`) from `q`, the expanded latent `kv`
/// and the shared `k_rope`.
pub(super) fn mla_heads(
    q: &CpuBuf,
    kv: &CpuBuf,
    k_rope: &CpuBuf,
    dims: &MlaDims,
    out: &mut CpuBuf,
) -> DevResult<()> {
    let ok = dims.input_widths().is_some_and(|widths| {
        [q, kv, k_rope]
            .iter()
            .zip(widths)
            .all(|(b, w)| b.width == w && b.rows() == q.rows())
    });
    if !ok {
        return Err(DeviceError::Invalid(format!(
            "mla_heads: inputs do not fit {dims:?}"
        )));
    }
    mla::mla_heads(&q.data, &kv.data, &k_rope.data, dims, &mut out.data);
    set(out, dims.out_width());
    Ok(())
}
