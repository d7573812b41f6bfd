//! The MoE router's choice on the CPU: softmax over all experts (f32), top-k by descending
//! probability (lower index first on ties), optionally renormalised — transformers'
//! `Qwen3NextSparseMoeBlock` routing.

/// For router logits `[T, experts]`: each token's `top_k` expert ids, in descending
/// probability, and their weights (`[T, top_k]` each).
pub fn route_top_k(
    logits: &[f32],
    experts: usize,
    top_k: usize,
    renorm: bool,
) -> (Vec<i32>, Vec<f32>) {
    let t = logits.len().checked_div(experts).unwrap_or(0);
    let (mut ids, mut weights) = (Vec::with_capacity(t * top_k), Vec::with_capacity(t * top_k));
    let mut probs = vec![0f32; experts];
    for l in logits.chunks_exact(experts) {
        softmax_into(l, &mut probs);
        let mut order: Vec<usize> = (0..experts).collect();
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
        let mut top: Vec<(usize, f32)> = order[..top_k].iter().map(|&e| (e, probs[e])).collect();
        if renorm {
            let s: f32 = top.iter().map(|&(_, p)| p).sum();
            for (_, p) in &mut top {
                *p /= s;
            }
        }
        for (e, p) in top {
            ids.push(e as i32);
            weights.push(p);
        }
    }
    (ids, weights)
}

/// The softmax of one token's `logits` into `probs` (f32: the max, then `exp(l - max)` summed
/// in expert order, each divided by the sum): the softmax routers' scores.
pub fn softmax_into(logits: &[f32], probs: &mut [f32]) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for (p, &v) in probs.iter_mut().zip(logits) {
        *p = (v - max).exp();
        sum += *p;
    }
    for p in probs.iter_mut() {
        *p /= sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_descending_lower_index_on_ties() {
        let (ids, w) = route_top_k(&[0.0, 2.0, 2.0, 1.0], 4, 2, true);
        assert_eq!(ids, vec![1, 2]);
        assert!((w[0] - 0.5).abs() < 1e-7 && (w[1] - 0.5).abs() < 1e-7);
    }
}
