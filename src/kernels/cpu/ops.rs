//! Element-wise and per-row f32 kernels: RMSNorm, RoPE, SiLU·mul, residual add, argmax.
//! Every function treats each row on its own, in a fixed order, so a row's result never depends
//! on the other rows of the batch.

use rayon::prelude::*;

use crate::kernels::rope::Rope;

/// Rows per rayon task for the cheap per-row kernels.
const ROWS_PER_TASK: usize = 16;

/// RMSNorm of one row as in transformers: `w * (x * rsqrt(mean(x²) + eps))`.
/// The mean of squares is accumulated in f64 (sequentially), then rounded to f32.
#[inline]
pub fn rms_norm_row(x: &[f32], w: &[f32], eps: f64, out: &mut [f32]) {
    let sum: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let var = (sum / x.len() as f64) as f32;
    let r = (1.0 / ((var as f64 + eps).sqrt())) as f32;
    for ((o, &v), &wi) in out.iter_mut().zip(x).zip(w) {
        *o = wi * (v * r);
    }
}

/// RMSNorm over every `w.len()`-wide row of `x` into `out` (resized; every element is
/// written, so the reused part is not cleared first).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f64, out: &mut Vec<f32>) {
    let d = w.len();
    out.resize(x.len(), 0.0);
    out.par_chunks_mut(d * ROWS_PER_TASK)
        .zip(x.par_chunks(d * ROWS_PER_TASK))
        .for_each(|(o, xs)| {
            for (orow, xrow) in o.chunks_exact_mut(d).zip(xs.chunks_exact(d)) {
                rms_norm_row(xrow, w, eps, orow);
            }
        });
}

/// In-place RMSNorm of every `w.len()`-wide row (Qwen3 per-head q/k norm).
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f64) {
    let d = w.len();
    x.par_chunks_mut(d * ROWS_PER_TASK).for_each(|xs| {
        let mut tmp = vec![0.0f32; d];
        for row in xs.chunks_exact_mut(d) {
            rms_norm_row(row, w, eps, &mut tmp);
            row.copy_from_slice(&tmp);
        }
    });
}

/// `x += y`, element-wise (the plain residual add, so a captured row is exactly
/// `residual + hidden`).
pub fn add_inplace(x: &mut [f32], y: &[f32]) {
    x.par_chunks_mut(4096)
        .zip(y.par_chunks(4096))
        .for_each(|(a, b)| {
            for (u, v) in a.iter_mut().zip(b) {
                *u += *v;
            }
        });
}

/// `out[t, i] = silu(gu[t, i]) * gu[t, I + i]` for `gu` of shape `[T, 2I]` (gate then up).
pub fn silu_mul(gu: &[f32], inter: usize, out: &mut Vec<f32>) {
    glu_rows(gu, inter, out, super::exp::silu_mul_into);
}

/// gpt-oss's clamped SwiGLU (transformers `GptOssExperts._apply_gate`, in f32):
/// `(clamp(u, -limit, limit) + 1) · g · sigmoid(alpha · g)` with `g = min(gate, limit)`.
pub fn swiglu_clamped(gu: &[f32], inter: usize, (alpha, limit): (f32, f32), out: &mut Vec<f32>) {
    glu(gu, inter, out, |g, u| {
        let g = g.min(limit);
        let u = u.clamp(-limit, limit);
        (u + 1.0) * (g * (1.0 / (1.0 + (-(g * alpha)).exp())))
    });
}

/// `out[t, i] = f(gu[t, i], gu[t, I + i])` over rows of `[gate (I) | up (I)]`.
fn glu(gu: &[f32], inter: usize, out: &mut Vec<f32>, f: impl Fn(f32, f32) -> f32 + Sync) {
    glu_rows(gu, inter, out, |g, u, o| {
        for ((oi, &gi), &ui) in o.iter_mut().zip(g).zip(u) {
            *oi = f(gi, ui);
        }
    });
}

/// `row(gate, up, out)` over the rows of `gu` `[T, 2I]` into `out` `[T, I]`.
fn glu_rows(
    gu: &[f32],
    inter: usize,
    out: &mut Vec<f32>,
    row: impl Fn(&[f32], &[f32], &mut [f32]) + Sync,
) {
    let t = gu.len() / (2 * inter);
    out.clear();
    out.resize(t * inter, 0.0);
    out.par_chunks_mut(inter)
        .zip(gu.par_chunks(2 * inter))
        .for_each(|(o, r)| {
            let (g, u) = r.split_at(inter);
            row(g, u, o);
        });
}

/// Index of the largest value (the first on ties; NaNs never win).
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in x.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best
}

/// Rotate-half RoPE (transformers `apply_rotary_pos_emb`) on the first `rotary_dim` dims of
/// every `head_dim`-wide head of each row of `q` and of `k` at `positions[t]`; the rest pass
/// through (partial rotary when `rotary_dim < head_dim`). One cos / sin per token serves both.
pub fn apply_rope(
    rope: &Rope,
    (q, k): (&mut [f32], &mut [f32]),
    positions: &[usize],
    head_dim: usize,
    rotary_dim: usize,
) {
    let half = rotary_dim / 2;
    if positions.is_empty() {
        return;
    }
    let (qrow, krow) = (q.len() / positions.len(), k.len() / positions.len());
    q.par_chunks_mut(qrow)
        .zip(k.par_chunks_mut(krow.max(1)))
        .zip(positions.par_iter())
        .for_each_init(
            || (vec![0.0f32; half], vec![0.0f32; half]),
            |(cos, sin), ((qr, kr), &pos)| {
                rope.cos_sin(pos, cos, sin);
                for head in qr
                    .chunks_exact_mut(head_dim)
                    .chain(kr.chunks_exact_mut(head_dim))
                {
                    rotate_half(&mut head[..rotary_dim], cos, sin);
                }
            },
        );
}

/// `x * cos + rotate_half(x) * sin` for one head.
#[inline]
fn rotate_half(head: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    let (a, b) = head.split_at_mut(half);
    for i in 0..half {
        let (x1, x2) = (a[i], b[i]);
        a[i] = x1 * cos[i] + (-x2) * sin[i];
        b[i] = x2 * cos[i] + x1 * sin[i];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::dtype::RopeScaling;

    #[test]
    fn rope_position_zero_is_identity_and_norm_preserving() {
        let rope = Rope::new(8, 10000.0, RopeScaling::None);
        let orig: Vec<f32> = (0..16).map(|i| i as f32 - 3.0).collect();
        let (mut x, mut k) = (orig.clone(), orig[..8].to_vec());
        apply_rope(&rope, (&mut x, &mut k), &[0], 8, 8);
        assert_eq!((&x[..], &k[..]), (&orig[..], &orig[..8]));
        apply_rope(&rope, (&mut x, &mut k), &[5], 8, 8);
        let n0: f32 = orig.iter().map(|v| v * v).sum();
        let n1: f32 = x.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-3);
        // k's head got the same rotation as q's first head.
        assert_eq!(k, x[..8]);
    }

    #[test]
    fn argmax_first_on_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, f32::NAN]), 1);
    }
}
