//! Causal GQA attention over the paged KV cache.
//!
//! Each (token, head) is one task: it reads keys/values of positions `0..=p` of its sequence
//! **from the cache only** (the caller writes the batch's K/V first), computes all scores, the
//! softmax and the weighted sum of values, always walking positions upwards from 0 in one fixed
//! order. So the result is bit-identical whether a key was written by an earlier chunk or by
//! this one, and whatever else shares the batch.

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
    out.clear();
    out.resize(q.len(), 0.0);
    out.par_chunks_mut(hd)
        .zip(q.par_chunks(hd))
        .enumerate()
        .for_each_init(Vec::new, |scores, (i, (o, qh))| {
            let t = i / shape.heads;
            let h = i % shape.heads;
            let kv_head = h / (shape.heads / shape.kv_heads);
            let table = plan.tables[plan.seq_of[t]];
            let keys = KeyWalk {
                table,
                block_size: plan.block_size,
                len: plan.positions[t] + 1,
                row: shape.kv_heads * hd,
                offset: kv_head * hd,
            };
            attend_one(qh, kc, vc, &keys, shape.scale, scores, o);
        });
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
    /// Calls `f(j, float offset of (slot of j, head))` for j = 0, 1, ..., len-1 in order.
    #[inline]
    fn for_each(&self, mut f: impl FnMut(usize, usize)) {
        let mut j = 0;
        for &block in self.table {
            if j >= self.len {
                break;
            }
            let base = block as usize * self.block_size;
            let n = self.block_size.min(self.len - j);
            for s in 0..n {
                f(j, (base + s) * self.row + self.offset);
                j += 1;
            }
        }
    }
}

fn attend_one(
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
    keys: &KeyWalk<'_>,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let hd = q.len();
    scores.clear();
    scores.resize(keys.len, 0.0);
    let mut max = f32::NEG_INFINITY;
    keys.for_each(|j, off| {
        let s = dot(q, &kc[off..off + hd]) * scale;
        scores[j] = s;
        max = max.max(s);
    });
    let mut sum = 0.0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    out.fill(0.0);
    keys.for_each(|j, off| {
        let p = scores[j];
        for (o, &v) in out.iter_mut().zip(&vc[off..off + hd]) {
            *o += p * v;
        }
    });
    let inv = 1.0 / sum;
    for o in out.iter_mut() {
        *o *= inv;
    }
}

/// Dot product with 16 independent partial sums combined in a fixed order (vectorisable, and
/// the same bits for the same inputs every time).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    const L: usize = 16;
    let mut acc = [0.0f32; L];
    let (ca, cb) = (a.chunks_exact(L), b.chunks_exact(L));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..L {
            acc[l] += x[l] * y[l];
        }
    }
    for (l, (x, y)) in ra.iter().zip(rb).enumerate() {
        acc[l] += x * y;
    }
    let mut width = L;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            acc[l] += acc[l + width];
        }
    }
    acc[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_naive() {
        let a: Vec<f32> = (0..37).map(|i| i as f32 * 0.5).collect();
        let b: Vec<f32> = (0..37).map(|i| 1.0 - i as f32 * 0.1).collect();
        let naive: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        assert!((dot(&a, &b) as f64 - naive).abs() < 1e-3);
    }
}
