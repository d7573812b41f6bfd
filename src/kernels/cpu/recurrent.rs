//! Recurrent layers of the hybrid models: the per-request state cache, the causal depthwise
//! conv1d, the Mamba-2 selective scan and the gated RMSNorms (the gated delta rule of Gated
//! DeltaNet is in [`gdn`](super::gdn)).
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
//! chunked matmul form — parallel over requests × heads, each task's loops compiled for the
//! widest vector unit the CPU has ([`vector`]; same bits on every unit).

use std::ops::Range;

use rayon::prelude::*;

use super::ops::inv_rms;
use super::vector;
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
    // `conv_row` writes every element of every row: resizing zeroes only growth.
    out.resize(x.len(), 0.0);
    let taps = taps_by_position(w, ch, k);
    let state_ro: &[f32] = state;
    out.par_chunks_mut(ch).enumerate().for_each(|(r, o)| {
        let s = &seqs[row_seq[r]];
        let local = r - s.rows.start;
        let st = &state_ro[s.slot * hist * ch..(s.slot + 1) * hist * ch];
        // Tap j reads input position local - (k-1) + j relative to the chunk start.
        let input = |j: usize| {
            let p = local + j;
            if p >= hist {
                &x[(s.rows.start + p - hist) * ch..][..ch]
            } else {
                &st[p * ch..(p + 1) * ch]
            }
        };
        vector::widest(
            #[inline(always)]
            || conv_row(o, &taps, bias, input),
        );
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

/// The conv weight `[ch, k]` as `[k, ch]`: each tap one contiguous row, so that a row's
/// channels vectorise in [`conv_row`].
fn taps_by_position(w: &[f32], ch: usize, k: usize) -> Vec<f32> {
    let mut taps = vec![0.0f32; k * ch];
    for (c, wc) in w.chunks_exact(k).enumerate() {
        for (j, &wj) in wc.iter().enumerate() {
            taps[j * ch + c] = wj;
        }
    }
    taps
}

/// One output row of the conv before SiLU: per channel `0 + Σ_j taps[j]·input(j)` in tap
/// order, then `+ bias` (the scalar order, whatever the vector width).
#[inline(always)]
fn conv_row<'a>(
    o: &mut [f32],
    taps: &[f32],
    bias: Option<&[f32]>,
    input: impl Fn(usize) -> &'a [f32],
) {
    let ch = o.len();
    o.fill(0.0);
    for (j, tap) in taps.chunks_exact(ch).enumerate() {
        for ((oc, &wj), &v) in o.iter_mut().zip(tap).zip(input(j)) {
            *oc += wj * v;
        }
    }
    if let Some(b) = bias {
        for (oc, &bc) in o.iter_mut().zip(b) {
            *oc += bc;
        }
    }
}

/// Runs `head(h, rows, state)` for every (chunk, head) of a recurrent layer, in parallel and
/// compiled for the widest vector unit ([`vector::widest`]); `state` is `[slots, heads, per]`,
/// each call's result (`[rows, dh]`) lands in `out[t, heads · dh]`.
pub(super) fn per_head(
    state: &mut [f32],
    (heads, per, dh): (usize, usize, usize),
    seqs: &[SeqState],
    t: usize,
    out: &mut Vec<f32>,
    head: impl Fn(usize, Range<usize>, &mut [f32]) -> Vec<f32> + Sync,
) {
    let results: Vec<(usize, usize, Vec<f32>)> = head_tasks(state, per, heads, seqs)
        .into_par_iter()
        .map(|(si, h, st)| {
            let rows = seqs[si].rows.clone();
            let o = vector::widest(
                #[inline(always)]
                || head(h, rows, st),
            );
            (si, h, o)
        })
        .collect();
    scatter(results, seqs, heads, dh, t, out);
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

/// One row of the scan's state in one pass: `s = s·da + xd·b` element by element, and the
/// new row's dot product with `c` in 8 lanes (element i in lane i mod 8, the tail serially)
/// added in a fixed tree. No FMA contraction and a fixed order: the same bits on every run,
/// CPU and vector unit. Fixed-size lanes so LLVM keeps the sums in one register.
#[inline(always)]
fn update_dot(s: &mut [f32], b: &[f32], c: &[f32], da: f32, xd: f32) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut s8 = s.chunks_exact_mut(8);
    let (b8, c8) = (b.chunks_exact(8), c.chunks_exact(8));
    let (bt, ct) = (b8.remainder(), c8.remainder());
    for ((sv, bv), cv) in (&mut s8).zip(b8).zip(c8) {
        // Copies in registers: the stores then cannot alias the loads, and the lanes vectorise.
        let mut sl: [f32; 8] = (&*sv).try_into().expect("chunks of 8");
        let bl: [f32; 8] = bv.try_into().expect("chunks of 8");
        let cl: [f32; 8] = cv.try_into().expect("chunks of 8");
        for l in 0..8 {
            sl[l] = sl[l] * da + xd * bl[l];
            acc[l] += cl[l] * sl[l];
        }
        sv.copy_from_slice(&sl);
    }
    let mut tail = 0.0f32;
    for ((sv, &bv), &cv) in s8.into_remainder().iter_mut().zip(bt).zip(ct) {
        *sv = *sv * da + xd * bv;
        tail += cv * *sv;
    }
    ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail
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
    let t = xbc.len() / (p.heads * p.head_dim + 2 * p.groups * p.d_state);
    let dims = (p.heads, p.head_dim * p.d_state, p.head_dim);
    per_head(
        state,
        dims,
        seqs,
        t,
        out,
        #[inline(always)]
        |h, rows, st| mamba_head(xbc, dt, p, h, rows, st),
    );
}

/// Head `h` of the scan over `rows` (one request's chunk), from and into its state `st`
/// (`[head_dim, d_state]`); the head's output rows `[rows, head_dim]`.
#[inline(always)]
fn mamba_head(
    xbc: &[f32],
    dt: &[f32],
    p: &MambaParams<'_>,
    h: usize,
    rows: Range<usize>,
    st: &mut [f32],
) -> Vec<f32> {
    let (nh, hd, n) = (p.heads, p.head_dim, p.d_state);
    let inter = nh * hd;
    let row = inter + 2 * p.groups * n;
    let g = h / (nh / p.groups);
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
            *oj = update_dot(srow, bm, cm, da, xj * d) + p.d[h] * xj;
        }
    }
    res
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

    /// The conv row and the Mamba-2 head give the same bits on every vector unit this CPU has,
    /// and the conv those of the scalar per-channel loop.
    #[test]
    fn conv_and_scan_same_bits_on_every_vector_unit() {
        use crate::kernels::cpu::vector::{self, Unit};
        let vals = |n: usize, m: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * m % 101) as f32 - 50.0) * 0.037)
                .collect()
        };
        let (ch, k) = (70, 4);
        let (w, bias, x) = (vals(ch * k, 7), vals(ch, 3), vals(k * ch, 13));
        let taps = taps_by_position(&w, ch, k);
        let want: Vec<f32> = (0..ch)
            .map(|c| {
                let mut acc = 0.0f32;
                for j in 0..k {
                    acc += w[c * k + j] * x[j * ch + c];
                }
                acc + bias[c]
            })
            .collect();
        // d_state 36: four lanes of 8 and a tail of 4.
        let (nh, hd, n, groups, t) = (4, 8, 36, 2, 5);
        let xbc = vals(t * (nh * hd + 2 * groups * n), 17);
        let (dt, neg_a) = (vals(t * nh, 5), vec![-0.5, -1.0, -0.25, -2.0]);
        let (d, dt_bias) = (vals(nh, 11), vals(nh, 19));
        let p = MambaParams {
            heads: nh,
            head_dim: hd,
            d_state: n,
            groups,
            neg_a: &neg_a,
            d: &d,
            dt_bias: &dt_bias,
            dt_min: 0.0,
        };
        let scan = |unit| {
            let mut st = vals(hd * n, 23);
            let y = vector::on(unit, || mamba_head(&xbc, &dt, &p, 3, 0..t, &mut st));
            (y, st)
        };
        let base = scan(Unit::Baseline);
        // The scan's documented order, spelled out: update the row, then its dot with C in 8
        // lanes (element i in lane i mod 8), the tail serially, a fixed tree.
        let mut st = vals(hd * n, 23);
        let (row, inter, h, g) = (nh * hd + 2 * groups * n, nh * hd, 3, 3 / (nh / groups));
        for r in 0..t {
            let xr = &xbc[r * row..(r + 1) * row];
            let (bm, cm) = (
                &xr[inter + g * n..][..n],
                &xr[inter + (groups + g) * n..][..n],
            );
            let dd = softplus(dt[r * nh + h] + dt_bias[h]).max(0.0);
            let da = (dd * neg_a[h]).exp();
            for j in 0..hd {
                let (xj, srow) = (xr[h * hd + j], &mut st[j * n..(j + 1) * n]);
                let (mut acc, mut tail) = ([0.0f32; 8], 0.0f32);
                for i in 0..n {
                    srow[i] = srow[i] * da + (xj * dd) * bm[i];
                    if i < n / 8 * 8 {
                        acc[i % 8] += cm[i] * srow[i];
                    } else {
                        tail += cm[i] * srow[i];
                    }
                }
                let dot = ((acc[0] + acc[1]) + (acc[2] + acc[3]))
                    + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
                    + tail;
                let y = dot + d[h] * xj;
                assert_eq!(
                    y.to_bits(),
                    base.0[r * hd + j].to_bits(),
                    "row {r}, channel {j}"
                );
            }
        }
        assert!(
            st.iter()
                .zip(&base.1)
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );
        for unit in [Unit::Avx512, Unit::Avx2, Unit::Baseline] {
            if !unit.available() {
                println!("skip: conv and scan on {unit:?} (this CPU lacks it)");
                continue;
            }
            let mut o = vec![f32::NAN; ch];
            vector::on(unit, || {
                conv_row(&mut o, &taps, Some(&bias), |j| &x[j * ch..(j + 1) * ch])
            });
            assert!(o.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
            let got = scan(unit);
            assert!(
                got.0
                    .iter()
                    .zip(&base.0)
                    .all(|(a, b)| a.to_bits() == b.to_bits())
            );
            assert!(
                got.1
                    .iter()
                    .zip(&base.1)
                    .all(|(a, b)| a.to_bits() == b.to_bits())
            );
        }
    }
}
