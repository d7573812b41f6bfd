//! Row norms as transformers computes them: RMSNorm, LayerNorm without a bias (Cohere's) and
//! with one (`nn.LayerNorm`), each `w · normed` (`+ b`), the sums in f64 in a fixed order per
//! row, so a row's result never depends on the other rows of the batch.

use rayon::prelude::*;

use crate::kernels::device::{NormKind, RowNorm};

/// Rows per rayon task.
pub(super) const ROWS_PER_TASK: usize = 16;

/// `Σ f(x_i)` in f64: eight partial sums (element `i` into sum `i % 8`), added in a fixed
/// tree, then the tail in order. A fixed order per row, so a row's value never depends on the
/// batch; eight independent sums instead of one serial chain (which cost ~4% of a bf16 run),
/// vectorized on any x86-64 with the same bits.
#[inline]
fn sum8(x: &[f32], f: impl Fn(f32) -> f64) -> f64 {
    let mut acc = [0f64; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f(v);
        }
    }
    let mut sum = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    for &v in tail {
        sum += f(v);
    }
    sum
}

/// `1 / sqrt(var + eps)` rounded to f32, `var` the f32 mean of `f(x_i)` (each exact in f64).
#[inline]
fn inv_root(x: &[f32], eps: f64, f: impl Fn(f32) -> f64) -> f32 {
    let var = (sum8(x, f) / x.len() as f64) as f32;
    (1.0 / ((var as f64 + eps).sqrt())) as f32
}

/// `1 / sqrt(mean(x²) + eps)` as transformers' RMSNorm (f32 result), the mean of squares
/// accumulated in f64 ([`sum8`]).
#[inline]
pub fn inv_rms(x: &[f32], eps: f64) -> f32 {
    inv_root(x, eps, |v| (v as f64) * (v as f64))
}

/// RMSNorm of one row as in transformers: `w * (x * rsqrt(mean(x²) + eps))` ([`inv_rms`]).
#[inline]
pub fn rms_norm_row(x: &[f32], w: &[f32], eps: f64, out: &mut [f32]) {
    let r = inv_rms(x, eps);
    for ((o, &v), &wi) in out.iter_mut().zip(x).zip(w) {
        *o = wi * (v * r);
    }
}

/// LayerNorm without a bias of one row as Cohere's: `m = mean(x)` and the variance of
/// `x - m` each summed in f64 and rounded to f32, then `w * ((x - m) * rsqrt(var + eps))`.
#[inline]
pub fn layer_norm_row(x: &[f32], w: &[f32], eps: f64, out: &mut [f32]) {
    let mean = (sum8(x, |v| v as f64) / x.len() as f64) as f32;
    let r = inv_root(x, eps, |v| {
        let d = (v - mean) as f64;
        d * d
    });
    for ((o, &v), &wi) in out.iter_mut().zip(x).zip(w) {
        *o = wi * ((v - mean) * r);
    }
}

/// LayerNorm with a bias of one row (`nn.LayerNorm`): [`layer_norm_row`]'s value plus `b`,
/// `wb` holding `[w | b]`.
#[inline]
pub fn layer_norm_bias_row(x: &[f32], wb: &[f32], eps: f64, out: &mut [f32]) {
    let (w, b) = wb.split_at(x.len());
    layer_norm_row(x, w, eps, out);
    for (o, &bi) in out.iter_mut().zip(b) {
        *o += bi;
    }
}

/// A row norm: `(x, w, eps, out)`.
type RowFn = fn(&[f32], &[f32], f64, &mut [f32]);

/// The row function of `kind`.
fn row_fn(kind: NormKind) -> RowFn {
    match kind {
        NormKind::Rms => rms_norm_row,
        NormKind::Layer => layer_norm_row,
        NormKind::LayerBias => layer_norm_bias_row,
    }
}

/// The normed width of the weight vector `w` of `kind`, and the row function.
fn width_and_row(w: &[f32], kind: NormKind) -> (usize, RowFn) {
    (w.len() / kind.weights_per_value(), row_fn(kind))
}

/// `norm` of every row of `x` as wide as `w` holds weights for (`w.len()`, half of it with a
/// bias) into `out` (resized; every element is written, so the reused part is not cleared
/// first).
pub fn norm(x: &[f32], w: &[f32], norm: RowNorm, out: &mut Vec<f32>) {
    let (d, row) = width_and_row(w, norm.kind);
    out.resize(x.len(), 0.0);
    out.par_chunks_mut(d * ROWS_PER_TASK)
        .zip(x.par_chunks(d * ROWS_PER_TASK))
        .for_each(|(o, xs)| {
            for (orow, xrow) in o.chunks_exact_mut(d).zip(xs.chunks_exact(d)) {
                row(xrow, w, norm.eps, orow);
            }
        });
}

/// `x += y`, then [`norm`] of the sum into `out`, row chunk by row chunk: each chunk is
/// normed while it is still in cache (the same bits as the add then [`norm`]).
pub fn add_norm(x: &mut [f32], y: &[f32], w: &[f32], norm: RowNorm, out: &mut Vec<f32>) {
    let (d, row) = width_and_row(w, norm.kind);
    assert_eq!(x.len(), y.len(), "add_norm: x and y differ in size");
    out.resize(x.len(), 0.0);
    out.par_chunks_mut(d * ROWS_PER_TASK)
        .zip(x.par_chunks_mut(d * ROWS_PER_TASK))
        .zip(y.par_chunks(d * ROWS_PER_TASK))
        .for_each(|((o, xs), ys)| {
            for (u, v) in xs.iter_mut().zip(ys) {
                *u += *v;
            }
            for (orow, xrow) in o.chunks_exact_mut(d).zip(xs.chunks_exact(d)) {
                row(xrow, w, norm.eps, orow);
            }
        });
}

#[cfg(test)]
mod tests {
    use super::super::ops::add_inplace;
    use super::*;

    fn rnd_fn(mut s: u64) -> impl FnMut() -> f32 {
        move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0
        }
    }

    /// `inv_rms` against an f64 reference (widths with and without a tail of the 8 sums),
    /// and the fused residual add + norm against the two passes, bit for bit, for both kinds.
    #[test]
    fn rms_norm_matches_f64_and_the_fused_add_is_the_same_bits() {
        let mut rnd = rnd_fn(7);
        for d in [1usize, 7, 8, 13, 64, 1000, 1024] {
            let x: Vec<f32> = (0..3 * d).map(|_| rnd()).collect();
            for row in x.chunks_exact(d) {
                let ms: f64 = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / d as f64;
                let want = 1.0 / (ms + 1e-6).sqrt();
                let got = inv_rms(row, 1e-6) as f64;
                assert!((got - want).abs() <= 1e-7 * want, "d {d}: {got} vs {want}");
            }
            let (y, wb): (Vec<f32>, Vec<f32>) = (
                (0..3 * d).map(|_| rnd()).collect(),
                (0..2 * d).map(|_| rnd()).collect(),
            );
            for kind in [NormKind::Rms, NormKind::Layer, NormKind::LayerBias] {
                let op = RowNorm { kind, eps: 1e-6 };
                let w = &wb[..d * kind.weights_per_value()];
                let (mut x1, mut x2) = (x.clone(), x.clone());
                let (mut two, mut fused) = (Vec::new(), vec![f32::NAN; 5]);
                add_inplace(&mut x1, &y);
                norm(&x1, w, op, &mut two);
                add_norm(&mut x2, &y, w, op, &mut fused);
                let b = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!((b(&x2), b(&fused)), (b(&x1), b(&two)), "d {d} {kind:?}");
            }
        }
    }

    /// LayerNorm against an f64 reference: a mean far from zero (which RMSNorm would keep)
    /// leaves rows of mean 0 and variance 1 before the weight; its bias is added last.
    #[test]
    fn layer_norm_centres_and_scales_like_f64() {
        let mut rnd = rnd_fn(11);
        for d in [1usize, 5, 8, 17, 256] {
            let x: Vec<f32> = (0..d).map(|_| rnd() + 100.0).collect();
            let w: Vec<f32> = (0..d).map(|_| rnd()).collect();
            let (mut out, mut biased) = (Vec::new(), Vec::new());
            let op = |kind| RowNorm { kind, eps: 1e-5 };
            norm(&x, &w, op(NormKind::Layer), &mut out);
            // With a bias: the same values plus it (`[w | b]`).
            let b: Vec<f32> = (0..d).map(|_| rnd()).collect();
            let wb = [w.clone(), b.clone()].concat();
            norm(&x, &wb, op(NormKind::LayerBias), &mut biased);
            for ((&o, &ob), &bi) in out.iter().zip(&biased).zip(&b) {
                assert_eq!(ob.to_bits(), (o + bi).to_bits(), "d {d}");
            }
            let mean = x.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
            let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / d as f64;
            for ((&o, &v), &wi) in out.iter().zip(&x).zip(&w) {
                let want = wi as f64 * (v as f64 - mean) / (var + 1e-5).sqrt();
                // The mean rounded to f32 (~100 · 2^-24) moves each centred value by that much.
                let tol = 2e-5 * (1.0 + wi.abs() as f64 / (var + 1e-5).sqrt());
                assert!((o as f64 - want).abs() <= tol, "d {d}: {o} vs {want}");
            }
        }
    }
}
