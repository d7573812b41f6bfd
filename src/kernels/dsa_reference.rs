//! Test inputs and an f64 reference for DeepSeek Sparse Attention, shared by the CPU's and the
//! device's tests.

use super::attention_reference::rnd;
use super::device::AttnShape;
use super::dsa::Indexer;
use super::dtype::RopeScaling;
use super::rope::Rope;

/// Random indexer inputs for `tokens` tokens: q `[T, heads · d]`, k `[T, d]`, head weights
/// `[T, heads]`, `k_norm`'s weight and bias, a RoPE table over `rot` dims.
pub struct IndexerInputs {
    pub heads: usize,
    pub d: usize,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub w: Vec<f32>,
    norm: (Vec<f32>, Vec<f32>),
    rope: (Rope, usize),
}

impl IndexerInputs {
    pub fn new(tokens: usize, (heads, d, rot): (usize, usize, usize), mut seed: u64) -> Self {
        let s = &mut seed;
        Self {
            heads,
            d,
            q: rnd(tokens * heads * d, s),
            k: rnd(tokens * d, s),
            w: rnd(tokens * heads, s),
            norm: (rnd(d, s), rnd(d, s)),
            rope: (Rope::new(rot, 10000.0, RopeScaling::None), rot),
        }
    }

    /// The indexer over these inputs' geometry, `k_norm` (eps 1e-6) and RoPE.
    pub fn indexer(&self, topk: usize, interleave: bool) -> Indexer<'_> {
        Indexer {
            heads: self.heads,
            head_dim: self.d,
            topk,
            rope: (&self.rope.0, self.rope.1),
            interleave,
            norm: (&self.norm.0, &self.norm.1, 1e-6),
            score_scale: (self.d as f32).powf(-0.5),
            weight_scale: (self.heads as f32).powf(-0.5),
        }
    }
}

/// One token's attention, in f64, of its q heads (`[heads · hd]`) over `keys` only:
/// `[heads · hd]`; `kv(j, kv_head)` gives key `j`'s k and v rows of that head.
pub fn sparse_softmax<K: Copy>(
    q: &[f32],
    keys: &[K],
    shape: AttnShape,
    kv: impl Fn(K, usize) -> (Vec<f32>, Vec<f32>),
) -> Vec<f64> {
    let hd = shape.head_dim;
    let mut out = vec![0.0f64; shape.heads * hd];
    for (h, o) in out.chunks_exact_mut(hd).enumerate() {
        let rows: Vec<_> = keys
            .iter()
            .map(|&j| kv(j, h / (shape.heads / shape.kv_heads)))
            .collect();
        let qh = &q[h * hd..][..hd];
        let s: Vec<f64> = (rows.iter())
            .map(|(k, _)| {
                let dot: f64 = qh.iter().zip(k).map(|(a, b)| *a as f64 * *b as f64).sum();
                dot * shape.scale as f64
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let sum: f64 = e.iter().sum();
        for (c, o) in o.iter_mut().enumerate() {
            *o = rows
                .iter()
                .zip(&e)
                .map(|((_, v), p)| p * v[c] as f64)
                .sum::<f64>()
                / sum;
        }
    }
    out
}
