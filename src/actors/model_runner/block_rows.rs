//! Prefix reuse (DESIGN.md §2): the captured rows of each request's full prompt blocks, cut
//! from its chunks as they are computed, for the block manager to publish the blocks the step
//! they are complete. A chunk may end inside a block: its rows wait here (at most one block
//! per request) for the chunk that completes it. Plain state, no channels.

use std::collections::HashMap;
use std::sync::Arc;

use crate::actors::block_manager::ComputedBlocks;
use crate::actors::messages::{CapturedChunk, RequestId};

#[derive(Debug)]
struct Partial {
    /// End of the prompt's last full block: rows past it are not cut.
    limit: usize,
    /// The next row expected (rows `..next` were seen).
    next: usize,
    /// Rows of the block being filled, from its first position.
    rows: Vec<u8>,
}

#[derive(Debug)]
pub struct BlockRows {
    block_size: usize,
    row_bytes: usize,
    requests: HashMap<RequestId, Partial>,
}

impl BlockRows {
    pub fn new(block_size: usize, row_bytes: usize) -> Self {
        assert!(block_size > 0, "block_size must be positive");
        Self {
            block_size,
            row_bytes,
            requests: HashMap::new(),
        }
    }

    /// A new request of `prompt_len` tokens whose first `cached` (block-aligned) are cached.
    pub fn start(&mut self, id: &RequestId, prompt_len: usize, cached: usize) {
        let limit = prompt_len / self.block_size * self.block_size;
        if cached < limit && cached.is_multiple_of(self.block_size) {
            let p = Partial {
                limit,
                next: cached,
                rows: Vec::new(),
            };
            self.requests.insert(id.clone(), p);
        }
    }

    pub fn forget(&mut self, id: &RequestId) {
        self.requests.remove(id);
    }

    /// The full prompt blocks these chunks complete, with their rows. A chunk that does not
    /// continue its request's rows (one was refused) ends the cutting for that request.
    pub fn cut(&mut self, chunks: &[CapturedChunk]) -> Vec<ComputedBlocks> {
        let mut out = Vec::new();
        for c in chunks {
            let Some(p) = self.requests.get_mut(&c.id) else {
                continue;
            };
            if c.start != p.next || c.data.len() != c.rows * self.row_bytes {
                self.requests.remove(&c.id);
                continue;
            }
            let block_bytes = self.block_size * self.row_bytes;
            let first = (p.next - p.rows.len() / self.row_bytes) / self.block_size;
            let take = c.rows.min(p.limit - p.next);
            p.next += take;
            let rows = split_blocks(&mut p.rows, &c.data[..take * self.row_bytes], block_bytes);
            if p.next >= p.limit {
                self.requests.remove(&c.id);
            }
            if !rows.is_empty() {
                let id = c.id.clone();
                out.push(ComputedBlocks { id, first, rows });
            }
        }
        out
    }
}

/// Appends `data` to the partial block `partial`, returning the blocks of `block_bytes` it
/// completes; what is left of a block stays in `partial`.
fn split_blocks(partial: &mut Vec<u8>, mut data: &[u8], block_bytes: usize) -> Vec<Arc<[u8]>> {
    let mut blocks = Vec::new();
    while !data.is_empty() {
        if partial.is_empty() && data.len() >= block_bytes {
            blocks.push(Arc::from(&data[..block_bytes]));
            data = &data[block_bytes..];
            continue;
        }
        let n = (block_bytes - partial.len()).min(data.len());
        partial.extend_from_slice(&data[..n]);
        data = &data[n..];
        if partial.len() == block_bytes {
            blocks.push(Arc::from(&partial[..]));
            partial.clear();
        }
    }
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> RequestId {
        RequestId::new(s).unwrap()
    }

    /// Rows of 2 bytes, row `t` = `[t, t]`.
    fn chunk(name: &str, start: usize, rows: usize) -> CapturedChunk {
        CapturedChunk {
            id: id(name),
            start,
            rows,
            data: (start..start + rows)
                .flat_map(|t| [t as u8; 2])
                .collect::<Vec<u8>>()
                .into(),
        }
    }

    fn rows(from: usize, to: usize) -> Vec<u8> {
        (from..to).flat_map(|t| [t as u8; 2]).collect()
    }

    #[test]
    fn blocks_straddling_chunks_are_cut_once_complete() {
        let mut b = BlockRows::new(4, 2);
        // 11 prompt tokens: 2 full blocks; nothing past row 8 is cut.
        b.start(&id("a"), 11, 0);
        assert!(b.cut(&[chunk("a", 0, 3)]).is_empty());
        let out = b.cut(&[chunk("a", 3, 6)]);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].first, 0);
        assert_eq!(out[0].rows.len(), 2);
        assert_eq!(*out[0].rows[0], *rows(0, 4));
        assert_eq!(*out[0].rows[1], *rows(4, 8));
        assert!(b.cut(&[chunk("a", 9, 2)]).is_empty());
    }

    #[test]
    fn cached_start_numbers_blocks_from_there_and_gaps_stop_cutting() {
        let mut b = BlockRows::new(4, 2);
        b.start(&id("a"), 16, 8);
        let out = b.cut(&[chunk("a", 8, 4)]);
        assert_eq!((out[0].first, out[0].rows.len()), (2, 1));
        assert!(b.cut(&[chunk("a", 13, 3)]).is_empty(), "a gap: not cut");
        assert!(
            b.cut(&[chunk("a", 12, 4)]).is_empty(),
            "forgotten after a gap"
        );
        // A prompt without full blocks past its cached ones is not followed at all.
        b.start(&id("c"), 7, 4);
        assert!(b.cut(&[chunk("c", 4, 3)]).is_empty());
        assert!(b.requests.is_empty());
    }
}
