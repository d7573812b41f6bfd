//! The Mamba-1 selective scan (Mamba, Falcon-Mamba, Jamba), token by token in f32 (chunk invariance:
//! [`recurrent`](super::recurrent)'s module docs).
//!
//! Unlike Mamba-2's one decay per head, every state value has its own decay
//! `exp(dt[c] · A[c, n])`: `d_state` exponentials per channel and token, taken with
//! [`exp_neg`] (the argument is never positive), which gives the same bits on every vector
//! unit. Channels go to the tasks in blocks (a task per channel would cost more in scheduling
//! than its work); each channel's arithmetic is the same whatever block it is in.

use std::ops::Range;

use super::exp::exp_neg;
use super::recurrent::{HeadRows, per_head, softplus};
use crate::kernels::plan::SeqState;

/// Channels per task.
const BLOCK: usize = 16;

/// Mamba-1 per-channel parameters over `neg_a.len() / d_state` channels.
pub struct Mamba1Params<'a> {
    pub d_state: usize,
    /// `-exp(A_log)`, `[inner, d_state]`.
    pub neg_a: &'a [f32],
    pub d: &'a [f32],
    pub dt_bias: &'a [f32],
    /// B's and C's weights (`[2 · d_state]`), times B and C before use.
    pub bc_weight: &'a [f32],
}

/// The inputs of one scan: the conv output `x` and the raw `dt` (`[T, inner]` each), and
/// `[B | C]` rows (`d_state` each) `bc_stride` apart from `bc`'s start.
pub struct Mamba1Inputs<'a> {
    pub x: &'a [f32],
    pub dt: &'a [f32],
    pub bc: &'a [f32],
    pub bc_stride: usize,
}

/// The scan over the chunks `seqs` (rows of the inputs), from and into `state`
/// (`[slots, inner, d_state]`); writes `y` (`[T, inner]`) into `out`.
pub fn mamba1_scan(
    io: &Mamba1Inputs<'_>,
    p: &Mamba1Params<'_>,
    seqs: &[SeqState],
    state: &mut [f32],
    out: &mut Vec<f32>,
) {
    let inner = p.d.len();
    let t = io.x.len() / inner.max(1);
    let block = block_of(inner);
    per_head(
        state,
        (inner / block, block * p.d_state, block),
        seqs,
        t,
        out,
        #[inline(always)]
        |blk, rows, st, o| channel_block(io, p, (blk * block..(blk + 1) * block, rows), st, o),
    );
}

/// The largest power of two up to [`BLOCK`] that divides `inner`.
fn block_of(inner: usize) -> usize {
    let mut b = BLOCK;
    while b > 1 && !inner.is_multiple_of(b) {
        b /= 2;
    }
    b
}

/// Channels `chans` over `rows` (one request's chunk), from and into their state rows `st`
/// (`[chans.len(), d_state]`); output row i of the block into `out.row(i)`.
#[inline(always)]
fn channel_block(
    io: &Mamba1Inputs<'_>,
    p: &Mamba1Params<'_>,
    (chans, rows): (Range<usize>, Range<usize>),
    st: &mut [f32],
    mut out: HeadRows<'_>,
) {
    let (n, inner) = (p.d_state, p.d.len());
    let mut weighted = vec![0.0f32; 2 * n];
    for (i, r) in rows.enumerate() {
        let bc = &io.bc[r * io.bc_stride..r * io.bc_stride + 2 * n];
        for ((w, &v), &s) in weighted.iter_mut().zip(bc).zip(p.bc_weight) {
            *w = s * v;
        }
        let (b, c) = weighted.split_at(n);
        let o = out.row(i);
        for ((oj, ch), s) in o.iter_mut().zip(chans.clone()).zip(st.chunks_exact_mut(n)) {
            let x = io.x[r * inner + ch];
            let dt = softplus(io.dt[r * inner + ch] + p.dt_bias[ch]);
            let a = &p.neg_a[ch * n..(ch + 1) * n];
            *oj = update_dot(s, (a, b, c), dt, x) + x * p.d[ch];
        }
    }
}

/// One channel's state row: `s = exp(dt·a) · s + (dt·b) · x` element by element (transformers'
/// order), and the new row's dot product with `c` in 8 lanes (element i in lane i mod 8,
/// the tail serially) summed in a fixed tree. No FMA contraction and a fixed order.
#[inline(always)]
fn update_dot(s: &mut [f32], (a, b, c): (&[f32], &[f32], &[f32]), dt: f32, x: f32) -> f32 {
    let mut acc = [0.0f32; 8];
    let full = s.len() / 8 * 8;
    let lanes = s[..full].chunks_exact_mut(8).zip(a.chunks_exact(8));
    for ((sv, av), (bv, cv)) in lanes.zip(b.chunks_exact(8).zip(c.chunks_exact(8))) {
        // Copies in registers: the stores then cannot alias the loads, and the lanes vectorise.
        let mut sl: [f32; 8] = (&*sv).try_into().expect("chunks of 8");
        for l in 0..8 {
            sl[l] = exp_neg(dt * av[l]) * sl[l] + (dt * bv[l]) * x;
            acc[l] += sl[l] * cv[l];
        }
        sv.copy_from_slice(&sl);
    }
    let mut tail = 0.0f32;
    for k in full..s.len() {
        s[k] = exp_neg(dt * a[k]) * s[k] + (dt * b[k]) * x;
        tail += s[k] * c[k];
    }
    ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The recurrence in f64, one channel at a time, for `seq` rows from a zero state.
    fn reference(io: &Mamba1Inputs<'_>, p: &Mamba1Params<'_>, rows: usize) -> Vec<f64> {
        let (n, inner) = (p.d_state, p.d.len());
        let mut h = vec![0.0f64; inner * n];
        let mut y = vec![0.0f64; rows * inner];
        for r in 0..rows {
            for ch in 0..inner {
                let x = io.x[r * inner + ch] as f64;
                let z = (io.dt[r * inner + ch] + p.dt_bias[ch]) as f64;
                let dt = if z > 20.0 { z } else { z.exp().ln_1p() };
                let mut dot = 0.0;
                for k in 0..n {
                    let s = &mut h[ch * n + k];
                    let w = |j: usize| (p.bc_weight[j] * io.bc[r * io.bc_stride + j]) as f64;
                    let (b, c) = (w(k), w(n + k));
                    *s = (dt * p.neg_a[ch * n + k] as f64).exp() * *s + dt * b * x;
                    dot += *s * c;
                }
                y[r * inner + ch] = dot + x * p.d[ch] as f64;
            }
        }
        y
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) % 2001) as f32)
            .map(|v| v / 1000.0 - 1.0)
            .collect()
    }

    /// Against f64, and byte-identical whether the rows come in one chunk or three (the
    /// state carried in the slot), for channel counts that fill whole and partial blocks and
    /// state sizes with and without a tail past the 8 lanes.
    #[test]
    fn matches_f64_and_is_chunk_invariant() {
        for (inner, n) in [(48, 16), (6, 12), (32, 3)] {
            let t = 11;
            let a: Vec<f32> = values(inner * n, 1)
                .iter()
                .map(|v| -(v.abs() + 0.1))
                .collect();
            let (d, bias, bc_weight) = (values(inner, 2), values(inner, 3), values(2 * n, 7));
            let p = Mamba1Params {
                d_state: n,
                neg_a: &a,
                d: &d,
                dt_bias: &bias,
                bc_weight: &bc_weight,
            };
            let (x, dt) = (values(t * inner, 4), values(t * inner, 5));
            let bc_stride = 2 * n + 5;
            let bc = values(t * bc_stride, 6);
            let io = Mamba1Inputs {
                x: &x,
                dt: &dt,
                bc: &bc,
                bc_stride,
            };
            let run = |cuts: &[usize]| {
                let mut state = vec![0.0f32; 2 * inner * n];
                let mut y = Vec::new();
                for w in cuts.windows(2) {
                    let sub = Mamba1Inputs {
                        x: &x[w[0] * inner..w[1] * inner],
                        dt: &dt[w[0] * inner..w[1] * inner],
                        bc: &bc[w[0] * bc_stride..],
                        bc_stride,
                    };
                    let seqs = [SeqState {
                        rows: 0..w[1] - w[0],
                        slot: 1,
                        start: w[0],
                    }];
                    let mut out = Vec::new();
                    mamba1_scan(&sub, &p, &seqs, &mut state, &mut out);
                    y.extend(out);
                }
                y
            };
            let whole = run(&[0, t]);
            assert_eq!(whole, run(&[0, 4, 5, t]), "inner {inner} n {n}");
            let want = reference(&io, &p, t);
            for (g, w) in whole.iter().zip(&want) {
                assert!(
                    (*g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()),
                    "{g} vs {w}"
                );
            }
        }
    }
}
