//! The plain block pool: a free list of block ids and each request's blocks.

use std::collections::HashMap;

use crate::actors::messages::RequestId;

#[derive(Debug, Clone, Copy, PartialEq, Eq, kameo::Reply)]
pub struct PoolStats {
    pub total: usize,
    pub free: usize,
    pub requests: usize,
}

#[derive(Debug)]
pub struct BlockPool {
    block_size: usize,
    total: usize,
    /// Free ids; popped from the end, so low ids are handed out first.
    free: Vec<u32>,
    owned: HashMap<RequestId, Vec<u32>>,
}

impl BlockPool {
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        assert!(block_size > 0, "block_size must be positive");
        Self {
            block_size,
            total: num_blocks,
            free: (0..num_blocks as u32).rev().collect(),
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

    /// Blocks covering `tokens` positions for a new request, or `None` if not enough are free
    /// (nothing is taken then). A request already holding blocks gets none.
    pub fn allocate(&mut self, id: &RequestId, tokens: usize) -> Option<Vec<u32>> {
        let need = self.blocks_for(tokens);
        if need > self.free.len() || self.owned.contains_key(id) {
            return None;
        }
        let blocks = self.free.split_off(self.free.len() - need);
        let blocks: Vec<u32> = blocks.into_iter().rev().collect();
        self.owned.insert(id.clone(), blocks.clone());
        Some(blocks)
    }

    /// Returns the request's blocks to the free list; freeing twice is a no-op.
    pub fn free(&mut self, id: &RequestId) -> usize {
        let Some(blocks) = self.owned.remove(id) else {
            return 0;
        };
        let n = blocks.len();
        self.free.extend(blocks.into_iter().rev());
        n
    }

    pub fn stats(&self) -> PoolStats {
        PoolStats {
            total: self.total,
            free: self.free.len(),
            requests: self.owned.len(),
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
        let mut p = BlockPool::new(10, 4);
        let b = p.allocate(&id("a"), 9).unwrap();
        assert_eq!(b, vec![0, 1, 2]);
        assert_eq!(p.stats().free, 7);
        assert_eq!(p.free(&id("a")), 3);
        assert_eq!(p.stats().free, 10);
    }

    #[test]
    fn exhaustion_takes_nothing() {
        let mut p = BlockPool::new(4, 4);
        assert!(p.allocate(&id("a"), 12).is_some());
        assert!(p.allocate(&id("b"), 8).is_none());
        assert_eq!(p.stats().free, 1);
        assert!(p.allocate(&id("c"), 4).is_some());
        assert_eq!(p.stats().free, 0);
    }

    #[test]
    fn double_free_and_double_allocate_are_harmless() {
        let mut p = BlockPool::new(4, 4);
        p.allocate(&id("a"), 4).unwrap();
        assert!(p.allocate(&id("a"), 4).is_none());
        assert_eq!(p.free(&id("a")), 1);
        assert_eq!(p.free(&id("a")), 0);
        assert_eq!(p.stats().free, 4);
    }

    #[test]
    fn freed_blocks_are_reused_without_duplicates() {
        let mut p = BlockPool::new(6, 2);
        let a = p.allocate(&id("a"), 4).unwrap();
        let b = p.allocate(&id("b"), 4).unwrap();
        p.free(&id("a"));
        let c = p.allocate(&id("c"), 8).unwrap();
        let mut all: Vec<u32> = b.iter().chain(c.iter()).copied().collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 6);
        assert!(a.iter().all(|x| c.contains(x)));
    }

    #[test]
    fn could_ever_fit_checks_whole_pool() {
        let p = BlockPool::new(4, 16);
        assert!(p.could_ever_fit(64));
        assert!(!p.could_ever_fit(65));
    }
}
