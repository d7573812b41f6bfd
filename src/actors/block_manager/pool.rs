//! The plain block pool: a free list of block ids and each request's blocks.

use std::sync::Arc;

use super::Candidate;
use super::prefix::{
    BlockHash, Computed, Evicted, Link, Lookup, PrefixCache, PrefixHit, PrefixStats, chain,
};
use crate::actors::messages::RequestId;
use std::collections::{HashMap, HashSet};

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
/// (block boundaries of the prompt, ascending), published with the block ending there.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Grant {
    pub blocks: Vec<u32>,
    pub state_slot: Option<u32>,
    pub cached_tokens: usize,
    pub prefix_rows: Vec<Arc<[u8]>>,
    pub restore_from: Option<u32>,
    pub snapshots: Vec<(usize, u32)>,
}

/// Why a request got no blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotGranted {
    /// Not enough free or evictable blocks, or no state slot: later requests wait too.
    NoRoom,
    /// Its next block is being computed by a running request: it waits for that block to be
    /// published (later requests may go first).
    InFlight,
    /// The id already holds a grant.
    Duplicate,
}

/// The recurrent-state slots a hybrid model's backend keeps for prefix reuse: `count` slots
/// from `first`, `bytes` each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotSlots {
    pub first: u32,
    pub count: usize,
    pub bytes: usize,
}

/// A request's grant, and with prefix reuse what it computes for the cache.
#[derive(Debug)]
struct Owned {
    grant: Grant,
    prompt: Arc<[u32]>,
    /// The hash chain of the prompt's full blocks (empty without prefix reuse).
    links: Vec<Link>,
    /// Blocks `0..done` are computed: cached at the start, or published since.
    done: usize,
    /// Cache entries this request references.
    refs: Vec<BlockHash>,
    /// Its blocks that belong to the cache (not freed with the request).
    in_cache: HashSet<usize>,
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
    /// Requests told to wait for in-flight blocks: their prompt and its hash chain, kept so
    /// that a waiter asking again each step is not hashed again (and, for metrics, the tokens
    /// they then reuse).
    waiting: HashMap<RequestId, (Arc<[u32]>, Vec<Link>)>,
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
            waiting: HashMap::new(),
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

    pub fn block_size(&self) -> usize {
        self.block_size
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
    /// request of `prompt`, reusing cached leading blocks. Nothing is taken when it is not
    /// granted: not enough blocks free or evictable, or its next block in flight.
    pub fn allocate(
        &mut self,
        id: &RequestId,
        tokens: usize,
        prompt: &Arc<[u32]>,
    ) -> Result<Grant, NotGranted> {
        if self.owned.contains_key(id) {
            return Err(NotGranted::Duplicate);
        }
        let (links, was_waiting) = self.links_of(id, prompt);
        let hit = match self.cache.as_ref().map(|c| c.lookup(prompt, &links)) {
            Some(Lookup::InFlight) => {
                self.waiting.insert(id.clone(), (prompt.clone(), links));
                return Err(NotGranted::InFlight);
            }
            Some(Lookup::Hit(hit)) => hit,
            None => PrefixHit::default(),
        };
        let slot_missing = self.total_slots > 0 && self.free_slots.is_empty();
        let need = self.blocks_for(tokens).saturating_sub(hit.blocks.len());
        if slot_missing || !self.make_free(need, &hit.hashes) {
            if was_waiting {
                self.waiting.insert(id.clone(), (prompt.clone(), links));
            }
            return Err(NotGranted::NoRoom);
        }
        let done = hit.blocks.len();
        if let Some(c) = self.cache.as_mut() {
            c.take_hit(&hit, was_waiting);
            c.expect(&links[done..]);
        }
        let fresh = self.free.split_off(self.free.len() - need);
        let grant = Grant {
            blocks: (hit.blocks.iter().copied())
                .chain(fresh.into_iter().rev())
                .collect(),
            state_slot: self.free_slots.pop(),
            cached_tokens: done * self.block_size,
            prefix_rows: hit.rows,
            restore_from: hit.state,
            snapshots: self.take_snapshot_slots(prompt, done),
        };
        let owned = Owned {
            grant: grant.clone(),
            prompt: prompt.clone(),
            links,
            done,
            in_cache: (0..done).collect(),
            refs: hit.hashes,
        };
        self.owned.insert(id.clone(), owned);
        Ok(grant)
    }

    /// The hash chain of `prompt` (empty without prefix reuse), kept from the last time if
    /// `id` was told to wait, and whether it was.
    fn links_of(&mut self, id: &RequestId, prompt: &Arc<[u32]>) -> (Vec<Link>, bool) {
        let waited = self.waiting.remove(id);
        let was_waiting = waited.is_some();
        let links = match (&self.cache, waited) {
            (None, _) => Vec::new(),
            (Some(_), Some((p, links))) if Arc::ptr_eq(&p, prompt) => links,
            (Some(_), _) => chain(prompt, self.block_size),
        };
        (links, was_waiting)
    }

    /// Blocks for each candidate, in order, stopping at the first that does not fit (so a
    /// large request is not starved by smaller ones behind it). A candidate whose next block
    /// is in flight is skipped: it waits for that block, needing no room, and later
    /// candidates may go first.
    pub fn reserve(&mut self, candidates: &[Candidate]) -> Vec<(RequestId, Grant)> {
        // Waiting marks of requests no longer candidates (aborted while waiting) go.
        let ids: HashSet<&RequestId> = candidates.iter().map(|c| &c.id).collect();
        self.waiting.retain(|id, _| ids.contains(id));
        let mut granted = Vec::new();
        for c in candidates {
            match self.allocate(&c.id, c.tokens, &c.prompt) {
                Ok(grant) => granted.push((c.id.clone(), grant)),
                Err(NotGranted::InFlight) => continue,
                Err(NotGranted::NoRoom | NotGranted::Duplicate) => break,
            }
        }
        granted
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
                None => match cache.evict_state() {
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

    /// Gives back what the cache evicted.
    fn take_back(&mut self, e: Evicted) {
        self.free.extend(e.blocks.into_iter().rev());
        self.free_snapshots.extend(e.states);
    }

    /// Evicts unused cached blocks until `need` are free; false if they cannot be (then
    /// nothing is evicted). `hit`: entries about to be used, not evictable.
    fn make_free(&mut self, need: usize, hit: &[BlockHash]) -> bool {
        if need <= self.free.len() {
            return true;
        }
        let Some(cache) = self.cache.as_mut() else {
            return false;
        };
        // Referenced for the count so that the hit's own blocks are not counted (or evicted).
        cache.pin(hit);
        let enough = need <= self.free.len() + cache.evictable_blocks();
        while enough && self.free.len() < need {
            let f = cache.evict_block().expect("counted as evictable");
            self.free.extend(f.block);
            self.free_snapshots.extend(f.state);
        }
        cache.unref(hit);
        enough
    }

    /// The request computed the next blocks of its prompt (from its `first` uncached one),
    /// their captured rows `rows` (one entry per block): each is published for reuse, with
    /// the snapshot taken at its end (hybrid). Blocks out of order are ignored.
    pub fn computed(&mut self, id: &RequestId, first: usize, rows: Vec<Arc<[u8]>>) {
        let (Some(cache), Some(o)) = (self.cache.as_mut(), self.owned.get_mut(id)) else {
            return;
        };
        if first != o.done || first + rows.len() > o.links.len() {
            tracing::warn!(%id, first, done = o.done, "computed blocks out of order, not cached");
            return;
        }
        let bs = self.block_size;
        let mut evicted = Evicted::default();
        let mut unused_states = Vec::new();
        for (k, rows) in (first..).zip(rows) {
            let link = o.links[k];
            cache.settle(&[link]);
            let end = (k + 1) * bs;
            // Snapshots are ascending by position.
            let snaps = &o.grant.snapshots;
            let state = (snaps.binary_search_by_key(&end, |s| s.0).ok()).map(|i| snaps[i].1);
            let block = o.grant.blocks[k];
            let tokens = &o.prompt[k * bs..end];
            let p = cache.publish(Computed {
                link,
                tokens,
                block,
                rows,
                state,
            });
            o.done = k + 1;
            if p.took_block {
                o.in_cache.insert(k);
            }
            o.refs.extend(p.referenced);
            unused_states.extend(state.filter(|_| !p.took_state));
            evicted.blocks.extend(p.evicted.blocks);
            evicted.states.extend(p.evicted.states);
        }
        self.free_snapshots.extend(unused_states);
        self.take_back(evicted);
    }

    /// Returns the request's blocks and slots; freeing twice is a no-op. Blocks published for
    /// reuse stay in the cache (no longer used by it). Returns how many blocks it held.
    pub fn free(&mut self, id: &RequestId) -> usize {
        let Some(o) = self.owned.remove(id) else {
            return 0;
        };
        let n = o.grant.blocks.len();
        self.free_slots.extend(o.grant.state_slot);
        if let Some(cache) = self.cache.as_mut() {
            cache.release(&o.refs);
            cache.settle(&o.links[o.done..]);
        }
        let own = (o.grant.blocks.iter().enumerate())
            .filter(|(k, _)| !o.in_cache.contains(k))
            .map(|(_, &b)| b);
        self.free.extend(own.rev());
        // Snapshots at boundaries past the computed blocks were never published.
        let done_end = o.done * self.block_size;
        let unused = (o.grant.snapshots.iter()).filter(|s| s.0 > done_end);
        self.free_snapshots.extend(unused.map(|s| s.1));
        n
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
        assert_eq!(p.free(&id("a")), 3);
        assert_eq!(p.stats().free, 10);
    }

    #[test]
    fn exhaustion_takes_nothing() {
        let mut p = BlockPool::new(4, 4, 0);
        assert!(p.allocate(&id("a"), 12, &prompt(12)).is_ok());
        assert!(p.allocate(&id("b"), 8, &prompt(8)).is_err());
        assert_eq!(p.stats().free, 1);
        assert!(p.allocate(&id("c"), 4, &prompt(4)).is_ok());
        assert_eq!(p.stats().free, 0);
    }

    #[test]
    fn double_free_and_double_allocate_are_harmless() {
        let mut p = BlockPool::new(4, 4, 0);
        p.allocate(&id("a"), 4, &prompt(4)).unwrap();
        assert!(p.allocate(&id("a"), 4, &prompt(4)).is_err());
        assert_eq!(p.free(&id("a")), 1);
        assert_eq!(p.free(&id("a")), 0);
        assert_eq!(p.stats().free, 4);
    }

    #[test]
    fn freed_blocks_are_reused_without_duplicates() {
        let mut p = BlockPool::new(6, 2, 0);
        let a = p.allocate(&id("a"), 4, &prompt(4)).unwrap();
        let b = p.allocate(&id("b"), 4, &prompt(4)).unwrap();
        p.free(&id("a"));
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
        assert!(p.allocate(&id("c"), 4, &prompt(4)).is_err());
        assert_eq!(p.stats().free, 98);
        p.free(&id("a"));
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
