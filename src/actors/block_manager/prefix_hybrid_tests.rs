//! Prefix reuse for hybrid models: hits end at a block whose recurrent state was snapshotted,
//! snapshot slots come back on every path and count in the byte bound. Without channels.

use std::collections::HashSet;
use std::sync::Arc;

use crate::actors::block_manager::{BlockPool, Grant, SnapshotSlots};
use crate::actors::messages::RequestId;

const BS: usize = 4;
/// Bytes of one captured row, and of one state snapshot, in these tests.
const ROW: usize = 2;
const STATE: usize = 10;
/// Running requests' state slots are 0 and 1; snapshot slots start after them.
const FIRST: u32 = 2;

fn id(s: &str) -> RequestId {
    RequestId::new(s).unwrap()
}

fn tokens(n: usize) -> Arc<[u32]> {
    (100..100 + n as u32).collect()
}

fn other_tokens(n: usize) -> Arc<[u32]> {
    (500..500 + n as u32).collect()
}

fn rows(n: usize) -> Vec<u8> {
    (0..n).flat_map(|t| [t as u8; ROW]).collect()
}

fn pool(snapshots: usize, max_bytes: usize) -> BlockPool {
    let slots = SnapshotSlots {
        first: FIRST,
        count: snapshots,
        bytes: STATE,
    };
    BlockPool::new(32, BS, 2).with_hybrid_prefix_cache(max_bytes, slots)
}

fn positions(g: &Grant) -> Vec<usize> {
    g.snapshots.iter().map(|s| s.0).collect()
}

/// Allocates a request of `prompt`, publishes every full block past its hit (with the
/// snapshots at their ends), and releases it.
fn finish(p: &mut BlockPool, name: &str, prompt: &Arc<[u32]>) -> Grant {
    let g = p.allocate(&id(name), prompt.len(), prompt).expect("fits");
    let all = rows(prompt.len());
    let first = g.cached_tokens / BS;
    let blocks = (first..prompt.len() / BS)
        .map(|k| Arc::from(&all[k * BS * ROW..(k + 1) * BS * ROW]))
        .collect();
    p.computed(&id(name), first, blocks);
    p.free(&id(name));
    g
}

#[test]
fn a_hit_restores_the_state_snapshotted_at_its_last_block() {
    let mut p = pool(8, 1 << 20);
    assert!(p.caches_prefixes());
    let a = finish(&mut p, "a", &tokens(10));
    // 10 tokens: the state is snapshotted at the block boundaries 4 and 8.
    assert_eq!(positions(&a), vec![4, 8]);
    assert_eq!(a.restore_from, None);
    let stats = p.stats().prefix;
    assert_eq!((stats.cached_blocks, stats.snapshots), (2, 2));
    assert_eq!(stats.bytes, 2 * BS * ROW + 2 * STATE);
    let b = p.allocate(&id("b"), 20, &tokens(20)).unwrap();
    assert_eq!(b.cached_tokens, 8);
    assert_eq!(b.restore_from, Some(a.snapshots[1].1));
    assert_eq!(b.prefix_rows.concat(), rows(8));
    // b snapshots only the boundaries past its hit.
    assert_eq!(positions(&b), vec![12, 16, 20]);
}

#[test]
fn a_hit_is_cut_back_to_the_last_block_with_a_snapshot() {
    // One snapshot slot: it goes to the last boundary (a next turn extends the prompt).
    let mut p = pool(1, 1 << 20);
    let a = finish(&mut p, "a", &tokens(10));
    assert_eq!(positions(&a), vec![8]);
    // 6 tokens match block 0 only, which has no snapshot: nothing reused.
    let b = p.allocate(&id("b"), 6, &tokens(6)).unwrap();
    assert_eq!((b.cached_tokens, b.restore_from), (0, None));
    // b's boundary at 4 takes the only slot by evicting a's entry (least recently used, in
    // use by no one).
    assert_eq!(b.snapshots, vec![(4, a.snapshots[0].1)]);
    assert_eq!(p.stats().prefix.snapshots, 0);
}

#[test]
fn snapshot_slots_come_back_on_abort_and_are_never_handed_out_twice() {
    let mut p = pool(4, 1 << 20);
    let a = p.allocate(&id("a"), 17, &tokens(17)).unwrap();
    assert_eq!(positions(&a), vec![4, 8, 12, 16]);
    // Every slot taken and none cached: a second request snapshots nothing.
    let b = p.allocate(&id("b"), 9, &other_tokens(9)).unwrap();
    assert!(b.snapshots.is_empty());
    p.free(&id("a"));
    p.free(&id("b"));
    assert_eq!(p.stats().prefix.snapshots, 0);
    let c = finish(&mut p, "c", &tokens(17));
    let slots: HashSet<u32> = c.snapshots.iter().map(|s| s.1).collect();
    assert_eq!(slots, (FIRST..FIRST + 4).collect());
    // Cached snapshots are evicted (with their blocks) for a new request's boundaries.
    let d = p.allocate(&id("d"), 9, &other_tokens(9)).unwrap();
    assert_eq!(positions(&d), vec![4, 8]);
    let in_cache = p.stats().prefix.snapshots;
    assert_eq!(in_cache, 2);
}

#[test]
fn snapshots_count_in_the_byte_bound() {
    // Room for 2 blocks' rows and 2 snapshots.
    let bound = 2 * BS * ROW + 2 * STATE;
    let mut p = pool(8, bound);
    finish(&mut p, "a", &tokens(10));
    assert_eq!(p.stats().prefix.bytes, bound);
    finish(&mut p, "b", &other_tokens(10));
    let stats = p.stats().prefix;
    assert!(stats.bytes <= bound, "{stats:?}");
    // b's chain replaced a's (least recently used) and is whole.
    let hit = p.allocate(&id("c"), 12, &other_tokens(12)).unwrap();
    assert_eq!(hit.cached_tokens, 8);
    assert!(hit.restore_from.is_some());
    assert_eq!(
        p.allocate(&id("e"), 12, &tokens(12)).unwrap().cached_tokens,
        0
    );
}

#[test]
fn dense_pools_and_pools_without_snapshot_slots_keep_no_states() {
    let mut p = pool(0, 1 << 20);
    assert!(!p.caches_prefixes());
    assert!(finish(&mut p, "a", &tokens(10)).snapshots.is_empty());
    let mut d = BlockPool::new(16, BS, 0).with_prefix_cache(1 << 20);
    let a = finish(&mut d, "a", &tokens(10));
    assert!(a.snapshots.is_empty());
    let b = d.allocate(&id("b"), 20, &tokens(20)).unwrap();
    assert_eq!((b.cached_tokens, b.restore_from), (8, None));
}
