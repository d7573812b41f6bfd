//! Qwen4-Exp's QSA on the CPU ([`crate::kernels::qsa`] has the rule and each token's
//! arithmetic): q prepared, each sequence chunk's block keys pooled once, each token's
//! selection into the [`Selection`] the sparse attention reads.

use rayon::prelude::*;

use super::dsa::Selection;
use super::vector::widest;
use crate::kernels::plan::{BatchPlan, slot_of};
pub use crate::kernels::qsa::QsaRule;

/// Every token's q heads RMSNormed and rotated at its position, in place.
pub fn prepare(q: &mut [f32], positions: &[usize], rule: &QsaRule<'_>) {
    q.par_chunks_mut(rule.heads * rule.head_dim)
        .zip(positions.par_iter())
        .for_each_init(Vec::new, |tmp, (qr, &pos)| rule.prepare_q(qr, pos, tmp));
}

/// Each token's selection from its prepared `q` (`[T, heads · head_dim]`) and the layer's
/// cached raw keys `keys` (`[slots, head_dim]`, the step's already written).
pub fn select(
    q: &[f32],
    keys: &[f32],
    plan: &BatchPlan<'_>,
    rule: &QsaRule<'_>,
    out: &mut Selection,
) {
    let (d, r) = (rule.head_dim, rule.ratio);
    let pooled = pooled_keys(keys, plan, rule);
    let rows: Vec<Vec<u32>> = (0..plan.num_tokens())
        .into_par_iter()
        .map_init(Vec::new, |scores, t| {
            let pos = plan.positions[t];
            if pos < rule.dense_len() {
                return Vec::new();
            }
            let qt = &q[t * rule.heads * d..][..rule.heads * d];
            let blocks = pooled[plan.seq_of[t]].chunks_exact(d).take((pos + 1) / r);
            scores.clear();
            widest(
                #[inline(always)]
                || scores.extend(blocks.map(|key| rule.score(qt, key))),
            );
            rule.keys(pos, scores).unwrap_or_default()
        })
        .collect();
    out.set(rows);
}

/// Each sequence chunk's block keys (`[blocks, head_dim]`), for the complete blocks its last
/// sparse token sees; none for a chunk of dense tokens only.
fn pooled_keys(keys: &[f32], plan: &BatchPlan<'_>, rule: &QsaRule<'_>) -> Vec<Vec<f32>> {
    let (d, r) = (rule.head_dim, rule.ratio);
    let mut seen = vec![0usize; plan.tables.len()];
    for (&pos, &c) in plan.positions.iter().zip(&plan.seq_of) {
        if pos >= rule.dense_len() {
            seen[c] = seen[c].max(pos + 1);
        }
    }
    (plan.tables.par_iter().zip(&seen))
        .map(|(&table, &n)| {
            let mut out = vec![0.0f32; n / r * d];
            out.par_chunks_mut(d)
                .enumerate()
                .for_each_init(Vec::new, |tmp, (b, key)| {
                    let raw = |j: usize| &keys[slot_of(table, plan.block_size, j) * d..][..d];
                    rule.block_key(b, raw, key, tmp);
                });
            out
        })
        .collect()
}

#[cfg(test)]
#[path = "qsa_tests.rs"]
mod tests;
