//! Qwen4-Exp's QSA (transformers' `Qwen4ExpTextQSAIndexer`), the device-neutral part: what a
//! device's [`Device::qsa_select`] is given and each token's arithmetic ([`QsaRule`]), which
//! the CPU runs and the CUDA kernels repeat operation for operation (their tests hold them to
//! it). The selection it makes is DeepSeek Sparse Attention's ([`crate::kernels::dsa`]): each
//! token's keys in position order, attended by the same sparse attention.
//!
//! # The rule
//! - `[q | k] = index_qk_proj · x`: q is `heads` heads of `head_dim`, k one raw key of
//!   `head_dim` per token, cached raw (per attention layer, in the KV cache's slots).
//! - q's heads are RMSNormed (`q_layernorm`, zero-centred weight) and rotated at the token's
//!   position on their first `rot` dims (the attention's RoPE).
//! - A token at position `p` sees `n = p + 1` keys, `n / ratio` complete blocks of `ratio`.
//!   Block `b`'s key is the mean of its raw keys, RMSNormed (`k_layernorm`) and rotated at
//!   `b · ratio`; its score is `Σ_h relu(q_h · key_b)` (transformers divides by
//!   `head_dim^0.5`, which changes no ranking).
//! - While the complete blocks are at most `budget / ratio` (`p < budget + ratio - 1`) the
//!   token attends to every key (the dense attention); past that to the keys of its
//!   `budget / ratio` best blocks (ties to the lower block) and of its incomplete tail.
//!
//! A block's key depends only on its own cached keys, a token's selection only on its q and
//! those: the same whatever shares the batch and however the prompt was cut.
//!
//! Fixed arithmetic: RMSNorm as `x · (Σ x² / d + eps)^-0.5 · w`, the sum in order; a block's
//! mean as the sum of its keys in position order over `ratio`; dot products by
//! [`dot8`](super::dsa::dot8); scores summed in head order; the top blocks by [`top_keys`].

use super::Device;
use super::dsa::{IndexShape, check_indexer, dot8_each, top_keys};
use super::rope::{Rope, rotate_half};

/// One attention layer's indexer call.
pub struct QsaCall<'a, D: Device> {
    /// This layer's index-key cache layer (its attention layer index).
    pub index_layer: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// Keys a token keeps past the dense length, in blocks of `ratio` (`indexer_budget`).
    pub budget: usize,
    /// Keys per block (`indexer_compress_ratio`).
    pub ratio: usize,
    /// The RoPE table and the rotated dims (the first of each q head and block key).
    pub rope: (&'a D::Rope, usize),
    /// `q_layernorm` and `k_layernorm`: `1 + weight` (`[head_dim]` each), and their eps.
    pub norms: (&'a D::Vector, &'a D::Vector, f64),
}

impl<D: Device> QsaCall<'_, D> {
    /// The widths of q and k (`[heads · head_dim]`, `[head_dim]`).
    pub fn widths(&self) -> [usize; 2] {
        [self.heads * self.head_dim, self.head_dim]
    }

    /// Blocks a token keeps past the dense length.
    pub fn blocks(&self) -> usize {
        self.budget / self.ratio.max(1)
    }

    /// Whether an index-key cache of `shape` holds this call's layer at its head dim.
    pub fn fits(&self, shape: IndexShape) -> bool {
        shape.holds(self.index_layer, self.head_dim)
    }

    /// The geometry makes sense ([`check_indexer`]): blocks of some keys, a budget of whole
    /// blocks.
    pub fn check(&self) -> Result<(), String> {
        check_indexer(self.heads, self.head_dim, self.rope.1)?;
        match () {
            _ if self.ratio == 0 || self.budget == 0 => Err("a QSA budget of no keys".into()),
            _ if !self.budget.is_multiple_of(self.ratio) => Err(format!(
                "a QSA budget of {} keys in blocks of {}",
                self.budget, self.ratio
            )),
            _ => Ok(()),
        }
    }
}

/// One token's QSA arithmetic on the host.
pub struct QsaRule<'a> {
    pub heads: usize,
    pub head_dim: usize,
    pub blocks: usize,
    pub ratio: usize,
    pub rope: (&'a Rope, usize),
    /// `1 + q_layernorm.weight`, `1 + k_layernorm.weight`, eps.
    pub norms: (&'a [f32], &'a [f32], f32),
}

impl QsaRule<'_> {
    pub fn dense_len(&self) -> usize {
        self.blocks * self.ratio + self.ratio - 1
    }

    /// A token's q heads (`[heads · head_dim]`) RMSNormed and rotated at `pos`, in place.
    pub fn prepare_q(&self, q: &mut [f32], pos: usize, tmp: &mut Vec<f32>) {
        for head in q.chunks_exact_mut(self.head_dim) {
            rms_norm(head, self.norms.0, self.norms.2);
        }
        self.rotate(q, pos, tmp);
    }

    /// Block `b`'s key into `out` (`[head_dim]`) from the raw keys `key(j)` of its positions:
    /// their mean, RMSNormed, rotated at the block's start.
    pub fn block_key<'k>(
        &self,
        b: usize,
        key: impl Fn(usize) -> &'k [f32],
        out: &mut [f32],
        tmp: &mut Vec<f32>,
    ) {
        out.fill(0.0);
        for j in b * self.ratio..(b + 1) * self.ratio {
            out.iter_mut().zip(key(j)).for_each(|(o, &k)| *o += k);
        }
        let n = self.ratio as f32;
        out.iter_mut().for_each(|o| *o /= n);
        rms_norm(out, self.norms.1, self.norms.2);
        self.rotate(out, b * self.ratio, tmp);
    }

    /// A block key's score for a token's prepared q heads.
    #[inline(always)]
    pub fn score(&self, q: &[f32], key: &[f32]) -> f32 {
        let mut s = 0.0f32;
        let (d, h) = (self.head_dim, self.heads);
        dot8_each(&q[..h * d], &key[..d], |x| s += x.max(0.0));
        s
    }

    /// The keys of a token at `pos` given its blocks' `scores` (`(pos + 1) / ratio` of them):
    /// its best blocks' keys then its tail's, ascending; `None` below the dense length.
    pub fn keys(&self, pos: usize, scores: &[f32]) -> Option<Vec<u32>> {
        if pos < self.dense_len() {
            return None;
        }
        let r = self.ratio as u32;
        let full = scores.len() as u32 * r;
        let top = top_keys(scores, self.blocks);
        let blocks = top.iter().flat_map(|&b| b * r..(b + 1) * r);
        Some(blocks.chain(full..=pos as u32).collect())
    }

    fn rotate(&self, heads: &mut [f32], pos: usize, tmp: &mut Vec<f32>) {
        let (rope, rot) = self.rope;
        let half = rot / 2;
        tmp.resize(2 * half, 0.0);
        let (cos, sin) = tmp.split_at_mut(half);
        rope.cos_sin(pos, cos, sin);
        for head in heads.chunks_exact_mut(self.head_dim) {
            rotate_half(&mut head[..rot], cos, sin);
        }
    }
}

/// Qwen4-Exp's RMSNorm of one row in f32 with `w` = `1 + weight`: `x · (Σ x² / d + eps)^-0.5
/// · w`, the sum in order.
fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    let ss = x.iter().fold(0.0f32, |a, &v| a + v * v);
    let r = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    x.iter_mut().zip(w).for_each(|(v, &wi)| *v = *v * r * wi);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::dtype::RopeScaling;

    fn rule<'a>(rope: &'a Rope, norms: (&'a [f32], &'a [f32])) -> QsaRule<'a> {
        QsaRule {
            heads: 2,
            head_dim: 4,
            blocks: 2,
            ratio: 3,
            rope: (rope, 2),
            norms: (norms.0, norms.1, 1e-6),
        }
    }

    /// Below the dense length a token keeps every key; past it, its best blocks' keys and its
    /// tail's, ascending, ties to the lower block.
    #[test]
    fn keys_are_the_best_blocks_then_the_tail() {
        let rope = Rope::new(2, 10_000.0, RopeScaling::None);
        let w = [1.0; 4];
        let r = rule(&rope, (&w, &w));
        assert_eq!(r.dense_len(), 8);
        assert_eq!(r.keys(7, &[1.0, 2.0]), None);
        // p = 8: 3 blocks, no tail.
        assert_eq!(r.keys(8, &[1.0, 3.0, 2.0]).unwrap(), [3, 4, 5, 6, 7, 8]);
        // p = 10: 3 blocks, tail 9..=10; a tie goes to the lower block.
        assert_eq!(
            r.keys(10, &[2.0, 1.0, 2.0]).unwrap(),
            [0, 1, 2, 6, 7, 8, 9, 10]
        );
    }

    /// A block's key is the mean of its raw keys, RMSNormed with its weight (RoPE at block 0's
    /// start is the identity).
    #[test]
    fn a_block_key_is_the_normed_mean() {
        let rope = Rope::new(2, 10_000.0, RopeScaling::None);
        let (qw, kw) = ([1.0; 4], [1.0, 2.0, 0.5, 1.0]);
        let r = rule(&rope, (&qw, &kw));
        let keys: Vec<[f32; 4]> = (0..6)
            .map(|j| [j as f32, 1.0, -2.0, 0.5 * j as f32])
            .collect();
        let mut out = [0.0f32; 4];
        r.block_key(0, |j| &keys[j + 3][..], &mut out, &mut Vec::new());
        let mean = [4.0f64, 1.0, -2.0, 2.0];
        let rms = (mean.iter().map(|v| v * v).sum::<f64>() / 4.0 + 1e-6).sqrt();
        for i in 0..4 {
            let want = mean[i] / rms * kw[i] as f64;
            assert!(
                (out[i] as f64 - want).abs() < 1e-6,
                "{i}: {} vs {want}",
                out[i]
            );
        }
        assert_eq!(
            r.score(&[1.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0], &out),
            out[0]
        );
    }
}
