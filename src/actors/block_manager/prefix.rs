//! Prefix reuse bookkeeping (DESIGN.md §2, BlockManager): full KV blocks keyed by a hash chain
//! over their tokens (as vLLM's prefix caching), each with the captured rows of its positions,
//! so that a request whose leading blocks were computed before starts after them and its file
//! still holds every row. A block is reusable only when it has both its KV block and its rows;
//! the two arrive separately (the scheduler releases a finished request's blocks, the connector
//! sends its rows) and in either order.
//!
//! Bounded: entries not used by a running request are evicted least recently used first, when
//! the pool needs a block or the rows would pass `max_bytes`. Plain state, no channels.

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
}

/// Counters for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Blocks with a KV block and rows (reusable).
    pub cached_blocks: usize,
    /// Bytes of captured rows held.
    pub bytes: usize,
    /// Prompt tokens served from the cache so far.
    pub hit_tokens: u64,
}

#[derive(Debug)]
pub struct PrefixCache {
    block_size: usize,
    max_bytes: usize,
    bytes: usize,
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
            entries: HashMap::new(),
            tick: 0,
            hit_tokens: 0,
        }
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
            refs: 0,
            last_used: t,
        });
        e.last_used = t;
        e
    }

    /// Offers the KV blocks of a finished request: block `i` of `blocks` holds positions
    /// `i * block_size..` of `tokens`; the first `shared` came from the cache (the caller
    /// unrefs them) and are not offered again. Returns the blocks the cache did not take
    /// (partial blocks, blocks already cached under the same hash, hash collisions): the
    /// caller frees them.
    pub fn offer_blocks(&mut self, tokens: &[u32], blocks: &[u32], shared: usize) -> Vec<u32> {
        let full = (tokens.len() / self.block_size).min(blocks.len());
        let mut rejected: Vec<u32> = blocks[full.max(shared).min(blocks.len())..].to_vec();
        let links = chain(&tokens[..full * self.block_size], self.block_size);
        let blocks_tokens = tokens[..full * self.block_size].chunks_exact(self.block_size);
        // Tail first: the first block ends most recently used, so chains are evicted from
        // their tails.
        let offered = links
            .into_iter()
            .zip(blocks_tokens)
            .zip(&blocks[..full])
            .skip(shared);
        for (((parent, hash), block_tokens), &block) in offered.rev() {
            let clash =
                self.entries.contains_key(&hash) && !self.entry_matches(parent, hash, block_tokens);
            let e = self.entry(parent, hash, block_tokens);
            if clash || e.block.is_some() {
                rejected.push(block);
            } else {
                e.block = Some(block);
            }
        }
        rejected
    }

    /// Offers the captured rows of `tokens` (`row_bytes` per token, the concatenation of
    /// `rows`; only full blocks are kept).
    /// Rows past `max_bytes` evict unused entries, least recently used first; the KV blocks of
    /// evicted entries are returned for the caller to free.
    pub fn offer_rows(&mut self, tokens: &[u32], rows: &[Vec<u8>], row_bytes: usize) -> Vec<u32> {
        let per_block = self.block_size * row_bytes;
        let mut freed = Vec::new();
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
            while self.bytes + per_block > self.max_bytes {
                match self.evict_lru(&own, false) {
                    Some(block) => freed.extend(block),
                    None => break,
                }
            }
            if self.bytes + per_block > self.max_bytes {
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

    /// Evicts the least recently used entry no running request uses (none of `keep`; with
    /// `with_block`, only one holding a KV block); returns `Some(its KV block, if any)`, or
    /// `None` when nothing can be evicted. A linear scan: entries are at most the pool's
    /// blocks plus the rows the byte bound admits.
    fn evict_lru(&mut self, keep: &HashSet<BlockHash>, with_block: bool) -> Option<Option<u32>> {
        let (&hash, _) = self
            .entries
            .iter()
            .filter(|(h, e)| e.refs == 0 && !keep.contains(h) && (!with_block || e.block.is_some()))
            .min_by_key(|(_, e)| e.last_used)?;
        let e = self.entries.remove(&hash)?;
        self.bytes -= e.rows.as_ref().map_or(0, |r| r.len());
        Some(e.block)
    }

    /// Blocks held by entries no running request uses (what [`Self::evict_block`] can free).
    pub fn evictable_blocks(&self) -> usize {
        self.entries
            .values()
            .filter(|e| e.refs == 0 && e.block.is_some())
            .count()
    }

    /// Frees one KV block for the pool: evicts the least recently used unused entry holding one.
    pub fn evict_block(&mut self) -> Option<u32> {
        self.evict_lru(&HashSet::new(), true).flatten()
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
