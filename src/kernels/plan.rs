//! Device-neutral planning of one forward: the checked per-token plan of a packed batch
//! (positions, KV cache slots, sampled rows, tiles) and the chunks' recurrent-state slots.
//! Built on the host before anything is written; every device reads the same plan.

use std::collections::HashSet;
use std::ops::Range;

use super::{BackendError, Batch};

/// Slot of position `pos` under `table`.
#[inline]
pub fn slot_of(table: &[u32], block_size: usize, pos: usize) -> usize {
    table[pos / block_size] as usize * block_size + pos % block_size
}

/// Checked per-token view of a batch.
pub struct BatchPlan<'a> {
    /// Absolute position of each token.
    pub positions: Vec<usize>,
    /// Index into `tables` (the seq chunk) of each token.
    pub seq_of: Vec<usize>,
    /// Cache slot each token's K/V goes to.
    pub slots: Vec<usize>,
    /// Block table of each seq chunk.
    pub tables: Vec<&'a [u32]>,
    /// Index of the last token of each chunk that asked for a sample.
    pub sample_rows: Vec<(usize, usize)>,
    pub block_size: usize,
}

/// Limits a batch must respect.
pub struct PlanLimits {
    pub vocab: usize,
    pub max_positions: usize,
    pub num_blocks: usize,
    pub block_size: usize,
}

impl<'a> BatchPlan<'a> {
    /// Validates the whole batch (token ids, lengths, positions, block tables, slot clashes)
    /// and builds the per-token plan. Nothing is touched on error.
    pub fn new(batch: &Batch<'a>, lim: &PlanLimits) -> Result<Self, BackendError> {
        let invalid = |m: String| Err(BackendError::InvalidBatch(m));
        if let Some(&token) = batch.token_ids.iter().find(|&&t| t as usize >= lim.vocab) {
            return Err(BackendError::TokenOutOfRange {
                token,
                vocab: lim.vocab,
            });
        }
        let total: usize = batch.seqs.iter().map(|s| s.len).sum();
        if total != batch.token_ids.len() {
            return invalid(format!(
                "chunk lengths sum to {total} but the batch has {} tokens",
                batch.token_ids.len()
            ));
        }
        let mut plan = BatchPlan {
            positions: Vec::with_capacity(total),
            seq_of: Vec::with_capacity(total),
            slots: Vec::with_capacity(total),
            tables: Vec::with_capacity(batch.seqs.len()),
            sample_rows: Vec::new(),
            block_size: lim.block_size,
        };
        for (i, seq) in batch.seqs.iter().enumerate() {
            check_chunk(i, seq, lim)?;
            let table = &seq.block_table[..];
            for pos in seq.start..seq.start + seq.len {
                plan.positions.push(pos);
                plan.seq_of.push(i);
                plan.slots.push(slot_of(table, lim.block_size, pos));
            }
            if seq.sample {
                plan.sample_rows.push((i, plan.positions.len() - 1));
            }
            plan.tables.push(table);
        }
        let mut seen = HashSet::with_capacity(total);
        if let Some(&slot) = plan.slots.iter().find(|&&s| !seen.insert(s)) {
            return invalid(format!(
                "two tokens of the batch write the same cache slot {slot}"
            ));
        }
        Ok(plan)
    }

    pub fn num_tokens(&self) -> usize {
        self.positions.len()
    }

    /// One entry per seq chunk: the greedy token of each chunk that asked for a sample
    /// (`tokens` in `sample_rows` order), else `None`.
    pub fn sampled(&self, tokens: Vec<u32>, num_seqs: usize) -> Vec<Option<u32>> {
        let mut sampled = vec![None; num_seqs];
        for (&(seq, _), tok) in self.sample_rows.iter().zip(tokens) {
            sampled[seq] = Some(tok);
        }
        sampled
    }

    /// Runs of consecutive positions of one chunk, cut into tiles of at most `tile` tokens:
    /// `(first token, end)` of each, in token order.
    pub fn tiles(&self, tile: usize) -> Vec<(usize, usize)> {
        let t = self.num_tokens();
        let mut out = Vec::with_capacity(t.div_ceil(tile));
        let mut start = 0;
        while start < t {
            let mut end = start + 1;
            while end < t
                && end - start < tile
                && self.seq_of[end] == self.seq_of[start]
                && self.positions[end] == self.positions[end - 1] + 1
            {
                end += 1;
            }
            out.push((start, end));
            start = end;
        }
        out
    }
}

impl PlanLimits {
    /// The limits of a model (vocabulary, positions) on a cache of `num_blocks` blocks of `block_size` positions.
    pub fn new(vocab: usize, max_positions: usize, num_blocks: usize, block_size: usize) -> Self {
        Self {
            vocab,
            max_positions,
            num_blocks,
            block_size,
        }
    }
}

fn check_chunk(
    i: usize,
    seq: &crate::kernels::SeqChunk,
    lim: &PlanLimits,
) -> Result<(), BackendError> {
    let invalid = |m: String| Err(BackendError::InvalidBatch(format!("seq chunk {i}: {m}")));
    if seq.len == 0 {
        return invalid("empty chunk".into());
    }
    let end = match seq.start.checked_add(seq.len) {
        Some(e) if e <= lim.max_positions => e,
        _ => {
            return invalid(format!(
                "positions {}..{}+{} exceed max_position_embeddings {}",
                seq.start, seq.start, seq.len, lim.max_positions
            ));
        }
    };
    let needed = end.div_ceil(lim.block_size);
    if seq.block_table.len() < needed {
        return invalid(format!(
            "block table has {} blocks, positions 0..{end} need {needed} (block size {})",
            seq.block_table.len(),
            lim.block_size
        ));
    }
    if let Some(&b) = seq.block_table[..needed]
        .iter()
        .find(|&&b| b as usize >= lim.num_blocks)
    {
        return invalid(format!("block id {b} >= num_blocks {}", lim.num_blocks));
    }
    Ok(())
}

/// Positions per block of the chunked recurrences (CUDA's chunked.cu / chunked_mma.cu): a
/// block is cut at absolute positions that are multiples of this, so the scheduler ends a
/// hybrid request's budget-cut prefill chunks at such a multiple when it can (DESIGN.md,
/// "Byte-identical results" (c)); a request split elsewhere gives two partial blocks.
pub const RECURRENT_BLOCK: usize = 64;

/// One request's rows in a packed batch, and its state slot.
#[derive(Debug, Clone)]
pub struct SeqState {
    pub rows: Range<usize>,
    pub slot: usize,
    /// Absolute position of the chunk's first token.
    pub start: usize,
}

impl SeqState {
    /// The chunk starts at position 0: the slot's state is zeroed before use.
    pub fn fresh(&self) -> bool {
        self.start == 0
    }
}

/// Validates the state slots of a batch (every chunk has one, in range, no two chunks share
/// one) and lists each chunk's rows.
pub fn seq_states(batch: &Batch<'_>, num_slots: usize) -> Result<Vec<SeqState>, BackendError> {
    let mut used = vec![false; num_slots];
    let mut row = 0;
    let mut out = Vec::with_capacity(batch.seqs.len());
    for (i, seq) in batch.seqs.iter().enumerate() {
        let invalid = |m: String| BackendError::InvalidBatch(format!("seq chunk {i}: {m}"));
        let slot = seq
            .state_slot
            .ok_or_else(|| invalid("no recurrent-state slot (hybrid model)".into()))?
            as usize;
        if slot >= num_slots {
            return Err(invalid(format!(
                "state slot {slot} >= number of slots {num_slots}"
            )));
        }
        if std::mem::replace(&mut used[slot], true) {
            return Err(invalid(format!(
                "state slot {slot} is used by two chunks of the batch"
            )));
        }
        out.push(SeqState {
            rows: row..row + seq.len,
            slot,
            start: seq.start,
        });
        row += seq.len;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seq_states_rejects_shared_or_missing_slots() {
        use crate::kernels::SeqChunk;
        let c = |slot| SeqChunk {
            context: Vec::new(),
            start: 0,
            len: 1,
            block_table: vec![0],
            sample: false,
            state_slot: slot,
        };
        let seqs = [c(Some(1)), c(Some(1))];
        let b = Batch {
            token_ids: &[1, 2],
            seqs: &seqs,
        };
        assert!(seq_states(&b, 4).is_err());
        let seqs = [c(None)];
        let b = Batch {
            token_ids: &[1],
            seqs: &seqs,
        };
        assert!(seq_states(&b, 4).is_err());
        let seqs = [c(Some(4))];
        let b = Batch {
            token_ids: &[1],
            seqs: &seqs,
        };
        assert!(seq_states(&b, 4).is_err());
    }
}
