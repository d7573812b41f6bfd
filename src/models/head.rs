//! The two ends every architecture shares: the embedding gather (layer id 0) and the greedy
//! LM head (final-normed rows → argmax over the vocabulary; the head is the embedding when tied).

use super::ModelSpec;
use crate::kernels::cpu::matmul::matmul_wt;
use crate::kernels::cpu::ops;

/// The model's final RMSNorm over every `hidden`-wide row of `x` (id L -> HF's post-norm last
/// hidden state).
pub fn final_norm(x: &[f32], weight: &[f32], eps: f64) -> Vec<f32> {
    let mut out = Vec::new();
    ops::rms_norm(x, weight, eps, &mut out);
    out
}

/// Greedy token of each pre-norm last-layer row (`[n, hidden]`): the final norm, then the LM
/// head (`lm_head`, or the embedding when tied).
pub fn greedy(
    spec: &ModelSpec,
    rows: &[f32],
    norm: &[f32],
    lm_head: Option<&[f32]>,
    embed: &[f32],
    threads: usize,
) -> Vec<u32> {
    let normed = final_norm(rows, norm, spec.rms_norm_eps);
    let head = lm_head.unwrap_or(embed);
    greedy_tokens(&normed, head, spec.vocab_size, spec.hidden_size, threads)
}

/// Rows of `embed` (`[vocab, hidden]`) for each token, `[tokens, hidden]`.
pub fn embed_tokens(embed: &[f32], hidden: usize, tokens: &[u32]) -> Vec<f32> {
    let mut x = Vec::with_capacity(tokens.len() * hidden);
    for &t in tokens {
        let t = t as usize;
        x.extend_from_slice(&embed[t * hidden..(t + 1) * hidden]);
    }
    x
}

/// Greedy token of each final-normed row of `normed` (`[n, hidden]`), with `head`
/// `[vocab, hidden]`.
pub fn greedy_tokens(
    normed: &[f32],
    head: &[f32],
    vocab: usize,
    hidden: usize,
    threads: usize,
) -> Vec<u32> {
    let n = normed.len() / hidden;
    if n == 0 {
        return Vec::new();
    }
    let mut logits = Vec::new();
    matmul_wt(normed, n, hidden, head, vocab, &mut logits, threads);
    logits
        .chunks_exact(vocab)
        .map(|l| ops::argmax(l) as u32)
        .collect()
}
