//! The prefix cache and the pool's use of it, without channels.

use std::sync::Arc;

use super::*;
use crate::actors::block_manager::{BlockPool, Grant, NotGranted};
use crate::actors::messages::RequestId;

const BS: usize = 4;
/// Bytes of one captured row in these tests.
const ROW: usize = 2;

fn id(s: &str) -> RequestId {
    RequestId::new(s).unwrap()
}

fn tokens(n: usize) -> Arc<[u32]> {
    (100..100 + n as u32).collect()
}

/// Row `t` of every request holds bytes `[t, t]`: the same tokens give the same rows.
fn rows(n: usize) -> Vec<u8> {
    (0..n).flat_map(|t| [t as u8; ROW]).collect()
}

/// The model runner's report of blocks `first..last` of a request: their rows.
fn computed(p: &mut BlockPool, name: &str, first: usize, last: usize) {
    let all = rows(last * BS);
    let blocks = (first..last)
        .map(|k| Arc::from(&all[k * BS * ROW..(k + 1) * BS * ROW]))
        .collect();
    p.computed(&id(name), first, blocks);
}

/// Runs a request of `prompt` to the end: allocate, every full block computed, released.
fn finish_prompt(p: &mut BlockPool, name: &str, prompt: &Arc<[u32]>) -> Grant {
    let g = p.allocate(&id(name), prompt.len(), prompt).expect("fits");
    computed(p, name, g.cached_tokens / BS, prompt.len() / BS);
    p.free(&id(name));
    g
}

/// [`finish_prompt`] of `n` prompt tokens.
fn finish(p: &mut BlockPool, name: &str, n: usize) -> Grant {
    finish_prompt(p, name, &tokens(n))
}

fn pool(blocks: usize, max_bytes: usize) -> BlockPool {
    BlockPool::new(blocks, BS, 0).with_prefix_cache(max_bytes)
}

#[test]
fn longer_request_reuses_the_full_blocks_of_a_shorter_one() {
    let mut p = pool(16, 1 << 20);
    let first = finish(&mut p, "a", 10);
    assert_eq!(first.cached_tokens, 0);
    // 10 tokens: 2 full blocks kept (rows and KV), the partial third freed.
    assert_eq!(p.stats().prefix.cached_blocks, 2);
    assert_eq!(p.stats().prefix.bytes, 2 * BS * ROW);
    let g = p.allocate(&id("b"), 20, &tokens(20)).unwrap();
    assert_eq!(g.cached_tokens, 8);
    assert_eq!(g.blocks[..2], first.blocks[..2]);
    assert_eq!(g.blocks.len(), 5);
    let got: Vec<u8> = g
        .prefix_rows
        .iter()
        .flat_map(|r| r.iter().copied())
        .collect();
    assert_eq!(got, rows(8));
    assert_eq!(p.stats().prefix.hit_tokens, 8);
    // In use: not evictable; the pool has 16 - 5 free.
    assert_eq!(p.stats().free, 11);
}

#[test]
fn shorter_request_after_a_longer_one_keeps_its_last_token_to_compute() {
    let mut p = pool(16, 1 << 20);
    finish(&mut p, "a", 20);
    // 8 tokens = exactly 2 blocks, but the last token is computed: 1 block reused.
    let g = p.allocate(&id("b"), 8, &tokens(8)).unwrap();
    assert_eq!(g.cached_tokens, 4);
    let g = p.allocate(&id("c"), 9, &tokens(9)).unwrap();
    assert_eq!(g.cached_tokens, 8);
}

#[test]
fn a_request_waits_for_the_blocks_a_running_request_computes() {
    let mut p = pool(16, 1 << 20);
    p.allocate(&id("a"), 12, &tokens(12)).unwrap();
    // b's blocks 0 and 1 are a's, not computed yet: b waits and takes nothing.
    assert_eq!(
        p.allocate(&id("b"), 12, &tokens(12)),
        Err(NotGranted::InFlight)
    );
    assert_eq!(p.stats().free, 13);
    // Others need not wait.
    let other: Arc<[u32]> = (500..512).collect();
    assert_eq!(p.allocate(&id("x"), 12, &other).unwrap().cached_tokens, 0);
    computed(&mut p, "a", 0, 1);
    assert_eq!(
        p.allocate(&id("b"), 12, &tokens(12)),
        Err(NotGranted::InFlight),
        "block 1 still in flight"
    );
    computed(&mut p, "a", 1, 3);
    // Published while a runs: shared with it, the last token left to compute.
    let b = p.allocate(&id("b"), 12, &tokens(12)).unwrap();
    assert_eq!(b.cached_tokens, 8);
    assert_eq!(b.prefix_rows.concat(), rows(8));
    let s = p.stats().prefix;
    assert_eq!((s.cached_blocks, s.hit_tokens, s.waited_tokens), (3, 8, 8));
    // A short prompt within the computed blocks does not wait either.
    assert_eq!(
        p.allocate(&id("c"), 5, &tokens(5)).unwrap().cached_tokens,
        4
    );
    for r in ["a", "b", "c", "x"] {
        p.free(&id(r));
    }
    assert_eq!(p.stats().free + 3, 16);
}

#[test]
fn a_waiter_computes_on_its_own_when_the_owner_fails() {
    let mut p = pool(16, 1 << 20);
    p.allocate(&id("a"), 16, &tokens(16)).unwrap();
    computed(&mut p, "a", 0, 1);
    assert!(p.allocate(&id("b"), 14, &tokens(14)).is_err());
    // a fails (or is aborted) after its first block: its other blocks are not in flight any
    // more, the one it computed stays cached.
    p.free(&id("a"));
    let b = p.allocate(&id("b"), 14, &tokens(14)).unwrap();
    assert_eq!(b.cached_tokens, 4);
    assert_eq!(p.stats().free, 16 - 4);
    // b computes the rest itself and publishes it.
    computed(&mut p, "b", 1, 3);
    p.free(&id("b"));
    assert_eq!(p.stats().prefix.cached_blocks, 3);
    assert_eq!(
        p.allocate(&id("c"), 13, &tokens(13)).unwrap().cached_tokens,
        12
    );
    // A request that failed before computing a block leaves nothing.
    let mut q = pool(16, 1 << 20);
    q.allocate(&id("a"), 8, &tokens(8)).unwrap();
    q.free(&id("a"));
    assert_eq!(q.stats().free, 16);
    assert_eq!(
        q.allocate(&id("b"), 12, &tokens(12)).unwrap().cached_tokens,
        0
    );
}

#[test]
fn blocks_in_use_stay_past_the_byte_bound_and_a_waiter_on_evicted_blocks_computes() {
    // Room for the rows of 2 blocks.
    let mut p = pool(16, 2 * BS * ROW);
    let a = p.allocate(&id("a"), 16, &tokens(16)).unwrap();
    computed(&mut p, "a", 0, 4);
    // a's first two blocks are cached; the next two did not fit and stay a's own.
    assert_eq!(p.stats().prefix.cached_blocks, 2);
    let b = p.allocate(&id("b"), 13, &tokens(13)).unwrap();
    assert_eq!(b.cached_tokens, 8);
    assert_eq!(b.blocks[..2], a.blocks[..2]);
    // An unrelated request cannot evict blocks in use.
    let other: Arc<[u32]> = (500..508).collect();
    p.allocate(&id("x"), 8, &other).unwrap();
    computed(&mut p, "x", 0, 2);
    assert_eq!(p.stats().prefix.cached_blocks, 2);
    p.free(&id("a"));
    p.free(&id("b"));
    p.free(&id("x"));
    assert_eq!(p.stats().free + 2, 16);
    // Now a third chain evicts a's blocks: a request of a's tokens computes them again.
    finish_prompt(&mut p, "y", &(600..608).collect());
    assert_eq!(
        p.allocate(&id("c"), 13, &tokens(13)).unwrap().cached_tokens,
        0
    );
    assert!(p.stats().prefix.bytes <= 2 * BS * ROW);
}

#[test]
fn different_tokens_do_not_hit() {
    let mut p = pool(16, 1 << 20);
    finish(&mut p, "a", 12);
    let mut other: Vec<u32> = tokens(12).to_vec();
    other[5] = 7; // second block differs: only the first is reused
    let g = p.allocate(&id("b"), 12, &other.into()).unwrap();
    assert_eq!(g.cached_tokens, 4);
}

#[test]
fn byte_bound_evicts_least_recently_used_unused_blocks() {
    // Room for the rows of 3 blocks.
    let mut p = pool(32, 3 * BS * ROW);
    finish(&mut p, "a", 8); // blocks a0 a1
    let mut other: Vec<u32> = (500..508).collect();
    // 4 blocks' rows > 3: the oldest (a's tail) goes.
    let b = finish_prompt(&mut p, "b", &other.clone().into());
    let s = p.stats().prefix;
    assert!(s.bytes <= 3 * BS * ROW, "{s:?}");
    assert_eq!(s.cached_blocks, 3);
    // a's first block survives (tails are evicted first), b is whole.
    let tokens_a = tokens(9);
    assert_eq!(p.allocate(&id("c"), 9, &tokens_a).unwrap().cached_tokens, 4);
    other.push(1);
    let g = p.allocate(&id("d"), 9, &other.into()).unwrap();
    assert_eq!(g.cached_tokens, 8);
    assert_eq!(g.blocks[..2], b.blocks[..2]);
    // Every block is accounted for: in use, cached or free.
    p.free(&id("c"));
    p.free(&id("d"));
    assert_eq!(p.stats().free + p.stats().prefix.cached_blocks, 32);
}

#[test]
fn allocation_evicts_cached_blocks_when_the_free_list_runs_out() {
    let mut p = pool(4, 1 << 20);
    finish(&mut p, "a", 16); // 4 blocks, all cached
    assert_eq!(p.stats().free, 0);
    assert_eq!(p.stats().prefix.cached_blocks, 4);
    let other: Arc<[u32]> = (500..516).collect();
    let g = p
        .allocate(&id("b"), 16, &other)
        .expect("evicts the cached blocks");
    assert_eq!(g.cached_tokens, 0);
    assert_eq!(p.stats().prefix.cached_blocks, 0);
    assert_eq!(p.stats().prefix.bytes, 0);
    // Blocks in use by a hit are never evicted.
    computed(&mut p, "b", 0, 4);
    p.free(&id("b"));
    let mut longer = other.to_vec();
    longer.extend([1, 2, 3, 4]);
    assert_eq!(
        p.allocate(&id("c"), 20, &longer.into()),
        Err(NotGranted::NoRoom)
    );
    assert_eq!(
        p.stats().prefix.cached_blocks,
        4,
        "nothing taken by a failed allocation"
    );
    assert_eq!(p.stats().prefix.hit_tokens, 0);
}

#[test]
fn concurrent_requests_share_cached_blocks_and_release_them() {
    let mut p = pool(16, 1 << 20);
    finish(&mut p, "a", 9);
    let b = p.allocate(&id("b"), 12, &tokens(12)).unwrap();
    let c = p.allocate(&id("c"), 12, &tokens(12)).unwrap();
    assert_eq!(b.blocks[..2], c.blocks[..2]);
    assert_eq!((b.cached_tokens, c.cached_tokens), (8, 8));
    // Both compute block 2 (neither prompt's usable part reaches it, so c did not wait).
    computed(&mut p, "b", 2, 3);
    computed(&mut p, "c", 2, 3);
    p.free(&id("b"));
    p.free(&id("c"));
    // b's third block was kept; c's duplicate of it was freed.
    assert_eq!(p.stats().free + 3, 16);
    assert_eq!(p.stats().prefix.cached_blocks, 3);
    assert_eq!(
        p.allocate(&id("d"), 13, &tokens(13)).unwrap().cached_tokens,
        12
    );
}

#[test]
fn off_without_bytes_and_for_hybrid_pools() {
    let mut p = BlockPool::new(16, BS, 0).with_prefix_cache(0);
    finish(&mut p, "a", 12);
    assert_eq!(
        p.allocate(&id("b"), 12, &tokens(12)).unwrap().cached_tokens,
        0
    );
    assert_eq!(p.stats().free, 13);
    let mut h = BlockPool::new(16, BS, 2).with_prefix_cache(1 << 20);
    assert!(!h.caches_prefixes());
    finish(&mut h, "a", 12);
    assert_eq!(
        h.allocate(&id("b"), 12, &tokens(12)).unwrap().cached_tokens,
        0
    );
}

#[test]
fn computed_blocks_out_of_order_or_of_unknown_requests_are_ignored() {
    let mut p = pool(16, 1 << 20);
    p.allocate(&id("a"), 12, &tokens(12)).unwrap();
    computed(&mut p, "a", 1, 2);
    computed(&mut p, "zz", 0, 1);
    assert_eq!(p.stats().prefix.cached_blocks, 0);
    computed(&mut p, "a", 0, 3);
    assert_eq!(p.stats().prefix.cached_blocks, 3);
    p.free(&id("a"));
    assert_eq!(p.stats().free + 3, 16);
}

#[test]
fn chain_hashes_depend_on_every_earlier_token() {
    let a = chain(&[1, 2, 3, 4, 5, 6, 7, 8], BS);
    let b = chain(&[9, 2, 3, 4, 5, 6, 7, 8], BS);
    assert_eq!(a.len(), 2);
    assert_ne!(a[0].1, b[0].1);
    assert_ne!(a[1].1, b[1].1, "same block tokens, different prefix");
    assert_eq!(a[1].0, Some(a[0].1));
}
