//! Test inputs and an f64 reference for Qwen4-Exp's QSA selection, shared by the CPU's and
//! the device's tests.

use super::attention_reference::rnd;
use super::dtype::RopeScaling;
use super::qsa::QsaRule;
use super::rope::Rope;

/// Random indexer inputs for `tokens` tokens: q `[T, heads · d]`, raw keys `[T, d]`, the two
/// norms' `1 + weight`, a RoPE table over `rot` dims.
pub struct QsaInputs {
    pub heads: usize,
    pub d: usize,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub norms: (Vec<f32>, Vec<f32>),
    pub rope: (Rope, usize),
}

impl QsaInputs {
    pub fn new(tokens: usize, (heads, d, rot): (usize, usize, usize), mut seed: u64) -> Self {
        let s = &mut seed;
        let one_plus = |v: Vec<f32>| v.into_iter().map(|x| 1.0 + 0.3 * x).collect();
        Self {
            heads,
            d,
            q: rnd(tokens * heads * d, s),
            k: rnd(tokens * d, s),
            norms: (one_plus(rnd(d, s)), one_plus(rnd(d, s))),
            rope: (Rope::new(rot, 10000.0, RopeScaling::None), rot),
        }
    }

    /// The rule over these inputs with `blocks` blocks of `ratio` kept (eps 1e-6).
    pub fn rule(&self, blocks: usize, ratio: usize) -> QsaRule<'_> {
        QsaRule {
            heads: self.heads,
            head_dim: self.d,
            blocks,
            ratio,
            rope: (&self.rope.0, self.rope.1),
            norms: (&self.norms.0, &self.norms.1, 1e-6),
        }
    }

    /// Token `t`'s keys in f64 as transformers selects them (positions `0..=t` of one
    /// sequence, token `t` at position `t`): `None` while it keeps every key.
    pub fn want_keys(&self, t: usize, blocks: usize, ratio: usize) -> Option<Vec<u32>> {
        let d = self.d;
        let n = t + 1;
        if n / ratio <= blocks {
            return None;
        }
        let qh: Vec<Vec<f64>> = (0..self.heads)
            .map(|h| {
                let x = normed(&self.q[(t * self.heads + h) * d..][..d], &self.norms.0);
                self.rotated(x, t)
            })
            .collect();
        let scores: Vec<f64> = (0..n / ratio)
            .map(|b| {
                let mut mean = vec![0.0f64; d];
                for j in b * ratio..(b + 1) * ratio {
                    mean.iter_mut()
                        .zip(&self.k[j * d..][..d])
                        .for_each(|(m, &k)| *m += k as f64);
                }
                let mean: Vec<f32> = mean.iter().map(|m| (m / ratio as f64) as f32).collect();
                let key = self.rotated(normed(&mean, &self.norms.1), b * ratio);
                let dot = |q: &Vec<f64>| q.iter().zip(&key).map(|(a, b)| a * b).sum::<f64>();
                qh.iter().map(|q| dot(q).max(0.0)).sum()
            })
            .collect();
        let mut top: Vec<u32> = (0..scores.len() as u32).collect();
        top.sort_by(|&a, &b| scores[b as usize].total_cmp(&scores[a as usize]));
        top.truncate(blocks);
        top.sort_unstable();
        let r = ratio as u32;
        let tail = (n / ratio * ratio) as u32..n as u32;
        Some(
            top.iter()
                .flat_map(|&b| b * r..(b + 1) * r)
                .chain(tail)
                .collect(),
        )
    }

    fn rotated(&self, mut x: Vec<f64>, pos: usize) -> Vec<f64> {
        let (rope, rot) = (&self.rope.0, self.rope.1);
        let half = rot / 2;
        let (mut cos, mut sin) = (vec![0.0f32; half], vec![0.0f32; half]);
        rope.cos_sin(pos, &mut cos, &mut sin);
        for i in 0..half {
            let (a, b) = (x[i], x[i + half]);
            x[i] = a * cos[i] as f64 - b * sin[i] as f64;
            x[i + half] = b * cos[i] as f64 + a * sin[i] as f64;
        }
        x
    }
}

/// RMSNorm in f64 with weight `w` (`1 + weight`), eps 1e-6.
fn normed(x: &[f32], w: &[f32]) -> Vec<f64> {
    let ms = x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / x.len() as f64;
    let r = 1.0 / (ms + 1e-6).sqrt();
    x.iter()
        .zip(w)
        .map(|(&v, &wi)| v as f64 * r * wi as f64)
        .collect()
}
