//! Prefix reuse bookkeeping (DESIGN.md §2, BlockManager): full KV blocks keyed by a hash chain
//! over their tokens (as vLLM's prefix caching), each with the captured rows of its positions,
//! so that a request whose leading blocks were computed before starts after them and its file
//! still holds every row.
//!
//! A block is published the step it is computed: the model runner hands the block manager the
//! block's captured rows before the scheduler hears of the step, so an entry always has its KV
//! block and its rows together. The request that computed it keeps using it (a reference);
//! later requests, even ones running at the same time, reuse it. Blocks a running request will
//! compute are *in flight*: a request whose next block is in flight waits (is not admitted)
//! rather than compute it a second time, until the block is published, or its owner ends
//! without publishing it (failed or aborted): then it computes the block itself.
//!
//! Hybrid models (recurrent layers) also need the recurrent state at the hit's end: there a
//! block is reusable as the end of a hit only when it also holds a snapshot of the state after
//! its last position (a snapshot slot, written by the model runner when the request that
//! computed the block ended a chunk there). A hit is cut back to its last block with one.
//!
//! Bounded: entries no running request uses are evicted least recently used first, when the
//! pool needs a block or a snapshot slot, or the rows and snapshots would pass `max_bytes`.
//! Plain state, no channels.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

/// A block's place in a chain: the hash of every token up to its end.
pub type BlockHash = u64;

/// A block's link in a chain: its parent's hash (none for the first block) and its own.
pub type Link = (Option<BlockHash>, BlockHash);

#[derive(Debug)]
struct Entry {
    parent: Option<BlockHash>,
    tokens: Box<[u32]>,
    /// KV block holding these positions (owned by the cache).
    block: u32,
    /// The captured rows of these positions, `[block_size, K, H]` in the file dtype.
    rows: Arc<[u8]>,
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

/// What a lookup found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// Reuse these blocks (possibly none) and compute the rest.
    Hit(PrefixHit),
    /// The next block is being computed by a running request: wait for it.
    InFlight,
}

/// What an eviction gave back: the entry's KV block and snapshot slot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Freed {
    pub block: Option<u32>,
    pub state: Option<u32>,
}

/// KV blocks and snapshot slots the cache gave back (evicted): the caller frees them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Evicted {
    pub blocks: Vec<u32>,
    pub states: Vec<u32>,
}

impl Evicted {
    fn add(&mut self, f: Freed) {
        self.blocks.extend(f.block);
        self.states.extend(f.state);
    }
}

/// A block a running request computed, offered to the cache.
#[derive(Debug, Clone)]
pub struct Computed<'a> {
    pub link: Link,
    pub tokens: &'a [u32],
    pub block: u32,
    pub rows: Arc<[u8]>,
    /// Snapshot slot with the state after the block (hybrid), if the request has one there.
    pub state: Option<u32>,
}

/// What the cache did with a computed block.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Published {
    /// The cache took the KV block (the request no longer frees it).
    pub took_block: bool,
    /// The cache took the snapshot slot.
    pub took_state: bool,
    /// The entry of this hash the request now references (its own block or an equal one
    /// published before); `None` when nothing was kept.
    pub referenced: Option<BlockHash>,
    /// What was evicted to make room.
    pub evicted: Evicted,
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
    /// The part of `hit_tokens` served to requests that waited for in-flight blocks.
    pub waited_tokens: u64,
}

#[derive(Debug)]
pub struct PrefixCache {
    block_size: usize,
    max_bytes: usize,
    bytes: usize,
    /// Bytes of one recurrent-state snapshot; `None` for dense models (no state needed).
    state_bytes: Option<usize>,
    entries: HashMap<BlockHash, Entry>,
    /// Blocks running requests will compute and publish, with how many requests will.
    in_flight: HashMap<BlockHash, usize>,
    tick: u64,
    hit_tokens: u64,
    waited_tokens: u64,
}

/// The hash chain of the full blocks of `tokens`.
pub fn chain(tokens: &[u32], block_size: usize) -> Vec<Link> {
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
            in_flight: HashMap::new(),
            tick: 0,
            hit_tokens: 0,
            waited_tokens: 0,
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
        PrefixStats {
            cached_blocks: self.entries.len(),
            bytes: self.bytes,
            snapshots: self.entries.values().filter(|e| e.state.is_some()).count(),
            hit_tokens: self.hit_tokens,
            waited_tokens: self.waited_tokens,
        }
    }

    fn touch(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    fn entry_matches(&self, (parent, hash): Link, tokens: &[u32]) -> bool {
        self.entries
            .get(&hash)
            .is_some_and(|e| e.parent == parent && *e.tokens == *tokens)
    }

    /// The leading reusable blocks of `prompt` (whose chain is `links`), leaving at least its
    /// last token to compute (its logits are sampled); or [`Lookup::InFlight`] when the block
    /// after them is one a running request is computing. Takes nothing: see
    /// [`Self::take_hit`].
    pub fn lookup(&self, prompt: &[u32], links: &[Link]) -> Lookup {
        let usable = prompt.len().saturating_sub(1) / self.block_size;
        let mut hit = PrefixHit::default();
        let mut last_state = 0;
        for (i, &link) in links.iter().enumerate().take(usable) {
            let tokens = &prompt[i * self.block_size..(i + 1) * self.block_size];
            if !self.entry_matches(link, tokens) {
                if self.in_flight.contains_key(&link.1) {
                    return Lookup::InFlight;
                }
                break;
            }
            let e = &self.entries[&link.1];
            hit.hashes.push(link.1);
            hit.blocks.push(e.block);
            hit.rows.push(e.rows.clone());
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
        Lookup::Hit(hit)
    }

    /// A granted request uses the blocks of `hit` until [`Self::unref`]; `waited`: it had
    /// waited for some of them (metrics).
    pub fn take_hit(&mut self, hit: &PrefixHit, waited: bool) {
        self.pin(&hit.hashes);
        self.touch_chain(&hit.hashes);
        let tokens = (hit.hashes.len() * self.block_size) as u64;
        self.hit_tokens += tokens;
        if waited {
            self.waited_tokens += tokens;
        }
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

    /// Keeps these blocks from eviction until [`Self::unref`].
    pub fn pin(&mut self, hashes: &[BlockHash]) {
        for h in hashes {
            if let Some(e) = self.entries.get_mut(h) {
                e.refs += 1;
            }
        }
    }

    /// A request that used these blocks (in chain order) ended: they are unused by it and
    /// recently used, its first block last (chains are evicted from their tails).
    pub fn release(&mut self, hashes: &[BlockHash]) {
        self.unref(hashes);
        self.touch_chain(hashes);
    }

    /// A running request no longer uses these blocks.
    pub fn unref(&mut self, hashes: &[BlockHash]) {
        for h in hashes {
            if let Some(e) = self.entries.get_mut(h) {
                e.refs = e.refs.saturating_sub(1);
            }
        }
    }

    /// A running request will compute and publish these blocks.
    pub fn expect(&mut self, links: &[Link]) {
        for l in links {
            *self.in_flight.entry(l.1).or_default() += 1;
        }
    }

    /// A running request computed these blocks, or will not (it ended).
    pub fn settle(&mut self, links: &[Link]) {
        for l in links {
            if let Some(n) = self.in_flight.get_mut(&l.1) {
                *n -= 1;
                if *n == 0 {
                    self.in_flight.remove(&l.1);
                }
            }
        }
    }

    /// Offers a block a running request has just computed (after settling it). A new hash is
    /// kept with the request's KV block and rows (and snapshot) if its parent is kept and the
    /// bytes fit, evicting unused entries; an equal entry published before is referenced
    /// instead (the request keeps its own block) and takes the snapshot if it has none.
    pub fn publish(&mut self, c: Computed<'_>) -> Published {
        let (parent, hash) = c.link;
        let mut out = Published::default();
        let parent_kept = parent.is_none_or(|p| self.entries.contains_key(&p));
        if self.entry_matches(c.link, c.tokens) {
            out.referenced = Some(hash);
        } else if !self.entries.contains_key(&hash)
            && parent_kept
            && self.make_room(c.rows.len(), &mut out.evicted)
        {
            self.bytes += c.rows.len();
            let entry = Entry {
                parent,
                tokens: c.tokens.into(),
                block: c.block,
                rows: c.rows,
                state: None,
                refs: 0,
                last_used: 0,
            };
            self.entries.insert(hash, entry);
            out.took_block = true;
            out.referenced = Some(hash);
        }
        let Some(hash) = out.referenced else {
            return out;
        };
        let t = self.touch();
        let e = self.entries.get_mut(&hash).expect("referenced");
        e.refs += 1;
        e.last_used = t;
        if let Some(slot) = c.state {
            out.took_state = self.keep_state(hash, slot, &mut out.evicted);
        }
        out
    }

    /// Attaches snapshot `slot` to the entry of `hash` if it has none, within the byte bound
    /// (evicting unused entries into `evicted`); false if not taken.
    fn keep_state(&mut self, hash: BlockHash, slot: u32, evicted: &mut Evicted) -> bool {
        let Some(per) = self.state_bytes else {
            return false;
        };
        let wanted = self.entries.get(&hash).is_some_and(|e| e.state.is_none());
        if !wanted || !self.make_room(per, evicted) {
            return false;
        }
        self.bytes += per;
        self.entries.get_mut(&hash).expect("checked above").state = Some(slot);
        true
    }

    /// Evicts unused entries until `bytes` more fit under `max_bytes`, adding what they held
    /// to `evicted`; false if they cannot.
    fn make_room(&mut self, bytes: usize, evicted: &mut Evicted) -> bool {
        while self.bytes + bytes > self.max_bytes {
            match self.evict_lru(|_| true) {
                Some(f) => evicted.add(f),
                None => return false,
            }
        }
        true
    }

    /// Evicts the least recently used entry no running request uses, among those `wanted`;
    /// returns what it held, or `None` when nothing can be evicted. A linear scan: entries
    /// are at most the pool's blocks.
    fn evict_lru(&mut self, wanted: impl Fn(&Entry) -> bool) -> Option<Freed> {
        let (&hash, _) = self
            .entries
            .iter()
            .filter(|(_, e)| e.refs == 0 && wanted(e))
            .min_by_key(|(_, e)| e.last_used)?;
        let e = self.entries.remove(&hash)?;
        self.bytes -= e.rows.len();
        if e.state.is_some() {
            self.bytes -= self.state_bytes.unwrap_or(0);
        }
        Some(Freed {
            block: Some(e.block),
            state: e.state,
        })
    }

    /// Blocks held by entries no running request uses (what [`Self::evict_block`] can free).
    pub fn evictable_blocks(&self) -> usize {
        self.entries.values().filter(|e| e.refs == 0).count()
    }

    /// Frees one KV block for the pool: evicts the least recently used unused entry (and its
    /// snapshot, if any).
    pub fn evict_block(&mut self) -> Option<Freed> {
        self.evict_lru(|_| true)
    }

    /// Frees one snapshot slot for the pool: evicts the least recently used unused entry
    /// holding one (and its KV block).
    pub fn evict_state(&mut self) -> Option<Freed> {
        self.evict_lru(|e| e.state.is_some())
    }
}

#[cfg(test)]
#[path = "prefix_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "prefix_hybrid_tests.rs"]
mod hybrid_tests;
