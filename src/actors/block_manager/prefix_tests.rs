//! The prefix cache and the pool's use of it, without channels.

use std::sync::Arc;

use super::*;
use crate::actors::block_manager::{BlockPool, Grant};
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

/// Runs a request of `n` prompt tokens to the end: allocate, release finished, rows offered.
fn finish(p: &mut BlockPool, name: &str, n: usize) -> Grant {
    let g = p.allocate(&id(name), n, &tokens(n)).expect("fits");
    p.free(&id(name), true);
    p.offer_rows(&tokens(n), &[rows(n)], ROW);
    g
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
fn rows_and_blocks_arrive_in_either_order_and_both_are_needed() {
    let mut p = pool(16, 1 << 20);
    let n = 8;
    p.allocate(&id("a"), n, &tokens(n)).unwrap();
    // Rows first (the connector's message may overtake the scheduler's release).
    p.offer_rows(&tokens(n), &[rows(n)], ROW);
    assert_eq!(
        p.allocate(&id("x"), 12, &tokens(12)).unwrap().cached_tokens,
        0
    );
    p.free(&id("x"), false);
    p.free(&id("a"), true);
    assert_eq!(
        p.allocate(&id("b"), 12, &tokens(12)).unwrap().cached_tokens,
        8
    );
    // A request that failed keeps nothing: its blocks are freed, no rows came.
    let mut q = pool(16, 1 << 20);
    q.allocate(&id("a"), n, &tokens(n)).unwrap();
    q.free(&id("a"), false);
    assert_eq!(q.stats().free, 16);
    assert_eq!(
        q.allocate(&id("b"), 12, &tokens(12)).unwrap().cached_tokens,
        0
    );
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
    let b = p.allocate(&id("b"), 8, &other.clone().into()).unwrap();
    p.free(&id("b"), true);
    p.offer_rows(&other, &[rows(8)], ROW); // 4 blocks' rows > 3: the oldest (a's tail) goes
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
    p.free(&id("c"), false);
    p.free(&id("d"), false);
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
    p.free(&id("b"), true);
    p.offer_rows(&other, &[rows(16)], ROW);
    let mut longer = other.to_vec();
    longer.extend([1, 2, 3, 4]);
    assert!(p.allocate(&id("c"), 20, &longer.into()).is_none());
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
    p.free(&id("b"), true);
    p.free(&id("c"), true);
    // b's third block was kept; c's duplicate of it was freed.
    assert_eq!(p.stats().free + 3, 16);
    p.offer_rows(&tokens(12), &[rows(12)], ROW);
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
fn rows_split_over_chunks_are_gathered_per_block() {
    let mut p = pool(16, 1 << 20);
    p.allocate(&id("a"), 12, &tokens(12)).unwrap();
    p.free(&id("a"), true);
    // Chunks of 5 and 7 rows: block 1 (rows 4..8) straddles them.
    let all = rows(12);
    p.offer_rows(
        &tokens(12),
        &[all[..5 * ROW].to_vec(), all[5 * ROW..].to_vec()],
        ROW,
    );
    let g = p.allocate(&id("b"), 13, &tokens(13)).unwrap();
    assert_eq!(g.cached_tokens, 12);
    assert_eq!(g.prefix_rows.concat(), all);
    assert_eq!(gather(&[vec![1, 2], vec![3]], 1, 3), None);
    assert_eq!(gather(&[vec![1, 2], vec![3]], 1, 2), Some(vec![2, 3]));
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
