//! The CPU's QSA selection against the f64 reference over a shuffled paged cache, and the
//! same selection however the prompt is cut and whatever shares the step.

use super::*;
use crate::kernels::cpu::dsa::IndexCache;
use crate::kernels::dsa::IndexShape;
use crate::kernels::plan::PlanLimits;
use crate::kernels::qsa_reference::QsaInputs;
use crate::kernels::{Batch, SeqChunk};

const BLOCK: usize = 4;
const TOKENS: usize = 45;
/// Blocks kept and keys per block: tokens from position 3 · 3 + 2 = 11 on are sparse.
const KEEP: (usize, usize) = (3, 3);

/// A chunk of the test request (`start..start + len`) over its shuffled block table (the
/// same blocks in every step); `other` uses another table (a second request).
fn chunk(start: usize, len: usize, other: bool) -> SeqChunk {
    let blocks = (start + len).div_ceil(BLOCK) as u32;
    let last = TOKENS.div_ceil(BLOCK) as u32 - 1;
    let block_table = (0..blocks)
        .map(|b| 3 * (last - b) + 1 + other as u32)
        .collect();
    SeqChunk {
        context: Vec::new(),
        start,
        len,
        block_table,
        sample: false,
        state_slot: None,
    }
}

/// Steps of `chunks` in order, with one index cache across them: the keys each token of the
/// first request selects, by position.
fn select_steps(inputs: &QsaInputs, steps: &[&[(usize, usize, bool)]]) -> Vec<Option<Vec<u32>>> {
    let (d, hd) = (inputs.d, inputs.heads * inputs.d);
    let rule = inputs.rule(KEEP.0, KEEP.1);
    let mut cache = IndexCache::new(IndexShape { layers: 1, dim: d }, 64 * BLOCK).unwrap();
    let mut got = vec![None; TOKENS];
    for step in steps {
        let seqs: Vec<SeqChunk> = step.iter().map(|&(s, n, o)| chunk(s, n, o)).collect();
        let first = step.iter().position(|c| !c.2);
        let n: usize = seqs.iter().map(|s| s.len).sum();
        let ids = vec![1u32; n];
        let batch = Batch {
            token_ids: &ids,
            seqs: &seqs,
        };
        let plan = BatchPlan::new(&batch, &PlanLimits::new(8, 1024, 64, BLOCK)).unwrap();
        // Every request reads the same inputs at its positions.
        let mut q: Vec<f32> = (plan.positions.iter())
            .flat_map(|&p| inputs.q[p * hd..][..hd].to_vec())
            .collect();
        let k: Vec<f32> = (plan.positions.iter())
            .flat_map(|&p| inputs.k[p * d..][..d].to_vec())
            .collect();
        prepare(&mut q, &plan.positions, &rule);
        cache.write(0, &plan.slots, &k);
        let mut sel = Selection::default();
        select(&q, cache.layer(0), &plan, &rule, &mut sel);
        for t in (0..n).filter(|&t| Some(plan.seq_of[t]) == first) {
            got[plan.positions[t]] = sel.keys(t).map(<[u32]>::to_vec);
        }
    }
    got
}

/// Each token's keys equal the f64 rule's: every key below the dense length, then its best
/// blocks' and its tail's.
#[test]
fn selection_matches_the_f64_rule() {
    let inputs = QsaInputs::new(TOKENS, (3, 8, 4), 11);
    let got = select_steps(&inputs, &[&[(0, TOKENS, false)]]);
    for (t, keys) in got.iter().enumerate() {
        assert_eq!(*keys, inputs.want_keys(t, KEEP.0, KEEP.1), "token {t}");
    }
    assert!(got[10].is_none() && got[11].as_ref().is_some_and(|k| k.len() == 9));
    assert_eq!(got[13].as_ref().map(Vec::len), Some(9 + 2));
}

/// Cut into pieces (at and off block edges) and sharing the steps with another request, each
/// token selects the same keys.
#[test]
fn selection_is_the_same_however_the_prompt_is_cut() {
    let inputs = QsaInputs::new(TOKENS, (2, 8, 8), 12);
    let whole = select_steps(&inputs, &[&[(0, TOKENS, false)]]);
    let cut = select_steps(
        &inputs,
        &[
            &[(0, 7, false), (0, 20, true)],
            &[(20, 9, true), (7, 23, false)],
            &[(30, 15, false)],
        ],
    );
    assert_eq!(whole, cut);
}
