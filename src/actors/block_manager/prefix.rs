//! Prefix reuse bookkeeping (DESIGN.md §2, BlockManager): full KV blocks keyed by a hash chain
//! over their tokens (as vLLM's prefix caching), each with the captured rows of its positions,
//! so that a request whose leading blocks were computed before starts after them and its file
//! still holds every row. A block is reusable only when it has both its KV block and its rows;
//! the two arrive separately (the scheduler releases a finished request's blocks, the connector
//! sends its rows) and in either order.
//!
//! Hybrid models (recurrent layers) also need the recurrent state at the hit's end: there a
//! block is reusable as the end of a hit only when it also holds a snapshot of the state after
//! its last position (a snapshot slot, written by the model runner when the request that
//! computed the block ended a chunk there). A hit is cut back to its last block with one.
//!
//! Bounded: entries not used by a running request are evicted least recently used first, when
//! the pool needs a block or a snapshot slot, or the rows and snapshots would pass `max_bytes`.
//! Plain state, no channels.

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

/// A block's place in a chain: the hash of every token up to its end.
pub type BlockHash = u64;

#[derive(Debug)]
struct Entry {
    parent: Option<BlockHash>,
    tokens: Box<[u32]>,
    /// KV block holding these positions (owned by the cache while set).
    block: Option<u32>,
    /// The captured rows of these positions, `[block_size, K, H]` in the file dtype.
    rows: Option<Arc<[u8]>>,
    /// Snapshot slot holding the recurrent state after the block's last position (hybrid).
    state: Option<u32>,
    /// Running requests using the block: not evictable while > 0.
    refs: usize,
    last_used: u64,
}

/// A lookup's result: the leading full blocks found, their KV blocks and rows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefixHit {
    pub hashes: Vec<BlockHash>,
    pub blocks: Vec<u32>,
    pub rows: Vec<Arc<[u8]>>,
    /// Hybrid models: the snapshot slot with the state at the hit's end (`None` for dense
    /// models and for an empty hit).
    pub state: Option<u32>,
}

/// What an eviction gave back: the entry's KV block and snapshot slot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Freed {
    pub block: Option<u32>,
    pub state: Option<u32>,
}

/// What the cache did not take of a finished request's blocks and snapshots: the caller frees
/// them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rejected {
    pub blocks: Vec<u32>,
    pub states: Vec<u32>,
}

/// Counters for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Blocks with a KV block and rows (reusable).
    pub cached_blocks: usize,
    /// Bytes of captured rows and recurrent-state snapshots held.
    pub bytes: usize,
    /// Recurrent-state snapshots held (hybrid models).
    pub snapshots: usize,
    /// Prompt tokens served from the cache so far.
    pub hit_tokens: u64,
}

#[derive(Debug)]
pub struct PrefixCache {
    block_size: usize,
    max_bytes: usize,
    bytes: usize,
    /// Bytes of one recurrent-state snapshot; `None` for dense models (no state needed).
    state_bytes: Option<usize>,
    entries: HashMap<BlockHash, Entry>,
    tick: u64,
    hit_tokens: u64,
}

/// The hash chain of the full blocks of `tokens`.
pub fn chain(tokens: &[u32], block_size: usize) -> Vec<(Option<BlockHash>, BlockHash)> {
    let mut parent = None;
    tokens
        .chunks_exact(block_size)
        .map(|block| {
            let mut h = DefaultHasher::new();
            parent.hash(&mut h);
            block.hash(&mut h);
            let this = h.finish();
            let link = (parent, this);
            parent = Some(this);
            link
        })
        .collect()
}

impl PrefixCache {
    pub fn new(block_size: usize, max_bytes: usize) -> Self {
        Self {
            block_size,
            max_bytes,
            bytes: 0,
            state_bytes: None,
            entries: HashMap::new(),
            tick: 0,
            hit_tokens: 0,
        }
    }

    /// A cache for a hybrid model: a hit must end at a block with a recurrent-state snapshot
    /// of `state_bytes` (counted in `max_bytes`).
    pub fn with_states(mut self, state_bytes: usize) -> Self {
        self.state_bytes = Some(state_bytes);
        self
    }

    pub fn needs_states(&self) -> bool {
        self.state_bytes.is_some()
    }

    pub fn stats(&self) -> PrefixStats {
        let cached_blocks = self
            .entries
            .values()
            .filter(|e| e.block.is_some() && e.rows.is_some())
            .count();
        PrefixStats {
            cached_blocks,
            bytes: self.bytes,
            snapshots: self.entries.values().filter(|e| e.state.is_some()).count(),
            hit_tokens: self.hit_tokens,
        }
    }

    fn touch(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    fn entry_matches(&self, parent: Option<BlockHash>, hash: BlockHash, tokens: &[u32]) -> bool {
        self.entries
            .get(&hash)
            .is_some_and(|e| e.parent == parent && *e.tokens == *tokens)
    }

    /// The leading reusable blocks of `prompt`, leaving at least its last token to compute
    /// (its logits are sampled); each is referenced until [`Self::unref`].
    pub fn lookup(&mut self, prompt: &[u32]) -> PrefixHit {
        let usable = &prompt[..prompt.len().saturating_sub(1)];
        let mut hit = PrefixHit::default();
        let mut last_state = 0;
        for ((parent, hash), tokens) in chain(usable, self.block_size)
            .into_iter()
            .zip(usable.chunks_exact(self.block_size))
        {
            if !self.entry_matches(parent, hash, tokens) {
                break;
            }
            let e = &self.entries[&hash];
            let (Some(block), Some(rows)) = (e.block, e.rows.clone()) else {
                break;
            };
            hit.hashes.push(hash);
            hit.blocks.push(block);
            hit.rows.push(rows);
            if e.state.is_some() {
                hit.state = e.state;
                last_state = hit.hashes.len();
            }
        }
        if self.needs_states() {
            // The request resumes from the last snapshot: no later block is of use to it.
            hit.hashes.truncate(last_state);
            hit.blocks.truncate(last_state);
            hit.rows.truncate(last_state);
        } else {
            hit.state = None;
        }
        for h in &hit.hashes {
            self.entries.get_mut(h).expect("found above").refs += 1;
        }
        self.touch_chain(&hit.hashes);
        self.hit_tokens += (hit.hashes.len() * self.block_size) as u64;
        hit
    }

    /// Marks a chain used now, its first block last: chains are evicted from their tails.
    fn touch_chain(&mut self, hashes: &[BlockHash]) {
        for h in hashes.iter().rev() {
            let t = self.touch();
            if let Some(e) = self.entries.get_mut(h) {
                e.last_used = t;
            }
        }
    }

    /// A running request no longer uses these blocks.
    pub fn unref(&mut self, hashes: &[BlockHash]) {
        for h in hashes {
            if let Some(e) = self.entries.get_mut(h) {
                e.refs = e.refs.saturating_sub(1);
            }
        }
    }

    /// Undoes the hit count of a lookup whose request was not admitted.
    pub fn forget_hit(&mut self, hit: &PrefixHit) {
        self.unref(&hit.hashes);
        self.hit_tokens -= (hit.hashes.len() * self.block_size) as u64;
    }

    fn entry(&mut self, parent: Option<BlockHash>, hash: BlockHash, tokens: &[u32]) -> &mut Entry {
        let t = self.touch();
        let e = self.entries.entry(hash).or_insert_with(|| Entry {
            parent,
            tokens: tokens.into(),
            block: None,
            rows: None,
            state: None,
            refs: 0,
            last_used: t,
        });
        e.last_used = t;
        e
    }

    /// Offers the KV blocks of a finished request: block `i` of `blocks` holds positions
    /// `i * block_size..` of `tokens`; the first `shared` came from the cache (the caller
    /// unrefs them) and are not offered again. `states` are snapshot slots `(i, slot)` holding
    /// the recurrent state after block `i`. Returns what the cache did not take (partial
    /// blocks, blocks or snapshots already cached under the same hash, hash collisions,
    /// snapshots past the byte bound, all snapshots of a dense cache) and what it evicted to
    /// make room: the caller frees them.
    pub fn offer_blocks(
        &mut self,
        tokens: &[u32],
        blocks: &[u32],
        shared: usize,
        states: &[(usize, u32)],
    ) -> Rejected {
        let full = (tokens.len() / self.block_size).min(blocks.len());
        let mut out = Rejected {
            blocks: blocks[full.max(shared).min(blocks.len())..].to_vec(),
            states: Vec::new(),
        };
        let links = chain(&tokens[..full * self.block_size], self.block_size);
        let own: HashSet<BlockHash> = links.iter().map(|l| l.1).collect();
        let blocks_tokens = tokens[..full * self.block_size].chunks_exact(self.block_size);
        // Tail first: the first block ends most recently used, so chains are evicted from
        // their tails.
        let offered = links
            .iter()
            .zip(blocks_tokens)
            .zip(&blocks[..full])
            .enumerate()
            .skip(shared);
        for (_, ((&(parent, hash), block_tokens), &block)) in offered.rev() {
            let clash =
                self.entries.contains_key(&hash) && !self.entry_matches(parent, hash, block_tokens);
            let e = self.entry(parent, hash, block_tokens);
            if clash || e.block.is_some() {
                out.blocks.push(block);
            } else {
                e.block = Some(block);
            }
        }
        for &(i, slot) in states {
            let kept = links.get(i).is_some_and(|&(parent, hash)| {
                let block_tokens = &tokens[i * self.block_size..(i + 1) * self.block_size];
                self.keep_state(parent, hash, block_tokens, slot, &own, &mut out)
            });
            if !kept {
                out.states.push(slot);
            }
        }
        out
    }

    /// Attaches snapshot `slot` to the entry of `hash` if it has none, within the byte bound
    /// (evicting unused entries of other chains into `freed`); false if not taken.
    fn keep_state(
        &mut self,
        parent: Option<BlockHash>,
        hash: BlockHash,
        tokens: &[u32],
        slot: u32,
        own: &HashSet<BlockHash>,
        freed: &mut Rejected,
    ) -> bool {
        let Some(per) = self.state_bytes else {
            return false;
        };
        let wanted = self.entry_matches(parent, hash, tokens)
            && self.entries.get(&hash).is_some_and(|e| e.state.is_none());
        if !wanted || !self.make_room(per, own, freed) {
            return false;
        }
        self.bytes += per;
        self.entries.get_mut(&hash).expect("matched above").state = Some(slot);
        true
    }

    /// Evicts unused entries outside `keep` until `bytes` more fit under `max_bytes`, adding
    /// what they held to `freed`; false if they cannot.
    fn make_room(&mut self, bytes: usize, keep: &HashSet<BlockHash>, freed: &mut Rejected) -> bool {
        while self.bytes + bytes > self.max_bytes {
            match self.evict_lru(keep, |_| true) {
                Some(f) => {
                    freed.blocks.extend(f.block);
                    freed.states.extend(f.state);
                }
                None => return false,
            }
        }
        true
    }

    /// Offers the captured rows of `tokens` (`row_bytes` per token, the concatenation of
    /// `rows`; only full blocks are kept).
    /// Rows past `max_bytes` evict unused entries, least recently used first; the KV blocks and
    /// snapshot slots of evicted entries are returned for the caller to free.
    pub fn offer_rows(&mut self, tokens: &[u32], rows: &[Vec<u8>], row_bytes: usize) -> Rejected {
        let per_block = self.block_size * row_bytes;
        let mut freed = Rejected::default();
        let links = chain(tokens, self.block_size);
        let hashes: Vec<BlockHash> = links.iter().map(|l| l.1).collect();
        let own: HashSet<BlockHash> = hashes.iter().copied().collect();
        for (i, ((parent, hash), block_tokens)) in links
            .into_iter()
            .zip(tokens.chunks_exact(self.block_size))
            .enumerate()
        {
            if self.entries.contains_key(&hash) && !self.entry_matches(parent, hash, block_tokens) {
                continue;
            }
            if self.entries.get(&hash).is_some_and(|e| e.rows.is_some()) {
                self.entry(parent, hash, block_tokens);
                continue;
            }
            // Room is made from other chains only: evicting this chain's own head to keep its
            // tail would leave nothing reusable.
            if !self.make_room(per_block, &own, &mut freed) {
                break;
            }
            let Some(block_rows) = gather(rows, i * per_block, per_block) else {
                break;
            };
            self.bytes += per_block;
            self.entry(parent, hash, block_tokens).rows = Some(block_rows.into());
        }
        self.touch_chain(&hashes);
        freed
    }

    /// Evicts the least recently used entry no running request uses, none of `keep`, among
    /// those `wanted`; returns what it held, or `None` when nothing can be evicted. A linear
    /// scan: entries are at most the pool's blocks plus the rows the byte bound admits.
    fn evict_lru(
        &mut self,
        keep: &HashSet<BlockHash>,
        wanted: impl Fn(&Entry) -> bool,
    ) -> Option<Freed> {
        let (&hash, _) = self
            .entries
            .iter()
            .filter(|(h, e)| e.refs == 0 && !keep.contains(h) && wanted(e))
            .min_by_key(|(_, e)| e.last_used)?;
        let e = self.entries.remove(&hash)?;
        self.bytes -= e.rows.as_ref().map_or(0, |r| r.len());
        if e.state.is_some() {
            self.bytes -= self.state_bytes.unwrap_or(0);
        }
        Some(Freed {
            block: e.block,
            state: e.state,
        })
    }

    /// Blocks held by entries no running request uses (what [`Self::evict_block`] can free).
    pub fn evictable_blocks(&self) -> usize {
        self.entries
            .values()
            .filter(|e| e.refs == 0 && e.block.is_some())
            .count()
    }

    /// Frees one KV block for the pool: evicts the least recently used unused entry holding
    /// one (and its snapshot, if any).
    pub fn evict_block(&mut self) -> Option<Freed> {
        self.evict_lru(&HashSet::new(), |e| e.block.is_some())
    }

    /// Frees one snapshot slot for the pool: evicts the least recently used unused entry
    /// holding one (and its KV block), none of `keep`.
    pub fn evict_state(&mut self, keep: &HashSet<BlockHash>) -> Option<Freed> {
        self.evict_lru(keep, |e| e.state.is_some())
    }
}

/// Bytes `start..start + len` of the concatenation of `parts`; `None` past their end.
fn gather(parts: &[Vec<u8>], mut start: usize, len: usize) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(len);
    for p in parts {
        if start >= p.len() {
            start -= p.len();
            continue;
        }
        let take = (p.len() - start).min(len - out.len());
        out.extend_from_slice(&p[start..start + take]);
        start = 0;
        if out.len() == len {
            return Some(out);
        }
    }
    (len == 0).then_some(out)
}

#[cfg(test)]
#[path = "prefix_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "prefix_hybrid_tests.rs"]
mod hybrid_tests;
