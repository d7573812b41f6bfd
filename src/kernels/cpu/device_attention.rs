//! The CPU device's attention ops (softmax attention over the KV cache, MLA's per-head
//! assembly): the bodies of `CpuDevice`'s trait methods of those names.

use super::{CpuBuf, CpuDevice, CpuKv, CpuStep, set};
use crate::kernels::cpu::attention::{self, attention as attend};
use crate::kernels::cpu::bf16::Bf16Kernel;
use crate::kernels::cpu::{dsa, mla, ops, qsa};
use crate::kernels::device::{AttnCall, DevResult, DeviceError, DsaCall, MlaDims, QsaCall};

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
    if qkv.width < l.width(call.shared_kv) {
        return Err(DeviceError::Invalid(format!(
            "attention layout {l:?} in {}-wide qkv rows",
            qkv.width
        )));
    }
    call.norm_pieces(|w| w.len())?;
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
        norm: call
            .qk_norm
            .map(|(qn, kn, eps)| (&qn[..], kn.map(|k| &k[..]), eps)),
        norm_form: call.norm_form,
        v_norm: call.v_norm.map(|(vn, eps)| (&vn[..], eps)),
        rope: call.rope,
        positions: &plan.positions,
    };
    match call.shared_kv {
        // Gemma 4's KV sharing: an earlier layer of this step wrote these keys and values.
        true => ops::split_q(&qkv.data, &split, &mut kv.q),
        false => {
            ops::split_qkv(&qkv.data, &split, (&mut kv.q, &mut kv.k, &mut kv.v));
            kv.cache.write(call.kv_layer, &plan.slots, &kv.k, &kv.v);
        }
    }
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
        softcap: sm.softcap,
        dense_below: sm.sparse,
    };
    attend(&kv.q, kc, vc, plan, shape, softmax, &mut out.data, bf16);
    if sm.sparse.is_some() {
        let sel = &kv.selection;
        if sel.tokens() != plan.num_tokens() {
            return Err(DeviceError::Invalid(
                "sparse attention without this step's selection".into(),
            ));
        }
        dsa::attend_selected(&kv.q, (kc, vc), plan, shape, sel, &mut out.data);
    }
    set(out, qd);
    Ok(())
}

/// DeepSeek Sparse Attention's indexer: `k` normed and rotated, `q` rotated, the step's keys
/// into the index cache, each token's selection into `kv.selection`.
pub(super) fn dsa_select(
    step: &CpuStep<'_>,
    kv: &mut CpuKv,
    call: &DsaCall<'_, CpuDevice>,
    (q, k, w): (&mut CpuBuf, &mut CpuBuf, &CpuBuf),
) -> DevResult<()> {
    call.check().map_err(DeviceError::Invalid)?;
    let (heads, d, t) = (call.heads, call.head_dim, step.plan.num_tokens());
    let (norm_w, norm_b, eps) = call.k_norm;
    let fits = [&*q, &*k, w]
        .iter()
        .zip(call.widths())
        .all(|(b, width)| b.width == width && b.rows() == t)
        && norm_w.len() == d
        && norm_b.len() == d;
    let cache = kv.index.as_mut().filter(|c| call.fits(c.shape()));
    let (true, Some(cache)) = (fits, cache) else {
        return Err(DeviceError::Invalid(format!(
            "dsa_select: inputs or index cache do not fit {heads} heads of {d} at indexer layer {}",
            call.index_layer
        )));
    };
    let ix = dsa::Indexer {
        heads,
        head_dim: d,
        topk: call.topk,
        rope: call.rope,
        interleave: call.interleave,
        norm: (norm_w, norm_b, eps),
        score_scale: call.score_scale(),
        weight_scale: call.weight_scale(),
    };
    dsa::prepare(&mut q.data, &mut k.data, &step.plan.positions, &ix);
    cache.write(call.index_layer, &step.plan.slots, &k.data);
    let keys = cache.layer(call.index_layer);
    dsa::select(&q.data, &w.data, keys, step.plan, &ix, &mut kv.selection);
    Ok(())
}

/// Qwen4-Exp's QSA indexer: `q` normed and rotated, the raw keys into the index cache, each
/// token's selection into `kv.selection`.
pub(super) fn qsa_select(
    step: &CpuStep<'_>,
    kv: &mut CpuKv,
    call: &QsaCall<'_, CpuDevice>,
    (q, k): (&mut CpuBuf, &CpuBuf),
) -> DevResult<()> {
    call.check().map_err(DeviceError::Invalid)?;
    let (heads, d, t) = (call.heads, call.head_dim, step.plan.num_tokens());
    let (qn, kn, eps) = call.norms;
    let fits = [&*q, k]
        .iter()
        .zip(call.widths())
        .all(|(b, width)| b.width == width && b.rows() == t)
        && qn.len() == d
        && kn.len() == d;
    let cache = kv.index.as_mut().filter(|c| call.fits(c.shape()));
    let (true, Some(cache)) = (fits, cache) else {
        return Err(DeviceError::Invalid(format!(
            "qsa_select: inputs or index cache do not fit {heads} heads of {d} at layer {}",
            call.index_layer
        )));
    };
    let rule = qsa::QsaRule {
        heads,
        head_dim: d,
        blocks: call.blocks(),
        ratio: call.ratio,
        rope: call.rope,
        norms: (qn, kn, eps as f32),
    };
    qsa::prepare(&mut q.data, &step.plan.positions, &rule);
    cache.write(call.index_layer, &step.plan.slots, &k.data);
    let keys = cache.layer(call.index_layer);
    qsa::select(&q.data, keys, step.plan, &rule, &mut kv.selection);
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
