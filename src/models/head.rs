//! The two ends every architecture shares: the embedding gather (layer id 0) and the greedy
//! LM head (final-normed rows → argmax over the vocabulary; the head is the embedding when tied).

use crate::kernels::cpu::matmul::matmul_wt;
use crate::kernels::cpu::ops;

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
