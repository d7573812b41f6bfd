//! DeepSeek Sparse Attention on the CPU ([`crate::kernels::dsa`] has the rule and each
//! token's arithmetic): the indexer keys' cache, each token's selection and the attention over
//! the selected keys.
//!
//! The attention's arithmetic per (token, head), the same whatever shares the batch: scores
//! by [`dot8`](crate::kernels::dsa::dot8), the softmax as the dense kernel's ([`exp_neg`], the sum in key order), the
//! values in key order.

use rayon::prelude::*;

use super::exp::exp_neg;
use super::vector::widest;
use crate::kernels::device::AttnShape;
pub use crate::kernels::dsa::Indexer;
use crate::kernels::dsa::{IndexShape, dot8_each, top_keys};
use crate::kernels::plan::{BatchPlan, slot_of};

/// The indexer keys of every indexer layer: `[slots, dim]` each, f32.
pub struct IndexCache {
    keys: Vec<Vec<f32>>,
    dim: usize,
}

impl IndexCache {
    /// Zeroed (by the allocator) for `slots` KV slots; an error when memory is short.
    pub fn new(shape: IndexShape, slots: usize) -> Result<Self, String> {
        let len = slots
            .checked_mul(shape.dim)
            .ok_or("index-key cache size overflows")?;
        let keys = (0..shape.layers)
            .map(|_| {
                bytemuck::allocation::try_zeroed_vec::<f32>(len).map_err(|()| {
                    format!("cannot allocate an index-key layer of {} bytes", len * 4)
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            keys,
            dim: shape.dim,
        })
    }

    pub fn shape(&self) -> IndexShape {
        IndexShape {
            layers: self.keys.len(),
            dim: self.dim,
        }
    }

    /// Rows `k[t]` (`[T, dim]`) into `slots[t]` of `layer`.
    pub fn write(&mut self, layer: usize, slots: &[usize], k: &[f32]) {
        let (d, cache) = (self.dim, &mut self.keys[layer]);
        for (&slot, row) in slots.iter().zip(k.chunks_exact(d)) {
            cache[slot * d..][..d].copy_from_slice(row);
        }
    }

    pub fn layer(&self, layer: usize) -> &[f32] {
        &self.keys[layer]
    }
}

/// Each token's chosen keys (positions, ascending); none for a token that keeps every key.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Selection {
    /// `[T + 1]` offsets into `keys`.
    starts: Vec<usize>,
    keys: Vec<u32>,
}

impl Selection {
    pub fn tokens(&self) -> usize {
        self.starts.len().saturating_sub(1)
    }

    /// Token `t`'s keys, or `None` when it keeps them all.
    pub fn keys(&self, t: usize) -> Option<&[u32]> {
        let r = &self.keys[self.starts[t]..self.starts[t + 1]];
        (!r.is_empty()).then_some(r)
    }

    /// Token `t`'s keys are `rows[t]` (empty: all).
    pub fn set(&mut self, rows: Vec<Vec<u32>>) {
        self.starts.clear();
        self.keys.clear();
        self.starts.push(0);
        for r in rows {
            self.keys.extend(r);
            self.starts.push(self.keys.len());
        }
    }
}

/// Every token's `k` LayerNormed, then `k` and its q heads rotated, in place
/// ([`Indexer::prepare`]).
pub fn prepare(q: &mut [f32], k: &mut [f32], positions: &[usize], ix: &Indexer<'_>) {
    let d = ix.head_dim;
    q.par_chunks_mut(ix.heads * d)
        .zip(k.par_chunks_mut(d))
        .zip(positions.par_iter())
        .for_each_init(Vec::new, |tmp, ((qr, kr), &pos)| {
            ix.prepare(qr, kr, pos, tmp)
        });
}

/// Each token's selection from `q` (`[T, heads · head_dim]`, prepared), `w` (`[T, heads]`) and
/// the layer's cached keys (the step's already written).
pub fn select(
    q: &[f32],
    w: &[f32],
    keys: &[f32],
    plan: &BatchPlan<'_>,
    ix: &Indexer<'_>,
    out: &mut Selection,
) {
    let (d, heads) = (ix.head_dim, ix.heads);
    let rows: Vec<Vec<u32>> = (0..plan.num_tokens())
        .into_par_iter()
        .map_init(Vec::new, |scores, t| {
            let p = plan.positions[t];
            if p < ix.topk {
                return Vec::new();
            }
            let table = plan.tables[plan.seq_of[t]];
            let (qt, wt) = (&q[t * heads * d..][..heads * d], &w[t * heads..][..heads]);
            scores.clear();
            let key = |j| &keys[slot_of(table, plan.block_size, j) * d..][..d];
            widest(
                #[inline(always)]
                || scores.extend((0..=p).map(|j| ix.score(qt, wt, key(j)))),
            );
            top_keys(scores, ix.topk)
        })
        .collect();
    out.set(rows);
}

/// Attention of every token with a selection over its selected keys only, into its rows of
/// `out` (`[T, heads · hd]`; the other rows are left as they are).
///
/// A token's heads are done together: each selected key and value row is read whole, once
/// (one run of `kv_heads · hd` floats, where a head at a time would read a slice of every
/// row), with each head's arithmetic unchanged.
pub fn attend_selected(
    q: &[f32],
    (kc, vc): (&[f32], &[f32]),
    plan: &BatchPlan<'_>,
    shape: AttnShape,
    sel: &Selection,
    out: &mut [f32],
) {
    let (hd, heads) = (shape.head_dim, shape.heads);
    let kv_dim = shape.kv_heads * hd;
    out.par_chunks_mut(heads * hd)
        .enumerate()
        .filter_map(|(t, o)| Some((t, o, sel.keys(t)?)))
        .for_each_init(Scratch::default, |s, (t, o, keys)| {
            let table = plan.tables[plan.seq_of[t]];
            s.slots.clear();
            (s.slots).extend(
                (keys.iter()).map(|&j| slot_of(table, plan.block_size, j as usize) * kv_dim),
            );
            let qt = &q[t * heads * hd..][..heads * hd];
            widest(
                #[inline(always)]
                || attend_token(qt, (kc, vc), shape, s, o),
            );
        });
}

/// [`attend_selected`]'s per-thread buffers: the token's key rows (offsets into the caches),
/// its scores (`[heads, keys]`) and their softmax sums' inverses.
#[derive(Default)]
struct Scratch {
    slots: Vec<usize>,
    e: Vec<f32>,
    inv: Vec<f32>,
}

/// One token's heads (`q`, `out`: `[heads · hd]`) over the key and value rows at `s.slots`
/// (`k[s..s + kv_heads · hd]`, likewise `v`). Per head: scores by
/// [`dot8`](crate::kernels::dsa::dot8) times `scale` (four heads of a KV head at a time), the
/// softmax as the dense kernel's ([`exp_neg`], the sum in key order), the values in key order.
#[inline(always)]
fn attend_token(
    q: &[f32],
    (k, v): (&[f32], &[f32]),
    shape: AttnShape,
    s: &mut Scratch,
    out: &mut [f32],
) {
    let (hd, n) = (shape.head_dim, s.slots.len());
    let (group, kv_dim) = (shape.heads / shape.kv_heads, shape.kv_heads * hd);
    let kv_off = |h: usize| (h / group) * hd;
    s.e.clear();
    s.e.resize(shape.heads * n, 0.0);
    for (i, &slot) in s.slots.iter().enumerate() {
        let key = &k[slot..][..kv_dim];
        let groups = q.chunks_exact(group * hd).zip(key.chunks_exact(hd));
        for (g, (qg, kg)) in groups.enumerate() {
            let mut e = s.e[g * group * n + i..].iter_mut().step_by(n);
            dot8_each(qg, kg, |x| *e.next().unwrap() = x * shape.scale);
        }
    }
    s.inv.clear();
    for eh in s.e.chunks_exact_mut(n) {
        let m = eh.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        // The exponentials on their own (vectorised), then their sum in key order.
        eh.iter_mut().for_each(|x| *x = exp_neg(*x - m));
        s.inv.push(1.0 / eh.iter().fold(0.0f32, |s, &x| s + x));
    }
    out.fill(0.0);
    for (i, &slot) in s.slots.iter().enumerate() {
        let val = &v[slot..][..kv_dim];
        for (h, oh) in out.chunks_exact_mut(hd).enumerate() {
            let (p, vh) = (s.e[h * n + i], &val[kv_off(h)..][..hd]);
            oh.iter_mut().zip(vh).for_each(|(o, &x)| *o += p * x);
        }
    }
    for (oh, &inv) in out.chunks_exact_mut(hd).zip(&s.inv) {
        oh.iter_mut().for_each(|o| *o *= inv);
    }
}

#[cfg(test)]
#[path = "dsa_tests.rs"]
mod tests;
