//! Test support shared by the CPU and the CUDA attention tests: random inputs and a naive f64
//! attention to check every kernel against.

use crate::kernels::device::{AttnShape, QueryTemperature, first_key};

/// What the naive attention's softmax sees: a sliding window or chunks of keys, a query
/// temperature, a soft cap on the scores.
#[derive(Debug, Clone, Copy, Default)]
pub struct Variant {
    pub window: Option<usize>,
    pub chunk: Option<usize>,
    pub temperature: Option<QueryTemperature>,
    pub softcap: Option<f32>,
}

/// `n` values uniform in [-2, 2) from a 64-bit LCG advanced in `seed`.
pub fn rnd(n: usize, seed: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect()
}

/// Causal GQA attention of q `[len, heads, hd]` over k, v `[len, kv_heads, hd]`, in f64:
/// `[len, heads, hd]`. The softmax runs over the keys in the variant's window or chunk (or
/// all) and the head's sink logit, whose weight is dropped; each query times its position's
/// temperature factor (f32) first; each score soft-capped where the variant says.
pub fn naive(
    shape: AttnShape,
    variant: Variant,
    sinks: Option<&[f32]>,
    len: usize,
    (q, k, v): (&[f32], &[f32], &[f32]),
) -> Vec<f64> {
    let (hd, h, kvh) = (shape.head_dim, shape.heads, shape.kv_heads);
    let group = h / kvh;
    let mut out = vec![0.0f64; len * h * hd];
    for t in 0..len {
        for head in 0..h {
            let kh = head / group;
            let f = variant.temperature.map_or(1.0, |tm| tm.factor(t));
            let qv: Vec<f32> = q[(t * h + head) * hd..][..hd]
                .iter()
                .map(|x| x * f)
                .collect();
            let lo = first_key(t, variant.window, variant.chunk);
            let s: Vec<f64> = (lo..=t)
                .map(|j| {
                    let kv = &k[(j * kvh + kh) * hd..][..hd];
                    qv.iter()
                        .zip(kv)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                        * shape.scale as f64
                })
                .map(|s| {
                    variant
                        .softcap
                        .map_or(s, |c| (s / c as f64).tanh() * c as f64)
                })
                .collect();
            let sink = sinks.map(|s| s[head] as f64);
            let m = s
                .iter()
                .chain(&sink)
                .cloned()
                .fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let sum: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |x| (x - m).exp());
            for d in 0..hd {
                out[(t * h + head) * hd + d] = (lo..=t)
                    .map(|j| e[j - lo] * v[(j * kvh + kh) * hd + d] as f64)
                    .sum::<f64>()
                    / sum;
            }
        }
    }
    out
}
