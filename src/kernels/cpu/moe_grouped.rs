//! The group-limited router on the CPU ([`GroupedTopK`]: Nemotron 3's, DeepSeek-V3's,
//! Mistral 4's MoE) and the weighted sum of the routed experts' outputs. The CUDA kernel
//! (`moe_grouped.cu`) makes the same choice in the same order: every comparison picks the
//! lower index on ties, and the renormalising sum adds the chosen scores in choice order from
//! zero.

use super::moe::softmax_into;
use super::recurrent::sigmoid;
use crate::kernels::routing::{GroupRank, GroupedTopK, RouterScore, Routing};

/// For router logits `[T, experts]` and the choice bias `[experts]`: each token's `top_k`
/// expert ids in choice order and their weights (`[T, top_k]` each).
pub fn route_grouped(
    logits: &[f32],
    bias: &[f32],
    experts: usize,
    r: &GroupedTopK,
) -> Result<(Vec<i32>, Vec<f32>), String> {
    let size = r.group_size(experts)?;
    if bias.len() != experts {
        return Err(format!(
            "{} correction biases for {experts} experts",
            bias.len()
        ));
    }
    let t = logits.len().checked_div(experts).unwrap_or(0);
    let (mut ids, mut weights) = (
        Vec::with_capacity(t * r.top_k),
        Vec::with_capacity(t * r.top_k),
    );
    // Per-token scratch, reused across tokens.
    let (mut scores, mut choice) = (vec![0f32; experts], vec![0f32; experts]);
    let (mut group_scores, mut kept) = (vec![0f32; r.n_group], vec![false; r.n_group]);
    let mut taken = vec![false; experts];
    for l in logits.chunks_exact(experts) {
        score(l, r.score, &mut scores);
        for (((c, &s), &v), &b) in choice.iter_mut().zip(&scores).zip(l).zip(bias) {
            *c = if r.score == RouterScore::SigmoidByLogit {
                v
            } else {
                s
            } + b;
        }
        for (g, group) in group_scores.iter_mut().zip(choice.chunks_exact(size)) {
            *g = match r.group_rank {
                GroupRank::TopTwoSum => top2_sum(group),
                GroupRank::Best => group[best(group, |_| true)],
            };
        }
        kept.fill(false);
        for _ in 0..r.topk_group {
            let g = best(&group_scores, |g| !kept[g]);
            kept[g] = true;
        }
        taken.fill(false);
        let mut sum = 0f32;
        let first = weights.len();
        for _ in 0..r.top_k {
            let e = best(&choice, |e| kept[e / size] && !taken[e]);
            taken[e] = true;
            sum += scores[e];
            ids.push(e as i32);
            weights.push(scores[e]);
        }
        let denom = sum + r.renorm_eps;
        for w in &mut weights[first..] {
            if r.renorm {
                *w /= denom;
            }
            *w *= r.scale;
        }
    }
    Ok((ids, weights))
}

/// The scores of one token's `logits`: their sigmoid, or their softmax.
fn score(logits: &[f32], kind: RouterScore, scores: &mut [f32]) {
    match kind {
        RouterScore::Sigmoid | RouterScore::SigmoidByLogit => {
            for (s, &v) in scores.iter_mut().zip(logits) {
                *s = sigmoid(v);
            }
        }
        RouterScore::Softmax => softmax_into(logits, scores),
    }
}

/// The sum of the two largest values (the larger first).
fn top2_sum(v: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &x in v {
        if x > a {
            (a, b) = (x, a);
        } else if x > b {
            b = x;
        }
    }
    a + b
}

/// Index of the largest of `v` among the indices `ok` allows, the lower one on ties.
fn best(v: &[f32], ok: impl Fn(usize) -> bool) -> usize {
    let mut pick: Option<usize> = None;
    for (i, &x) in v.iter().enumerate() {
        if ok(i) && pick.is_none_or(|p| x > v[p]) {
            pick = Some(i);
        }
    }
    pick.unwrap_or(0)
}

/// `out[t] = Σ_i tok_w[t, i] · y[tok_pos[t, i]]` (ascending expert order, from zero) for
/// `t` tokens of `h` values.
pub fn weighted_sum(y: &[f32], routing: &Routing, t: usize, h: usize, out: &mut Vec<f32>) {
    let k = routing.tok_pos.len().checked_div(t).unwrap_or(0);
    out.clear();
    out.resize(t * h, 0.0);
    for (tok, o) in out.chunks_exact_mut(h).enumerate() {
        for i in 0..k {
            let pos = routing.tok_pos[tok * k + i] as usize;
            let p = routing.tok_w[tok * k + i];
            for (oi, &v) in o.iter_mut().zip(&y[pos * h..(pos + 1) * h]) {
                *oi += v * p;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router(top_k: usize, n_group: usize, topk_group: usize, renorm: bool) -> GroupedTopK {
        GroupedTopK {
            top_k,
            n_group,
            topk_group,
            renorm,
            renorm_eps: crate::kernels::routing::DEFAULT_RENORM_EPS,
            group_rank: GroupRank::TopTwoSum,
            scale: 2.0,
            score: RouterScore::Sigmoid,
        }
    }

    /// The bias moves the choice, the weights stay the uncorrected scores; the kept group is
    /// the one with the best two, not the best one.
    #[test]
    fn choice_by_corrected_scores_in_the_best_groups() {
        // group 0: experts 0..4, group 1: 4..8. Group 0 holds the single best logit, group 1
        // the best pair.
        let logits = [3.0, -2.0, -2.0, -2.0, 1.0, 1.0, 0.5, -2.0];
        let bias = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.3, 0.0];
        let (ids, w) = route_grouped(&logits, &bias, 8, &router(2, 2, 1, false)).unwrap();
        assert_eq!(ids, vec![6, 4]);
        assert_eq!(w, vec![2.0 * sigmoid(0.5), 2.0 * sigmoid(1.0)]);
        let (ids, w) = route_grouped(&logits, &[0.0; 8], 8, &router(2, 1, 1, true)).unwrap();
        assert_eq!(ids, vec![0, 4]);
        let s = sigmoid(3.0) + sigmoid(1.0);
        assert_eq!(
            w,
            vec![
                sigmoid(3.0) / (s + 1e-20) * 2.0,
                sigmoid(1.0) / (s + 1e-20) * 2.0
            ]
        );
    }

    /// DeepSeek-V2's `group_limited_greedy` keeps the group with the best expert, where
    /// DeepSeek-V3's ranking keeps the one with the best pair.
    #[test]
    fn groups_ranked_by_their_best_expert() {
        let logits = [3.0, -2.0, -2.5, -2.0, 1.0, 1.0, 0.5, -2.0];
        let best = GroupedTopK {
            group_rank: GroupRank::Best,
            score: RouterScore::Softmax,
            ..router(2, 2, 1, false)
        };
        let pair = GroupedTopK {
            group_rank: GroupRank::TopTwoSum,
            ..best
        };
        let (ids, _) = route_grouped(&logits, &[0.0; 8], 8, &best).unwrap();
        assert_eq!(ids, vec![0, 1]);
        // Softmax: group 0's pair (3, -2) still beats group 1's (1, 1) as a sum of
        // probabilities; on sigmoid scores the pair ranking keeps group 1.
        let (ids, _) = route_grouped(&logits, &[0.0; 8], 8, &pair).unwrap();
        assert_eq!(ids, vec![0, 1]);
        let sigmoid = |r: GroupedTopK| GroupedTopK {
            score: RouterScore::Sigmoid,
            ..r
        };
        let (ids, _) = route_grouped(&logits, &[0.0; 8], 8, &sigmoid(pair)).unwrap();
        assert_eq!(ids, vec![4, 5]);
        let (ids, _) = route_grouped(&logits, &[0.0; 8], 8, &sigmoid(best)).unwrap();
        assert_eq!(ids, vec![0, 1]);
    }

    /// LFM2-MoE renormalises over the sum + 1e-6: small scores move visibly (a sum of ~0.04
    /// here, so ~2.5e-5 relative), and differ from DeepSeek-V3's + 1e-20.
    #[test]
    fn renormalising_epsilon_is_the_routers() {
        let logits = [-4.0f32, -3.5, -6.0, -5.0];
        let lfm2 = GroupedTopK {
            renorm_eps: 1e-6,
            ..router(2, 1, 1, true)
        };
        let (ids, w) = route_grouped(&logits, &[0.0; 4], 4, &lfm2).unwrap();
        assert_eq!(ids, vec![1, 0]);
        let s = sigmoid(-3.5) + sigmoid(-4.0);
        let d = s + 1e-6;
        assert_eq!(w, vec![sigmoid(-3.5) / d * 2.0, sigmoid(-4.0) / d * 2.0]);
        let (_, deepseek) = route_grouped(&logits, &[0.0; 4], 4, &router(2, 1, 1, true)).unwrap();
        assert!((deepseek[0] - w[0]) / w[0] > 2e-5, "{deepseek:?} vs {w:?}");
    }

    /// Mistral 4's scores are the softmax over all the token's experts (not just the kept
    /// group's), the weights those probabilities renormalised over the chosen ones.
    #[test]
    fn softmax_scores_over_every_expert() {
        let logits = [3.0f32, -2.0, -2.0, -2.0, 1.0, 1.0, 0.5, -2.0];
        let r = GroupedTopK {
            score: RouterScore::Softmax,
            ..router(2, 2, 1, false)
        };
        let (ids, w) = route_grouped(&logits, &[0.0; 8], 8, &r).unwrap();
        // In probability group 0's pair (3, -2) beats group 1's (1, 1), which the sigmoid
        // prefers.
        assert_eq!(ids, vec![0, 1]);
        let sigmoid_ids = route_grouped(&logits, &[0.0; 8], 8, &router(2, 2, 1, false));
        assert_eq!(sigmoid_ids.unwrap().0, vec![4, 5]);
        let sum: f32 = logits.iter().map(|&v| (v - 3.0).exp()).sum();
        let (p0, p1) = (1.0 / sum, (-5f32).exp() / sum);
        assert_eq!(w, vec![2.0 * p0, 2.0 * p1]);
        let r = GroupedTopK { renorm: true, ..r };
        let (_, w) = route_grouped(&logits, &[0.0; 8], 8, &r).unwrap();
        let d = p0 + p1 + 1e-20;
        assert_eq!(w, vec![2.0 * (p0 / d), 2.0 * (p1 / d)]);
    }

    /// Llama-4's choice ranks the logits: f32's sigmoid ties 20 and 21 (both 1), the logits
    /// do not; the weights are still the sigmoids, unrenormalised.
    #[test]
    fn choice_by_logit_sees_past_a_saturated_sigmoid() {
        let logits = [20.0, 21.0, 0.0, -1.0];
        assert_eq!(sigmoid(20.0), sigmoid(21.0));
        let by_score = router(1, 1, 1, false);
        let (ids, _) = route_grouped(&logits, &[0.0; 4], 4, &by_score).unwrap();
        assert_eq!(ids, vec![0]);
        let llama4 = GroupedTopK {
            score: RouterScore::SigmoidByLogit,
            scale: 1.0,
            ..router(2, 1, 1, false)
        };
        let (ids, w) = route_grouped(&logits, &[0.0; 4], 4, &llama4).unwrap();
        assert_eq!(ids, vec![1, 0]);
        assert_eq!(w, vec![sigmoid(21.0), sigmoid(20.0)]);
    }

    /// Equal scores (and equal groups) go to the lower index.
    #[test]
    fn ties_go_to_the_lower_index() {
        let (ids, _) = route_grouped(&[0.5; 8], &[0.0; 8], 8, &router(3, 4, 2, true)).unwrap();
        assert_eq!(ids, vec![0, 1, 2]);
        // groups 1 and 2 tie (the best): group 1's experts
        let logits = [0.0, 0.0, 1.0, 1.0, 1.0, 1.0];
        let (ids, _) = route_grouped(&logits, &[0.0; 6], 6, &router(2, 3, 1, true)).unwrap();
        assert_eq!(ids, vec![2, 3]);
    }

    #[test]
    fn impossible_groupings_are_refused() {
        for (k, g, kg) in [(2, 3, 1), (2, 8, 1), (5, 2, 1), (2, 2, 3), (0, 2, 1)] {
            assert!(route_grouped(&[0.0; 8], &[0.0; 8], 8, &router(k, g, kg, true)).is_err());
        }
        assert!(route_grouped(&[0.0; 8], &[0.0; 7], 8, &router(2, 2, 1, true)).is_err());
    }
}
