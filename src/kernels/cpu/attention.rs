//! Causal GQA attention over the paged KV cache.
//!
//! Each (token, kv head) is one task covering the query heads that share that kv head: it
//! reads keys/values of positions `0..=p` of its sequence **from the cache only** (the caller
//! writes the batch's K/V first), computes all scores, the softmax and the weighted sum of
//! values, always walking positions upwards from 0 in one fixed order. So the result is
//! bit-identical whether a key was written by an earlier chunk or by this one, and whatever
//! else shares the batch.
//!
//! The inner loops are written with explicit independent lanes and no fused multiply-add, so
//! the AVX2 build of the same code (picked at run time) gives the same bits as the baseline
//! SSE2 build: the attention result does not depend on the CPU either.

use std::sync::OnceLock;

use rayon::prelude::*;

use super::kv_cache::BatchPlan;

/// Head geometry of one attention layer.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Softmax scale, `head_dim^-0.5`.
    pub scale: f32,
}

/// Per-worker buffers: scores `[group, len]` and the cache offsets of the keys.
#[derive(Default)]
struct Scratch {
    scores: Vec<f32>,
    offsets: Vec<usize>,
}

/// One (token, kv head) task.
struct Task<'a> {
    /// The group's query heads, `[group, hd]`.
    q: &'a [f32],
    kc: &'a [f32],
    vc: &'a [f32],
    keys: KeyWalk<'a>,
    hd: usize,
    scale: f32,
}

/// `out[t, h*hd..]` = attention of `q[t, h*hd..]` over the cached keys/values of its sequence.
pub fn attention(
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
    plan: &BatchPlan<'_>,
    shape: AttnShape,
    out: &mut Vec<f32>,
) {
    let hd = shape.head_dim;
    let group = shape.heads / shape.kv_heads;
    let avx2 = has_avx2();
    out.clear();
    out.resize(q.len(), 0.0);
    out.par_chunks_mut(group * hd)
        .zip(q.par_chunks(group * hd))
        .enumerate()
        .for_each_init(Scratch::default, |scratch, (i, (o, qg))| {
            let t = i / shape.kv_heads;
            let kv_head = i % shape.kv_heads;
            let task = Task {
                q: qg,
                kc,
                vc,
                keys: KeyWalk {
                    table: plan.tables[plan.seq_of[t]],
                    block_size: plan.block_size,
                    len: plan.positions[t] + 1,
                    row: shape.kv_heads * hd,
                    offset: kv_head * hd,
                },
                hd,
                scale: shape.scale,
            };
            run_task(&task, scratch, o, avx2);
        });
}

fn has_avx2() -> bool {
    static AVX2: OnceLock<bool> = OnceLock::new();
    *AVX2.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx2")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

fn run_task(task: &Task<'_>, scratch: &mut Scratch, out: &mut [f32], avx2: bool) {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: only reached when the CPU reports AVX2.
        unsafe { attend_group_avx2(task, scratch, out) };
        return;
    }
    let _ = avx2;
    attend_group(task, scratch, out, dot);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn attend_group_avx2(task: &Task<'_>, scratch: &mut Scratch, out: &mut [f32]) {
    // The closure inherits this function's target features, so calling `dot_avx2` is safe.
    attend_group(task, scratch, out, |a, b| dot_avx2(a, b));
}

/// Where the keys of one (sequence, kv head) live in a layer's cache.
struct KeyWalk<'a> {
    table: &'a [u32],
    block_size: usize,
    /// Number of positions to read: `0..len`.
    len: usize,
    /// Floats per cache slot (`kv_heads * head_dim`).
    row: usize,
    /// Offset of this kv head inside a slot.
    offset: usize,
}

impl KeyWalk<'_> {
    /// Float offsets of (slot of j, this head) for j = 0, 1, ..., len-1, in order.
    fn offsets(&self, out: &mut Vec<usize>) {
        out.clear();
        let mut j = 0;
        for &block in self.table {
            if j >= self.len {
                break;
            }
            let base = block as usize * self.block_size;
            let n = self.block_size.min(self.len - j);
            out.extend((base..base + n).map(|slot| slot * self.row + self.offset));
            j += n;
        }
    }
}

/// Attention of the `group` query heads of one task.
#[inline(always)]
fn attend_group(
    task: &Task<'_>,
    scratch: &mut Scratch,
    out: &mut [f32],
    dot: impl Fn(&[f32], &[f32]) -> f32,
) {
    let (len, hd) = (task.keys.len, task.hd);
    let group = task.q.len() / hd;
    let Scratch { scores, offsets } = scratch;
    task.keys.offsets(offsets);
    scores.clear();
    scores.resize(group * len, 0.0);
    for (j, &off) in offsets.iter().enumerate() {
        let k = &task.kc[off..off + hd];
        for (g, qh) in task.q.chunks_exact(hd).enumerate() {
            scores[g * len + j] = dot(qh, k) * task.scale;
        }
    }
    for s in scores.chunks_exact_mut(len) {
        softmax_unnormalised(s);
    }
    out.fill(0.0);
    for (j, &off) in offsets.iter().enumerate() {
        let v = &task.vc[off..off + hd];
        for (g, o) in out.chunks_exact_mut(hd).enumerate() {
            axpy(scores[g * len + j], v, o);
        }
    }
    for (o, s) in out.chunks_exact_mut(hd).zip(scores.chunks_exact(len)) {
        let sum: f32 = s.iter().sum();
        let inv = 1.0 / sum;
        for x in o.iter_mut() {
            *x *= inv;
        }
    }
}

/// `s[j] = exp(s[j] - max(s))`.
#[inline(always)]
fn softmax_unnormalised(s: &mut [f32]) {
    let max = s.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    for v in s.iter_mut() {
        *v = (*v - max).exp();
    }
}

/// `o += p * v`, element-wise.
#[inline(always)]
fn axpy(p: f32, v: &[f32], o: &mut [f32]) {
    for (x, &y) in o.iter_mut().zip(v) {
        *x += p * y;
    }
}

const LANES: usize = 16;

/// Dot product with 16 independent partial sums combined in a fixed order: the same bits for
/// the same inputs every time, and the same as [`dot_avx2`].
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    finish_dot(acc, ra, rb)
}

/// Adds the tail products to the lanes, then sums the lanes as a fixed tree.
#[inline(always)]
fn finish_dot(mut acc: [f32; LANES], ra: &[f32], rb: &[f32]) -> f32 {
    for (l, (x, y)) in ra.iter().zip(rb).enumerate() {
        acc[l] += x * y;
    }
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            acc[l] += acc[l + width];
        }
    }
    acc[0]
}

/// [`dot`] with two 8-wide AVX registers holding lanes 0..8 and 8..16 (mul then add, no FMA,
/// so every lane sees exactly the operations of the portable version).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::{
        _mm256_add_ps, _mm256_loadu_ps, _mm256_mul_ps, _mm256_setzero_ps, _mm256_storeu_ps,
    };
    let n = a.len().min(b.len()) / LANES * LANES;
    let mut acc = [0.0f32; LANES];
    // SAFETY: every load reads 8 floats at offsets i and i + 8 with i + 16 <= n <= len of both
    // slices; the stores write the 16-float `acc`.
    unsafe {
        let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut i = 0;
        while i < n {
            lo = _mm256_add_ps(
                lo,
                _mm256_mul_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i))),
            );
            hi = _mm256_add_ps(
                hi,
                _mm256_mul_ps(
                    _mm256_loadu_ps(pa.add(i + 8)),
                    _mm256_loadu_ps(pb.add(i + 8)),
                ),
            );
            i += LANES;
        }
        _mm256_storeu_ps(acc.as_mut_ptr(), lo);
        _mm256_storeu_ps(acc.as_mut_ptr().add(8), hi);
    }
    finish_dot(acc, &a[n..], &b[n..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_naive_and_avx2_bits() {
        for n in [1usize, 15, 16, 37, 64, 128] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| 1.0 - i as f32 * 0.1).collect();
            let naive: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!((dot(&a, &b) as f64 - naive).abs() < 1e-3);
            #[cfg(target_arch = "x86_64")]
            if has_avx2() {
                // SAFETY: AVX2 is present.
                let fast = unsafe { dot_avx2(&a, &b) };
                assert_eq!(fast.to_bits(), dot(&a, &b).to_bits(), "n={n}");
            }
        }
    }
}
