//! Hybrid requests (those with a state slot) in the scheduler: their prefill chunks end at
//! snapshot positions, carrying the slot copies, and at multiples of [`RECURRENT_BLOCK`] when
//! the step budget cuts them.

use super::tests::{chunk_shape, id, limits, output_for, req, step};
use super::*;

#[test]
fn hybrid_chunks_end_at_snapshot_positions_and_carry_the_slot_copies() {
    use crate::actors::messages::SlotCopy;
    let mut s = SchedulerState::new(limits(100, 4));
    s.submit(req("a", 40, 1)).unwrap();
    let hit = Grant {
        blocks: vec![5, 6, 7],
        state_slot: Some(1),
        cached_tokens: 8,
        prefix_rows: vec![vec![0u8; 4].into()],
        restore_from: Some(9),
        snapshots: vec![(16, 10), (32, 11)],
    };
    let plan = s.plan_step(vec![(id("a"), hit)]).unwrap();
    // The restore goes before the first chunk, which ends at the first snapshot position.
    assert_eq!(chunk_shape(&plan), vec![("a".into(), 8, 8, false)]);
    assert_eq!(plan.restores, vec![SlotCopy { from: 9, to: 1 }]);
    assert_eq!(plan.snapshots, vec![SlotCopy { from: 1, to: 10 }]);
    s.apply(&output_for(&plan));
    let plan = step(&mut s).unwrap();
    assert_eq!(chunk_shape(&plan), vec![("a".into(), 16, 16, false)]);
    assert!(plan.restores.is_empty());
    assert_eq!(plan.snapshots, vec![SlotCopy { from: 1, to: 11 }]);
    s.apply(&output_for(&plan));
    let plan = step(&mut s).unwrap();
    assert_eq!(chunk_shape(&plan), vec![("a".into(), 32, 8, true)]);
    assert!(plan.snapshots.is_empty());
    let fx = s.apply(&output_for(&plan));
    assert_eq!(fx.finished.len(), 1);
    assert_eq!(s.stats().tokens_computed, 32);
}

/// Prefill chunks in (start, len) of a 99-token request granted `slot` under `budget`.
fn chunks_of(slot: Option<u32>, budget: usize) -> Vec<(usize, usize)> {
    let mut s = SchedulerState::new(limits(budget, 4));
    s.submit(req("a", 99, 1)).unwrap();
    let g = Grant {
        blocks: vec![0],
        state_slot: slot,
        ..Grant::default()
    };
    let mut plan = s.plan_step(vec![(id("a"), g)]);
    let mut shape = Vec::new();
    while let Some(p) = plan {
        shape.extend(chunk_shape(&p).into_iter().map(|c| (c.1, c.2)));
        s.apply(&output_for(&p));
        plan = step(&mut s);
    }
    shape
}

/// A hybrid request's budget-cut chunks end at a multiple of the recurrences' block (so
/// CUDA's chunked recurrences see the blocks of one pass) when that leaves a chunk; a dense
/// request's take the whole budget; a chunk that ends the prompt is never shortened.
#[test]
fn hybrid_prefill_cuts_at_recurrent_blocks() {
    assert_eq!(RECURRENT_BLOCK, 64);
    assert_eq!(chunks_of(Some(1), 80), [(0, 64), (64, 35)]);
    assert_eq!(chunks_of(None, 80), [(0, 80), (80, 19)]);
    // Under a budget smaller than a block, the first cut has no multiple to end at.
    assert_eq!(chunks_of(Some(1), 40), [(0, 40), (40, 24), (64, 35)]);
    assert_eq!(chunks_of(Some(1), 99), [(0, 99)]);
}
