//! Element-wise and per-row f32 kernels: RMSNorm, RoPE, SiLU·mul, residual add, argmax.
//! Every function treats each row on its own, in a fixed order, so a row's result never depends
//! on the other rows of the batch.

use rayon::prelude::*;

use crate::models::RopeScaling;

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

/// RMSNorm over every `w.len()`-wide row of `x` into `out` (resized).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f64, out: &mut Vec<f32>) {
    let d = w.len();
    out.clear();
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
    let t = gu.len() / (2 * inter);
    out.clear();
    out.resize(t * inter, 0.0);
    out.par_chunks_mut(inter)
        .zip(gu.par_chunks(2 * inter))
        .for_each(|(o, row)| {
            let (g, u) = row.split_at(inter);
            for ((oi, &gi), &ui) in o.iter_mut().zip(g).zip(u) {
                *oi = (gi / (1.0 + (-gi).exp())) * ui;
            }
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

/// Rotary embedding, rotate-half convention (transformers `apply_rotary_pos_emb`).
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
}

impl Rope {
    pub fn new(head_dim: usize, theta: f64, scaling: RopeScaling) -> Self {
        let mut inv_freq = default_inv_freq(head_dim, theta);
        if let RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } = scaling
        {
            llama3_scale(
                &mut inv_freq,
                factor as f32,
                low_freq_factor as f32,
                high_freq_factor as f32,
                original_max_position_embeddings as f32,
            );
        }
        Self { inv_freq }
    }

    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// `(cos, sin)` for one position, each `head_dim / 2` long.
    pub fn cos_sin(&self, pos: usize, cos: &mut [f32], sin: &mut [f32]) {
        for ((c, s), &f) in cos.iter_mut().zip(sin.iter_mut()).zip(&self.inv_freq) {
            // transformers: freqs = inv_freq (f32) * position (f32), cos/sin in f32.
            let angle = (f * pos as f32) as f64;
            *c = angle.cos() as f32;
            *s = angle.sin() as f32;
        }
    }

    /// Rotates every head of every row of `x` (`[T, heads * head_dim]`) at `positions[t]`.
    pub fn apply(&self, x: &mut [f32], positions: &[usize], heads: usize) {
        let half = self.inv_freq.len();
        let row = heads * 2 * half;
        x.par_chunks_mut(row)
            .zip(positions.par_iter())
            .for_each(|(xr, &pos)| {
                let mut cos = vec![0.0f32; half];
                let mut sin = vec![0.0f32; half];
                self.cos_sin(pos, &mut cos, &mut sin);
                for head in xr.chunks_exact_mut(2 * half) {
                    rotate_half(head, &cos, &sin);
                }
            });
    }
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

/// `1 / theta^(2i / d)` in f32, as transformers `_compute_default_rope_parameters`.
fn default_inv_freq(head_dim: usize, theta: f64) -> Vec<f32> {
    let base = theta as f32;
    (0..head_dim / 2)
        .map(|i| 1.0f32 / base.powf((2 * i) as f32 / head_dim as f32))
        .collect()
}

/// transformers `_compute_llama3_parameters`, step by step in f32 (torch's
/// `scalar / tensor` is `reciprocal(tensor) * scalar`).
fn llama3_scale(inv: &mut [f32], factor: f32, low: f32, high: f32, old_ctx: f32) {
    let low_freq_wavelen = old_ctx / low;
    let high_freq_wavelen = old_ctx / high;
    let two_pi = std::f64::consts::PI as f32 * 2.0;
    for f in inv.iter_mut() {
        let wavelen = (1.0 / *f) * two_pi;
        let llama = if wavelen > low_freq_wavelen {
            *f / factor
        } else {
            *f
        };
        let smooth = ((1.0 / wavelen) * old_ctx - low) / (high - low);
        let smoothed = (1.0 - smooth) * llama / factor + smooth * llama;
        // ~(wavelen < high) * ~(wavelen > low); wavelen is never NaN here.
        let medium = wavelen >= high_freq_wavelen && wavelen <= low_freq_wavelen;
        *f = if medium { smoothed } else { llama };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_has_three_bands() {
        let plain = Rope::new(16, 10000.0, RopeScaling::None);
        let scaled = Rope::new(
            16,
            10000.0,
            RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 64.0,
            },
        );
        let ratios: Vec<f32> = scaled
            .inv_freq()
            .iter()
            .zip(plain.inv_freq())
            .map(|(a, b)| a / b)
            .collect();
        assert_eq!(ratios[0], 1.0);
        assert!(ratios[1] < 1.0 && ratios[1] > 0.125);
        assert!((ratios[7] - 0.125).abs() < 1e-6);
    }

    #[test]
    fn rope_position_zero_is_identity_and_norm_preserving() {
        let rope = Rope::new(8, 10000.0, RopeScaling::None);
        let orig: Vec<f32> = (0..16).map(|i| i as f32 - 3.0).collect();
        let mut x = orig.clone();
        rope.apply(&mut x, &[0], 2);
        assert_eq!(x, orig);
        rope.apply(&mut x, &[5], 2);
        let n0: f32 = orig.iter().map(|v| v * v).sum();
        let n1: f32 = x.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-3);
    }

    #[test]
    fn argmax_first_on_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, f32::NAN]), 1);
    }
}
