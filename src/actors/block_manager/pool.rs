//! The plain block pool: a free list of block ids and each request's blocks.

use std::collections::HashMap;

use crate::actors::messages::RequestId;

#[derive(Debug, Clone, Copy, PartialEq, Eq, kameo::Reply)]
pub struct PoolStats {
    pub total: usize,
    pub free: usize,
    pub requests: usize,
    pub total_slots: usize,
    pub free_slots: usize,
}

/// What a request holds: KV blocks for its full-attention layers and, for hybrid models, one
/// recurrent-state slot for its linear-attention / Mamba layers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Grant {
    pub blocks: Vec<u32>,
    pub state_slot: Option<u32>,
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
    owned: HashMap<RequestId, Grant>,
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
            owned: HashMap::new(),
        }
    }

    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Whether a request of `tokens` could ever fit (the whole pool free).
    pub fn could_ever_fit(&self, tokens: usize) -> bool {
        self.blocks_for(tokens) <= self.total
    }

    /// Blocks covering `tokens` positions (and a state slot, for hybrid pools) for a new
    /// request, or `None` if not enough are free (nothing is taken then). A request already
    /// holding a grant gets none.
    pub fn allocate(&mut self, id: &RequestId, tokens: usize) -> Option<Grant> {
        let need = self.blocks_for(tokens);
        let slot_missing = self.total_slots > 0 && self.free_slots.is_empty();
        if need > self.free.len() || slot_missing || self.owned.contains_key(id) {
            return None;
        }
        let blocks = self.free.split_off(self.free.len() - need);
        let grant = Grant {
            blocks: blocks.into_iter().rev().collect(),
            state_slot: self.free_slots.pop(),
        };
        self.owned.insert(id.clone(), grant.clone());
        Some(grant)
    }

    /// Returns the request's blocks and slot; freeing twice is a no-op. Returns the blocks freed.
    pub fn free(&mut self, id: &RequestId) -> usize {
        let Some(grant) = self.owned.remove(id) else {
            return 0;
        };
        let n = grant.blocks.len();
        self.free.extend(grant.blocks.into_iter().rev());
        self.free_slots.extend(grant.state_slot);
        n
    }

    pub fn stats(&self) -> PoolStats {
        PoolStats {
            total: self.total,
            free: self.free.len(),
            requests: self.owned.len(),
            total_slots: self.total_slots,
            free_slots: self.free_slots.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> RequestId {
        RequestId::new(s).unwrap()
    }

    #[test]
    fn allocates_ceil_blocks_and_frees_them() {
        let mut p = BlockPool::new(10, 4, 0);
        let b = p.allocate(&id("a"), 9).unwrap();
        assert_eq!(b.blocks, vec![0, 1, 2]);
        assert_eq!(b.state_slot, None);
        assert_eq!(p.stats().free, 7);
        assert_eq!(p.free(&id("a")), 3);
        assert_eq!(p.stats().free, 10);
    }

    #[test]
    fn exhaustion_takes_nothing() {
        let mut p = BlockPool::new(4, 4, 0);
        assert!(p.allocate(&id("a"), 12).is_some());
        assert!(p.allocate(&id("b"), 8).is_none());
        assert_eq!(p.stats().free, 1);
        assert!(p.allocate(&id("c"), 4).is_some());
        assert_eq!(p.stats().free, 0);
    }

    #[test]
    fn double_free_and_double_allocate_are_harmless() {
        let mut p = BlockPool::new(4, 4, 0);
        p.allocate(&id("a"), 4).unwrap();
        assert!(p.allocate(&id("a"), 4).is_none());
        assert_eq!(p.free(&id("a")), 1);
        assert_eq!(p.free(&id("a")), 0);
        assert_eq!(p.stats().free, 4);
    }

    #[test]
    fn freed_blocks_are_reused_without_duplicates() {
        let mut p = BlockPool::new(6, 2, 0);
        let a = p.allocate(&id("a"), 4).unwrap();
        let b = p.allocate(&id("b"), 4).unwrap();
        p.free(&id("a"));
        let c = p.allocate(&id("c"), 8).unwrap();
        let mut all: Vec<u32> = b.blocks.iter().chain(&c.blocks).copied().collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 6);
        assert!(a.blocks.iter().all(|x| c.blocks.contains(x)));
    }

    #[test]
    fn hybrid_pool_grants_one_state_slot_per_request() {
        let mut p = BlockPool::new(100, 4, 2);
        let a = p.allocate(&id("a"), 4).unwrap();
        let b = p.allocate(&id("b"), 4).unwrap();
        assert_eq!((a.state_slot, b.state_slot), (Some(0), Some(1)));
        // Blocks are plentiful but slots are not: admission waits for a slot.
        assert!(p.allocate(&id("c"), 4).is_none());
        assert_eq!(p.stats().free, 98);
        p.free(&id("a"));
        assert_eq!(p.allocate(&id("c"), 4).unwrap().state_slot, Some(0));
        assert_eq!(p.stats().free_slots, 0);
    }

    #[test]
    fn could_ever_fit_checks_whole_pool() {
        let p = BlockPool::new(4, 16, 0);
        assert!(p.could_ever_fit(64));
        assert!(!p.could_ever_fit(65));
    }
}
