//! Recurrent layers of the hybrid models: the per-request state cache, the causal depthwise
//! conv1d, the gated delta rule (Gated DeltaNet), the Mamba-2 selective scan and their gated
//! RMSNorms.
//!
//! # Chunk invariance (DESIGN.md §7 c)
//!
//! Both recurrences run **token by token** in f32, for prefill and decode alike: each
//! (request, head) is one task that walks its tokens in order, starting from the state its slot
//! holds (zero when the chunk starts at position 0). A token's arithmetic is therefore the same
//! whether its request was split into chunks of 7, 61 or 4096 tokens, and whatever shares the
//! batch: results are byte-identical across splits. The conv reads the last `k - 1` inputs from
//! the slot's conv state, in the same fixed order. The cost: per token and head, about
//! `4 · dk · dv` (GDN) or `3 · head_dim · d_state` (Mamba-2) flops done sequentially — no
//! chunked matmul form — parallel only over requests × heads.

use rayon::prelude::*;

use super::ops::inv_rms;
use crate::kernels::plan::SeqState;

/// Conv state (`[k - 1, channels]` per slot) and recurrent state (f32) of one layer.
pub struct LayerState {
    pub conv: Vec<f32>,
    pub ssm: Vec<f32>,
    conv_per_slot: usize,
    ssm_per_slot: usize,
}

/// Recurrent state of every recurrent layer for `slots` requests.
pub struct StateCache {
    layers: Vec<LayerState>,
    slots: usize,
}

impl StateCache {
    /// `shapes[i] = (conv floats per slot, recurrent floats per slot)` of recurrent layer i.
    pub fn new(shapes: &[(usize, usize)], slots: usize) -> Result<Self, String> {
        let alloc = |n: usize| -> Result<Vec<f32>, String> {
            let total = n.checked_mul(slots).ok_or("state cache size overflows")?;
            // Zeroed by the allocator: pages become resident when a slot is first used (as
            // the KV cache).
            bytemuck::allocation::try_zeroed_vec::<f32>(total)
                .map_err(|()| format!("cannot allocate {} bytes of recurrent state", total * 4))
        };
        let layers = shapes
            .iter()
            .map(|&(c, s)| {
                Ok(LayerState {
                    conv: alloc(c)?,
                    ssm: alloc(s)?,
                    conv_per_slot: c,
                    ssm_per_slot: s,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Self { layers, slots })
    }

    pub fn num_slots(&self) -> usize {
        self.slots
    }

    /// Zeroes every layer's state of the fresh chunks' slots (a reused slot never leaks).
    pub fn reset_fresh(&mut self, seqs: &[SeqState]) {
        for s in seqs.iter().filter(|s| s.fresh) {
            for l in &mut self.layers {
                l.conv[s.slot * l.conv_per_slot..(s.slot + 1) * l.conv_per_slot].fill(0.0);
                l.ssm[s.slot * l.ssm_per_slot..(s.slot + 1) * l.ssm_per_slot].fill(0.0);
            }
        }
    }

    /// Copies slot `from` into slot `to` in every layer (the pairs checked by the caller).
    pub fn copy_slots(&mut self, copies: &[(usize, usize)]) {
        for l in &mut self.layers {
            for &(from, to) in copies {
                let (c, s) = (l.conv_per_slot, l.ssm_per_slot);
                l.conv.copy_within(from * c..(from + 1) * c, to * c);
                l.ssm.copy_within(from * s..(from + 1) * s, to * s);
            }
        }
    }

    pub fn layer_mut(&mut self, i: usize) -> &mut LayerState {
        &mut self.layers[i]
    }
}

#[inline]
pub fn silu(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}

#[inline]
pub fn sigmoid(v: f32) -> f32 {
    1.0 / (1.0 + (-v).exp())
}

/// torch `softplus` (beta 1, threshold 20).
#[inline]
pub fn softplus(v: f32) -> f32 {
    if v > 20.0 { v } else { v.exp().ln_1p() }
}

/// Causal depthwise conv1d (kernel `k`, weight `[ch, k]`, optional bias) followed by SiLU, over
/// `x` (`[T, ch]`, rows of the chunks in `seqs`). Positions before a chunk come from the slot's
/// conv state (`[k - 1, ch]` per slot, oldest first), which is then advanced.
#[allow(clippy::too_many_arguments)]
pub fn causal_conv_silu(
    x: &[f32],
    ch: usize,
    w: &[f32],
    bias: Option<&[f32]>,
    k: usize,
    seqs: &[SeqState],
    state: &mut [f32],
    out: &mut Vec<f32>,
) {
    let hist = k - 1;
    let t = x.len() / ch;
    let mut row_seq = vec![0usize; t];
    for (i, s) in seqs.iter().enumerate() {
        row_seq[s.rows.clone()].fill(i);
    }
    out.clear();
    out.resize(x.len(), 0.0);
    let state_ro: &[f32] = state;
    out.par_chunks_mut(ch).enumerate().for_each(|(r, o)| {
        let s = &seqs[row_seq[r]];
        let local = r - s.rows.start;
        let st = &state_ro[s.slot * hist * ch..(s.slot + 1) * hist * ch];
        for (c, oc) in o.iter_mut().enumerate() {
            let wc = &w[c * k..(c + 1) * k];
            let mut acc = 0.0f32;
            for (j, &wj) in wc.iter().enumerate() {
                // input position local - (k-1) + j relative to the chunk start
                let p = local + j;
                let v = if p >= hist {
                    x[(s.rows.start + p - hist) * ch + c]
                } else {
                    st[p * ch + c]
                };
                acc += wj * v;
            }
            if let Some(b) = bias {
                acc += b[c];
            }
            *oc = acc;
        }
        super::exp::silu_inplace(o);
    });
    // Advance each slot's window to the last k-1 inputs.
    for s in seqs {
        let st = &mut state[s.slot * hist * ch..(s.slot + 1) * hist * ch];
        let len = s.rows.len();
        let mut window = Vec::with_capacity(hist * ch);
        for p in len..len + hist {
            // position p - hist relative to the chunk start, in [len - hist, len)
            if p >= hist {
                let r = s.rows.start + p - hist;
                window.extend_from_slice(&x[r * ch..(r + 1) * ch]);
            } else {
                window.extend_from_slice(&st[p * ch..(p + 1) * ch]);
            }
        }
        st.copy_from_slice(&window);
    }
}

/// Splits `state` (`[slots, heads, per]`) into one mutable block per (chunk, head) task.
fn head_tasks<'a>(
    state: &'a mut [f32],
    per: usize,
    heads: usize,
    seqs: &[SeqState],
) -> Vec<(usize, usize, &'a mut [f32])> {
    let mut blocks: Vec<Option<&mut [f32]>> = state.chunks_mut(per).map(Some).collect();
    let mut tasks = Vec::with_capacity(seqs.len() * heads);
    for (si, s) in seqs.iter().enumerate() {
        for h in 0..heads {
            let b = blocks[s.slot * heads + h]
                .take()
                .expect("state slots are distinct within a batch");
            tasks.push((si, h, b));
        }
    }
    tasks
}

/// Scatters per-task outputs (`[rows, dh]` each) into `out[T, heads * dh]`.
fn scatter(
    results: Vec<(usize, usize, Vec<f32>)>,
    seqs: &[SeqState],
    heads: usize,
    dh: usize,
    t: usize,
    out: &mut Vec<f32>,
) {
    out.clear();
    out.resize(t * heads * dh, 0.0);
    for (si, h, vals) in results {
        for (i, r) in seqs[si].rows.clone().enumerate() {
            out[(r * heads + h) * dh..][..dh].copy_from_slice(&vals[i * dh..(i + 1) * dh]);
        }
    }
}

/// Gated DeltaNet geometry and per-head parameters.
pub struct GdnParams<'a> {
    pub nk: usize,
    pub nv: usize,
    pub dk: usize,
    pub dv: usize,
    /// `-exp(A_log)` per value head.
    pub neg_a: &'a [f32],
    pub dt_bias: &'a [f32],
}

/// The gated delta rule, token by token. `qkv` is the conv output `[T, 2·nk·dk + nv·dv]`
/// (q | k | v), `b` and `a` are `[T, nv]`; `state` is `[slots, nv, dk, dv]`. Writes the core
/// output `[T, nv·dv]`. q and k are L2-normalised (eps 1e-6) and q is scaled by `dk^-0.5`;
/// `g = -exp(A_log)·softplus(a + dt_bias)`, `beta = sigmoid(b)`; q/k head `h / (nv/nk)` serves
/// value head h (transformers `repeat_interleave`).
pub fn gated_delta_rule(
    qkv: &[f32],
    b: &[f32],
    a: &[f32],
    p: &GdnParams<'_>,
    seqs: &[SeqState],
    state: &mut [f32],
    out: &mut Vec<f32>,
) {
    let (nk, nv, dk, dv) = (p.nk, p.nv, p.dk, p.dv);
    let key_dim = nk * dk;
    let row = 2 * key_dim + nv * dv;
    let t = qkv.len() / row;
    let rep = nv / nk;
    let scale = 1.0 / (dk as f32).sqrt();
    let tasks = head_tasks(state, dk * dv, nv, seqs);
    let results: Vec<(usize, usize, Vec<f32>)> = tasks
        .into_par_iter()
        .map(|(si, h, st)| {
            let kh = h / rep;
            let rows = seqs[si].rows.clone();
            let mut res = vec![0.0f32; rows.len() * dv];
            let (mut q, mut k) = (vec![0.0f32; dk], vec![0.0f32; dk]);
            let mut kv_mem = vec![0.0f32; dv];
            for (i, r) in rows.enumerate() {
                let x = &qkv[r * row..(r + 1) * row];
                l2norm(&x[kh * dk..(kh + 1) * dk], &mut q);
                l2norm(&x[key_dim + kh * dk..key_dim + (kh + 1) * dk], &mut k);
                for v in q.iter_mut() {
                    *v *= scale;
                }
                let v = &x[2 * key_dim + h * dv..2 * key_dim + (h + 1) * dv];
                let g = p.neg_a[h] * softplus(a[r * nv + h] + p.dt_bias[h]);
                let decay = g.exp();
                let beta = sigmoid(b[r * nv + h]);
                // Two passes over the state (decay + kᵀS, then the update + qᵀS), each
                // element's operations in the order of the four-pass form: the same bits.
                kv_mem.fill(0.0);
                for (ki, srow) in k.iter().zip(st.chunks_exact_mut(dv)) {
                    for (m, s) in kv_mem.iter_mut().zip(srow.iter_mut()) {
                        *s *= decay;
                        *m += *s * ki;
                    }
                }
                for (m, &vj) in kv_mem.iter_mut().zip(v) {
                    *m = (vj - *m) * beta; // delta
                }
                let o = &mut res[i * dv..(i + 1) * dv];
                for ((ki, qi), srow) in k.iter().zip(&q).zip(st.chunks_exact_mut(dv)) {
                    for ((s, &d), oj) in srow.iter_mut().zip(kv_mem.iter()).zip(o.iter_mut()) {
                        *s += ki * d;
                        *oj += *s * qi;
                    }
                }
            }
            (si, h, res)
        })
        .collect();
    scatter(results, seqs, nv, dv, t, out);
}

/// Dot product with 8 independent accumulators combined in a fixed tree (vectorisable, and
/// the same bits on every run and CPU: no FMA contraction, fixed order).
#[inline]
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for ((s, &xv), &yv) in acc.iter_mut().zip(x).zip(y) {
            *s += xv * yv;
        }
    }
    let mut tail = 0.0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail
}

/// `x / sqrt(sum(x²) + 1e-6)` (transformers / FLA `l2norm`).
fn l2norm(x: &[f32], out: &mut [f32]) {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    let inv = 1.0 / (ss + 1e-6).sqrt();
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v * inv;
    }
}

/// Mamba-2 geometry and per-head parameters.
pub struct MambaParams<'a> {
    pub heads: usize,
    pub head_dim: usize,
    pub d_state: usize,
    pub groups: usize,
    /// `-exp(A_log)` per head.
    pub neg_a: &'a [f32],
    pub d: &'a [f32],
    pub dt_bias: &'a [f32],
    /// Lower clamp of `dt` (transformers' prefill path: `time_step_min`).
    pub dt_min: f32,
}

/// The Mamba-2 selective scan, token by token. `xbc` is the conv output
/// `[T, heads·head_dim + 2·groups·d_state]` (x | B | C), `dt` the raw `[T, heads]`; `state` is
/// `[slots, heads, head_dim, d_state]`. Writes `y = C·h + D·x`, `[T, heads·head_dim]`.
/// `dt = max(softplus(dt + dt_bias), dt_min)`, `h = exp(dt·A)·h + (dt·x) ⊗ B`.
pub fn mamba2_scan(
    xbc: &[f32],
    dt: &[f32],
    p: &MambaParams<'_>,
    seqs: &[SeqState],
    state: &mut [f32],
    out: &mut Vec<f32>,
) {
    let (nh, hd, n) = (p.heads, p.head_dim, p.d_state);
    let inter = nh * hd;
    let row = inter + 2 * p.groups * n;
    let t = xbc.len() / row;
    let per_group = nh / p.groups;
    let tasks = head_tasks(state, hd * n, nh, seqs);
    let results: Vec<(usize, usize, Vec<f32>)> = tasks
        .into_par_iter()
        .map(|(si, h, st)| {
            let g = h / per_group;
            let rows = seqs[si].rows.clone();
            let mut res = vec![0.0f32; rows.len() * hd];
            for (i, r) in rows.enumerate() {
                let xr = &xbc[r * row..(r + 1) * row];
                let x = &xr[h * hd..(h + 1) * hd];
                let bm = &xr[inter + g * n..inter + (g + 1) * n];
                let cm = &xr[inter + (p.groups + g) * n..inter + (p.groups + g + 1) * n];
                let d = softplus(dt[r * nh + h] + p.dt_bias[h]).max(p.dt_min);
                let da = (d * p.neg_a[h]).exp();
                let o = &mut res[i * hd..(i + 1) * hd];
                for ((oj, &xj), srow) in o.iter_mut().zip(x).zip(st.chunks_exact_mut(n)) {
                    let xd = xj * d;
                    for (s, &bv) in srow.iter_mut().zip(bm) {
                        *s = *s * da + xd * bv;
                    }
                    *oj = dot_lanes(cm, srow) + p.d[h] * xj;
                }
            }
            (si, h, res)
        })
        .collect();
    scatter(results, seqs, nh, hd, t, out);
}

/// Qwen3.5 / Qwen3-Next gated norm per head: `w · (x · rsqrt(mean(x²) + eps)) · silu(z)`,
/// over `dv = w.len()`-wide rows of `x` and `z`, in place on `x`.
pub fn gated_rms_norm_then_gate(x: &mut [f32], z: &[f32], w: &[f32], eps: f64) {
    let d = w.len();
    x.par_chunks_mut(d)
        .zip(z.par_chunks(d))
        .for_each(|(xr, zr)| {
            let r = inv_rms(xr, eps);
            for ((v, &zi), &wi) in xr.iter_mut().zip(zr).zip(w) {
                *v = wi * (*v * r) * silu(zi);
            }
        });
}

/// Mamba-2 / Nemotron-H gated norm: `h = y · silu(z)`, then RMSNorm over groups of
/// `group_size` channels, times `w` (`[inner]`); in place on `y` (`[T, inner]`).
pub fn gate_then_grouped_rms_norm(
    y: &mut [f32],
    z: &[f32],
    w: &[f32],
    group_size: usize,
    eps: f64,
) {
    let inner = w.len();
    y.par_chunks_mut(inner)
        .zip(z.par_chunks(inner))
        .for_each(|(yr, zr)| {
            for (v, &zi) in yr.iter_mut().zip(zr) {
                *v *= silu(zi);
            }
            for (yg, wg) in yr
                .chunks_exact_mut(group_size)
                .zip(w.chunks_exact(group_size))
            {
                let r = inv_rms(yg, eps);
                for (v, &wi) in yg.iter_mut().zip(wg) {
                    *v = wi * (*v * r);
                }
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ops::Range;

    fn seq(rows: Range<usize>, slot: usize, fresh: bool) -> SeqState {
        SeqState { rows, slot, fresh }
    }

    /// Conv over one 10-token chunk == conv over chunks 3 + 1 + 6 (state carried), bit for bit.
    #[test]
    fn conv_carries_state_across_chunks() {
        let (ch, k, t) = (3, 4, 10);
        let x: Vec<f32> = (0..t * ch)
            .map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.3)
            .collect();
        let w: Vec<f32> = (0..ch * k).map(|i| (i as f32 - 4.0) * 0.1).collect();
        let bias = vec![0.1, -0.2, 0.3];
        let mut state = vec![0.0; 2 * (k - 1) * ch];
        let mut whole = Vec::new();
        causal_conv_silu(
            &x,
            ch,
            &w,
            Some(&bias),
            k,
            &[seq(0..t, 1, true)],
            &mut state,
            &mut whole,
        );
        let mut state2 = vec![0.0; 2 * (k - 1) * ch];
        let mut parts = Vec::new();
        let mut start = 0;
        for len in [3, 1, 6] {
            let mut o = Vec::new();
            let xs = &x[start * ch..(start + len) * ch];
            causal_conv_silu(
                xs,
                ch,
                &w,
                Some(&bias),
                k,
                &[seq(0..len, 0, start == 0)],
                &mut state2,
                &mut o,
            );
            parts.extend(o);
            start += len;
        }
        assert_eq!(whole, parts);
        assert_eq!(&state[(k - 1) * ch..], &state2[..(k - 1) * ch]);
    }
}
