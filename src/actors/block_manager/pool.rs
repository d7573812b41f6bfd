//! The plain block pool: a free list of block ids and each request's blocks.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::prefix::{BlockHash, PrefixCache, PrefixStats, Rejected};
use crate::actors::messages::RequestId;

#[derive(Debug, Clone, Copy, PartialEq, Eq, kameo::Reply)]
pub struct PoolStats {
    pub total: usize,
    pub free: usize,
    pub requests: usize,
    pub total_slots: usize,
    pub free_slots: usize,
    /// Prefix reuse (zeros when off).
    pub prefix: PrefixStats,
}

/// What a request holds: KV blocks for its full-attention layers and, for hybrid models, one
/// recurrent-state slot for its linear-attention / Mamba layers.
///
/// With prefix reuse, `blocks` starts with the cached blocks of the request's first
/// `cached_tokens` positions, and `prefix_rows` holds their captured rows (one entry per
/// block): the request starts at `cached_tokens`. Hybrid models also get the snapshot slot
/// to restore their state slot from (`restore_from`, the state at `cached_tokens`), and
/// snapshot slots to copy their state into when a chunk ends at a position of `snapshots`
/// (block boundaries of the prompt, ascending), kept for later requests when they finish.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Grant {
    pub blocks: Vec<u32>,
    pub state_slot: Option<u32>,
    pub cached_tokens: usize,
    pub prefix_rows: Vec<Arc<[u8]>>,
    pub restore_from: Option<u32>,
    pub snapshots: Vec<(usize, u32)>,
}

/// The recurrent-state slots a hybrid model's backend keeps for prefix reuse: `count` slots
/// from `first`, `bytes` each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotSlots {
    pub first: u32,
    pub count: usize,
    pub bytes: usize,
}

/// A request's grant, its prompt (to hash its blocks at release) and the cache entries it uses.
#[derive(Debug)]
struct Owned {
    grant: Grant,
    prompt: Arc<[u32]>,
    shared: Vec<BlockHash>,
}

#[derive(Debug)]
pub struct BlockPool {
    block_size: usize,
    total: usize,
    /// Free ids; popped from the end, so low ids are handed out first.
    free: Vec<u32>,
    /// Free state slots (empty and unused for dense models).
    free_slots: Vec<u32>,
    total_slots: usize,
    /// Free snapshot slots (hybrid models with prefix reuse).
    free_snapshots: Vec<u32>,
    owned: HashMap<RequestId, Owned>,
    /// Prefix reuse; `None` when off.
    cache: Option<PrefixCache>,
}

impl BlockPool {
    /// A pool of `num_blocks` KV blocks; `state_slots > 0` (hybrid models) also gives every
    /// request one of that many recurrent-state slots.
    pub fn new(num_blocks: usize, block_size: usize, state_slots: usize) -> Self {
        assert!(block_size > 0, "block_size must be positive");
        Self {
            block_size,
            total: num_blocks,
            free: (0..num_blocks as u32).rev().collect(),
            free_slots: (0..state_slots as u32).rev().collect(),
            total_slots: state_slots,
            free_snapshots: Vec::new(),
            owned: HashMap::new(),
            cache: None,
        }
    }

    /// Turns prefix reuse on, keeping at most `max_bytes` of captured rows (dense models only:
    /// a no-op with state slots, see [`Self::with_hybrid_prefix_cache`]).
    pub fn with_prefix_cache(mut self, max_bytes: usize) -> Self {
        if max_bytes > 0 && self.total_slots == 0 {
            self.cache = Some(PrefixCache::new(self.block_size, max_bytes));
        }
        self
    }

    /// Turns prefix reuse on for a hybrid model, keeping at most `max_bytes` of captured rows
    /// and recurrent-state snapshots (in the backend's `snapshots` slots); a no-op without
    /// bytes or snapshot slots, or for dense pools.
    pub fn with_hybrid_prefix_cache(mut self, max_bytes: usize, snapshots: SnapshotSlots) -> Self {
        if max_bytes > 0 && self.total_slots > 0 && snapshots.count > 0 {
            let cache = PrefixCache::new(self.block_size, max_bytes).with_states(snapshots.bytes);
            self.cache = Some(cache);
            let first = snapshots.first;
            self.free_snapshots = (first..first + snapshots.count as u32).rev().collect();
        }
        self
    }

    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Whether a request of `tokens` could ever fit (the whole pool free).
    pub fn could_ever_fit(&self, tokens: usize) -> bool {
        self.blocks_for(tokens) <= self.total
    }

    /// Whether prefix reuse is on.
    pub fn caches_prefixes(&self) -> bool {
        self.cache.is_some()
    }

    /// Blocks covering `tokens` positions (and a state slot, for hybrid pools) for a new
    /// request of `prompt`, reusing cached leading blocks, or `None` if not enough are free
    /// or evictable (nothing is taken then). A request already holding a grant gets none.
    pub fn allocate(
        &mut self,
        id: &RequestId,
        tokens: usize,
        prompt: &Arc<[u32]>,
    ) -> Option<Grant> {
        let slot_missing = self.total_slots > 0 && self.free_slots.is_empty();
        if slot_missing || self.owned.contains_key(id) {
            return None;
        }
        let hit = self
            .cache
            .as_mut()
            .map(|c| c.lookup(prompt))
            .unwrap_or_default();
        let need = self.blocks_for(tokens).saturating_sub(hit.blocks.len());
        if !self.make_free(need) {
            if let Some(c) = self.cache.as_mut() {
                c.forget_hit(&hit);
            }
            return None;
        }
        let fresh = self.free.split_off(self.free.len() - need);
        let snapshots = self.take_snapshot_slots(prompt, hit.blocks.len());
        let grant = Grant {
            blocks: hit
                .blocks
                .iter()
                .copied()
                .chain(fresh.into_iter().rev())
                .collect(),
            state_slot: self.free_slots.pop(),
            cached_tokens: hit.blocks.len() * self.block_size,
            prefix_rows: hit.rows,
            restore_from: hit.state,
            snapshots,
        };
        let owned = Owned {
            grant: grant.clone(),
            prompt: prompt.clone(),
            shared: hit.hashes,
        };
        self.owned.insert(id.clone(), owned);
        Some(grant)
    }

    /// Snapshot slots for the block boundaries of `prompt` after its first `cached` blocks, as
    /// many as are free or evictable, the last boundaries first (a conversation's next turn
    /// extends its prompt); `(position, slot)` ascending. None for dense pools.
    fn take_snapshot_slots(&mut self, prompt: &[u32], cached: usize) -> Vec<(usize, u32)> {
        let Some(cache) = self.cache.as_mut().filter(|c| c.needs_states()) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for k in (cached + 1..=prompt.len() / self.block_size).rev() {
            let slot = match self.free_snapshots.pop() {
                Some(slot) => slot,
                None => match cache.evict_state(&HashSet::new()) {
                    Some(freed) => {
                        self.free.extend(freed.block);
                        freed.state.expect("evicted for its snapshot")
                    }
                    None => break,
                },
            };
            out.push((k * self.block_size, slot));
        }
        out.reverse();
        out
    }

    /// Gives back what the cache did not keep or evicted.
    fn take_back(&mut self, r: Rejected) {
        self.free.extend(r.blocks.into_iter().rev());
        self.free_snapshots.extend(r.states);
    }

    /// Evicts unused cached blocks until `need` are free; false if they cannot be.
    fn make_free(&mut self, need: usize) -> bool {
        let evictable = self.cache.as_ref().map_or(0, |c| c.evictable_blocks());
        if need > self.free.len() + evictable {
            return false;
        }
        while self.free.len() < need {
            match self.cache.as_mut().and_then(|c| c.evict_block()) {
                Some(f) => {
                    self.free.extend(f.block);
                    self.free_snapshots.extend(f.state);
                }
                None => return false,
            }
        }
        true
    }

    /// Returns the request's blocks and slot; freeing twice is a no-op. Returns the blocks
    /// given back (to the free list, or kept for reuse when `finished`: its prompt's full
    /// blocks hold valid KV then).
    pub fn free(&mut self, id: &RequestId, finished: bool) -> usize {
        let Some(Owned {
            grant,
            prompt,
            shared,
        }) = self.owned.remove(id)
        else {
            return 0;
        };
        let n = grant.blocks.len();
        self.free_slots.extend(grant.state_slot);
        let Some(cache) = self.cache.as_mut() else {
            self.free.extend(grant.blocks.into_iter().rev());
            return n;
        };
        cache.unref(&shared);
        let unused = if finished {
            let bs = self.block_size;
            let states: Vec<(usize, u32)> = (grant.snapshots.iter())
                .map(|&(pos, slot)| (pos / bs - 1, slot))
                .collect();
            cache.offer_blocks(&prompt, &grant.blocks, shared.len(), &states)
        } else {
            Rejected {
                blocks: grant.blocks[shared.len()..].to_vec(),
                states: grant.snapshots.iter().map(|s| s.1).collect(),
            }
        };
        self.take_back(unused);
        n
    }

    /// Keeps the captured rows of a finished request's full blocks of `tokens` for reuse
    /// (`row_bytes` per token), within the cache's byte bound.
    pub fn offer_rows(&mut self, tokens: &[u32], rows: &[Vec<u8>], row_bytes: usize) {
        if let Some(cache) = self.cache.as_mut() {
            let freed = cache.offer_rows(tokens, rows, row_bytes);
            self.take_back(freed);
        }
    }

    pub fn stats(&self) -> PoolStats {
        PoolStats {
            total: self.total,
            free: self.free.len(),
            requests: self.owned.len(),
            total_slots: self.total_slots,
            free_slots: self.free_slots.len(),
            prefix: self.cache.as_ref().map(|c| c.stats()).unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> RequestId {
        RequestId::new(s).unwrap()
    }

    /// A prompt of `n` distinct tokens.
    fn prompt(n: usize) -> Arc<[u32]> {
        (0..n as u32).collect()
    }

    #[test]
    fn allocates_ceil_blocks_and_frees_them() {
        let mut p = BlockPool::new(10, 4, 0);
        let b = p.allocate(&id("a"), 9, &prompt(9)).unwrap();
        assert_eq!(b.blocks, vec![0, 1, 2]);
        assert_eq!(b.state_slot, None);
        assert_eq!(p.stats().free, 7);
        assert_eq!(p.free(&id("a"), false), 3);
        assert_eq!(p.stats().free, 10);
    }

    #[test]
    fn exhaustion_takes_nothing() {
        let mut p = BlockPool::new(4, 4, 0);
        assert!(p.allocate(&id("a"), 12, &prompt(12)).is_some());
        assert!(p.allocate(&id("b"), 8, &prompt(8)).is_none());
        assert_eq!(p.stats().free, 1);
        assert!(p.allocate(&id("c"), 4, &prompt(4)).is_some());
        assert_eq!(p.stats().free, 0);
    }

    #[test]
    fn double_free_and_double_allocate_are_harmless() {
        let mut p = BlockPool::new(4, 4, 0);
        p.allocate(&id("a"), 4, &prompt(4)).unwrap();
        assert!(p.allocate(&id("a"), 4, &prompt(4)).is_none());
        assert_eq!(p.free(&id("a"), false), 1);
        assert_eq!(p.free(&id("a"), false), 0);
        assert_eq!(p.stats().free, 4);
    }

    #[test]
    fn freed_blocks_are_reused_without_duplicates() {
        let mut p = BlockPool::new(6, 2, 0);
        let a = p.allocate(&id("a"), 4, &prompt(4)).unwrap();
        let b = p.allocate(&id("b"), 4, &prompt(4)).unwrap();
        p.free(&id("a"), false);
        let c = p.allocate(&id("c"), 8, &prompt(8)).unwrap();
        let mut all: Vec<u32> = b.blocks.iter().chain(&c.blocks).copied().collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 6);
        assert!(a.blocks.iter().all(|x| c.blocks.contains(x)));
    }

    #[test]
    fn hybrid_pool_grants_one_state_slot_per_request() {
        let mut p = BlockPool::new(100, 4, 2);
        let a = p.allocate(&id("a"), 4, &prompt(4)).unwrap();
        let b = p.allocate(&id("b"), 4, &prompt(4)).unwrap();
        assert_eq!((a.state_slot, b.state_slot), (Some(0), Some(1)));
        // Blocks are plentiful but slots are not: admission waits for a slot.
        assert!(p.allocate(&id("c"), 4, &prompt(4)).is_none());
        assert_eq!(p.stats().free, 98);
        p.free(&id("a"), false);
        assert_eq!(
            p.allocate(&id("c"), 4, &prompt(4)).unwrap().state_slot,
            Some(0)
        );
        assert_eq!(p.stats().free_slots, 0);
    }

    #[test]
    fn could_ever_fit_checks_whole_pool() {
        let p = BlockPool::new(4, 16, 0);
        assert!(p.could_ever_fit(64));
        assert!(!p.could_ever_fit(65));
    }
}
