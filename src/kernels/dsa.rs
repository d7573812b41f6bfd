//! DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5; transformers' `DeepseekV32Indexer`), the
//! device-neutral part: what a device's [`Device::dsa_select`] is given, and the rule every
//! device follows, in code: one token's arithmetic ([`Indexer`], [`top_keys`]), which the CPU
//! runs and the CUDA kernels repeat operation for operation (their tests hold them to it).
//!
//! # The rule (transformers' indexer, without the Hadamard rotation and FP8 of DeepSeek's
//! reference: the rotation keeps dot products, FP8 is a precision choice)
//! - `k = LayerNorm(wk · x)` (`[head_dim]`, one per token, cached per indexer layer in the KV
//!   cache's slots), `q = wq_b · q_resid` (`[heads, head_dim]`), both rotated on their first
//!   `rope` dims by the model's RoPE table (pairs `(i, i + rope/2)` for DeepSeek-V3.2, `(2i,
//!   2i + 1)` for GLM-5: those are de-interleaved first, which keeps every `q · k`).
//! - A query at position `p` scores each key `j <= p` of its sequence:
//!   `Σ_h w_h · relu(q_h · k_j · head_dim^-0.5)` with `w = weights_proj · x · heads^-0.5`.
//! - It keeps every key while `p < topk` (the dense attention), and past that its `topk`
//!   highest-scoring keys, ties to the lower position; attention then runs over those keys
//!   only, in position order. GLM-5's "shared" layers reuse the last selection.
//!
//! A token's selection depends only on its own q, w and its sequence's cached keys, so it is
//! the same whatever shares the batch and however the prompt was cut into chunks.
//!
//! Fixed arithmetic: the LayerNorm's sums in order, dot products as 8 partial sums of plain
//! products ([`dot8`]), a key's score summed in head order, the top keys by
//! `f32::total_cmp` (ties to the lower position).

use super::Device;
use super::rope::{Rope, rotate_half};

/// The indexer keys' cache beside the KV cache: `layers` indexer layers of `dim` values per
/// KV slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexShape {
    pub layers: usize,
    pub dim: usize,
}

/// One indexer layer's call.
pub struct DsaCall<'a, D: Device> {
    /// This layer's index among the indexer layers (its index-key cache layer).
    pub index_layer: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// Keys a query keeps: every one up to this many, its best this many past it.
    pub topk: usize,
    /// The RoPE table and the rotated dims (the first of each q head and of k).
    pub rope: (&'a D::Rope, usize),
    /// Rotated pairs `(2i, 2i + 1)` (GLM-5) instead of `(i, i + rope / 2)` (DeepSeek-V3.2).
    pub interleave: bool,
    /// `k_norm`: LayerNorm weight, bias (`[head_dim]`) and eps.
    pub k_norm: (&'a D::Vector, &'a D::Vector, f64),
}

impl<D: Device> DsaCall<'_, D> {
    /// `head_dim^-0.5` (f64, rounded to f32) on every dot product.
    pub fn score_scale(&self) -> f32 {
        (self.head_dim as f64).powf(-0.5) as f32
    }

    /// `heads^-0.5` on every head weight.
    pub fn weight_scale(&self) -> f32 {
        (self.heads as f64).powf(-0.5) as f32
    }

    /// The widths of q, k and the head weights (`[heads · head_dim]`, `[head_dim]`, `[heads]`).
    pub fn widths(&self) -> [usize; 3] {
        [self.heads * self.head_dim, self.head_dim, self.heads]
    }

    /// Whether an index-key cache of `shape` holds this call's layer at its head dim.
    pub fn fits(&self, shape: IndexShape) -> bool {
        shape.holds(self.index_layer, self.head_dim)
    }

    /// The geometry makes sense ([`check_indexer`]) and `topk` is positive.
    pub fn check(&self) -> Result<(), String> {
        check_indexer(self.heads, self.head_dim, self.rope.1)?;
        match self.topk {
            0 => Err("index_topk of 0".into()),
            _ => Ok(()),
        }
    }
}

impl IndexShape {
    /// Whether this cache holds index-key layer `layer` of `dim` values.
    pub fn holds(&self, layer: usize, dim: usize) -> bool {
        layer < self.layers && dim == self.dim
    }
}

/// An indexer's geometry makes sense (DSA's and QSA's): some heads and dims, an even number
/// of rotated dims no wider than a head.
pub fn check_indexer(heads: usize, head_dim: usize, rot: usize) -> Result<(), String> {
    match () {
        _ if heads == 0 || head_dim == 0 => Err("an indexer without heads".into()),
        _ if rot > head_dim || !rot.is_multiple_of(2) => {
            Err(format!("indexer RoPE over {rot} of {head_dim} dims"))
        }
        _ => Ok(()),
    }
}

/// Where a de-interleaved rotated dim `c` (of `rot`) comes from: `x0, x2, …, x1, x3, …`.
pub fn deinterleaved_source(c: usize, rot: usize) -> usize {
    match c < rot / 2 {
        true => 2 * c,
        false => 2 * (c - rot / 2) + 1,
    }
}

/// One token's indexer arithmetic.
pub struct Indexer<'a> {
    pub heads: usize,
    pub head_dim: usize,
    pub topk: usize,
    pub rope: (&'a Rope, usize),
    pub interleave: bool,
    /// `k_norm`'s weight, bias and eps.
    pub norm: (&'a [f32], &'a [f32], f64),
    pub score_scale: f32,
    pub weight_scale: f32,
}

impl Indexer<'_> {
    /// One token's `k` (`[head_dim]`) LayerNormed, then `k` and its q heads (`[heads ·
    /// head_dim]`) rotated at `pos`, in place; `tmp` is scratch.
    pub fn prepare(&self, q: &mut [f32], k: &mut [f32], pos: usize, tmp: &mut Vec<f32>) {
        let (d, rot) = (self.head_dim, self.rope.1);
        layer_norm(k, self.norm);
        let half = rot / 2;
        tmp.resize(2 * half + rot, 0.0);
        let (cs, t) = tmp.split_at_mut(2 * half);
        let (cos, sin) = cs.split_at_mut(half);
        self.rope.0.cos_sin(pos, cos, sin);
        for head in q.chunks_exact_mut(d).chain([k]) {
            if self.interleave {
                t.copy_from_slice(&head[..rot]);
                for (c, h) in head[..rot].iter_mut().enumerate() {
                    *h = t[deinterleaved_source(c, rot)];
                }
            }
            rotate_half(&mut head[..rot], cos, sin);
        }
    }

    /// A prepared key's score for a token's prepared q heads and head weights `w`.
    #[inline(always)]
    pub fn score(&self, q: &[f32], w: &[f32], key: &[f32]) -> f32 {
        let (d, mut s, mut w) = (self.head_dim, 0.0f32, w.iter());
        dot8_each(&q[..self.heads * d], &key[..d], |x| {
            let wh = *w.next().unwrap_or(&0.0);
            s += wh * self.weight_scale * (x * self.score_scale).max(0.0);
        });
        s
    }
}

/// torch's LayerNorm of one row in f32: `(x - mean) · (var + eps)^-0.5 · w + b`, the biased
/// variance, both sums in order.
fn layer_norm(x: &mut [f32], (w, b, eps): (&[f32], &[f32], f64)) {
    let n = x.len() as f32;
    let mean = x.iter().fold(0.0f32, |a, &v| a + v) / n;
    let var = x.iter().fold(0.0f32, |a, &v| a + (v - mean) * (v - mean)) / n;
    let r = 1.0 / (var + eps as f32).sqrt();
    for ((v, &wi), &bi) in x.iter_mut().zip(w).zip(b) {
        *v = (*v - mean) * r * wi + bi;
    }
}

/// The positions of the `k` highest scores (ties to the lower position; NaN above all, as
/// `total_cmp` orders it), ascending.
pub fn top_keys(scores: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..scores.len() as u32).collect();
    let order =
        |a: &u32, b: &u32| (scores[*b as usize].total_cmp(&scores[*a as usize])).then(a.cmp(b));
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, order);
        idx.truncate(k);
    }
    idx.sort_unstable();
    idx
}

/// `Σ a[i] · b[i]` as 8 partial sums of plain products over whole chunks of 8, the tail in
/// order, then `((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)) + tail`.
#[inline]
pub fn dot8(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let ((ac, at), (bc, bt)) = (a[..n].as_chunks::<8>(), b[..n].as_chunks::<8>());
    let tail = at.iter().zip(bt).fold(0.0f32, |t, (x, y)| t + x * y);
    let mut s = [0.0f32; 8];
    for (x, y) in ac.iter().zip(bc) {
        for i in 0..8 {
            s[i] += x[i] * y[i];
        }
    }
    // Seen through `black_box`, the pairwise sums below no longer lead LLVM to split `s`
    // into shuffled halves: the loop stays one 8-lane vector (a ymm where the caller is
    // compiled for AVX2). The arithmetic is the same either way.
    sum8(&std::hint::black_box(s), tail)
}

/// `dot8`'s last step: `((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)) + tail`.
#[inline(always)]
fn sum8(s: &[f32; 8], tail: f32) -> f32 {
    ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])) + tail
}

/// [`dot8`] of each row of `rows` (`[n, key.len()]`) with `key`, handed to `f` in row order:
/// the same bits, four rows at a time where they can be (one row's sum waits on its own adds;
/// four in flight fill the pipeline).
#[inline(always)]
pub fn dot8_each(rows: &[f32], key: &[f32], mut f: impl FnMut(f32)) {
    let d = key.len();
    let mut quads = rows.chunks_exact(4 * d.max(1));
    for quad in &mut quads {
        dot8_4(quad, key).into_iter().for_each(&mut f);
    }
    for row in quads.remainder().chunks_exact(d.max(1)) {
        f(dot8(row, key));
    }
}

/// [`dot8`] of four rows (`[4, key.len()]`) with `key`, the four sums side by side.
#[inline(always)]
fn dot8_4(rows: &[f32], key: &[f32]) -> [f32; 4] {
    let d = key.len();
    let (kc, kt) = key.as_chunks::<8>();
    let row = |h: usize| rows[h * d..][..d].as_chunks::<8>();
    let (r0, r1, r2, r3) = (row(0).0, row(1).0, row(2).0, row(3).0);
    let mut s = [[0.0f32; 8]; 4];
    let chunks = kc.iter().zip(r0).zip(r1).zip(r2).zip(r3);
    for ((((y, x0), x1), x2), x3) in chunks {
        for (s, x) in s.iter_mut().zip([x0, x1, x2, x3]) {
            for i in 0..8 {
                s[i] += x[i] * y[i];
            }
        }
    }
    // As in `dot8`: the partial sums stay whole vectors.
    let s = std::hint::black_box(s);
    std::array::from_fn(|h| {
        let tail = (row(h).1.iter().zip(kt)).fold(0.0f32, |t, (x, y)| t + x * y);
        sum8(&s[h], tail)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_keys_take_the_best_scores_ties_to_the_lower_position() {
        let s = [1.0, 3.0, -0.0, 3.0, 0.0, 2.0];
        assert_eq!(top_keys(&s, 1), [1]);
        assert_eq!(top_keys(&s, 2), [1, 3]);
        assert_eq!(top_keys(&s, 3), [1, 3, 5]);
        // +0 above -0 (total order).
        assert_eq!(top_keys(&s, 5), [0, 1, 3, 4, 5]);
        assert_eq!(top_keys(&s, 9), [0, 1, 2, 3, 4, 5]);
        assert_eq!(top_keys(&[f32::NAN, 5.0, 1.0], 1), [0]);
    }

    /// Sparse attention refuses what its kernels do not apply, before any device runs it; the
    /// same variants are fine without it.
    #[test]
    fn sparse_attention_takes_no_window_chunks_sinks_temperature_or_cap() {
        use crate::kernels::CpuDevice;
        use crate::kernels::device::{AttnSoftmax, QueryTemperature, SoftmaxVariant};
        let sinks = vec![0.0f32; 4];
        let temperature = QueryTemperature {
            floor_scale: 8.0,
            attn_scale: 0.1,
            offset: 0.0,
        };
        let variant = |sparse: Option<usize>, v: usize| AttnSoftmax::<CpuDevice> {
            window: (v == 1).then_some(4),
            chunk: (v == 2).then_some(4),
            sinks: (v == 3).then_some(&sinks),
            temperature: (v == 4).then_some(temperature),
            softcap: (v == 5).then_some(50.0),
            sparse,
            ..SoftmaxVariant::causal()
        };
        assert!(variant(Some(8), 0).check().is_ok());
        for v in 1..=5 {
            assert!(variant(None, v).check().is_ok(), "variant {v}");
            let err = variant(Some(8), v).check().unwrap_err().to_string();
            assert!(err.contains("sparse attention"), "variant {v}: {err}");
        }
        for cap in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            let capped = AttnSoftmax::<CpuDevice> {
                softcap: Some(cap),
                ..SoftmaxVariant::causal()
            };
            assert!(capped.check().is_err(), "soft cap {cap}");
        }
    }
}
