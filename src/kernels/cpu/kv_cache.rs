//! Paged KV cache (per layer, `num_blocks × block_size` slots for K and for V) and the checked
//! per-token plan of a batch (positions, cache slots), built before anything is written.

use std::collections::HashSet;

use crate::kernels::{BackendError, Batch};

/// K and V of every layer: `[num_blocks * block_size, kv_dim]` each, f32.
pub struct KvCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    num_blocks: usize,
    block_size: usize,
    kv_dim: usize,
}

impl KvCache {
    /// Allocates (and zero-fills) the cache; an error, not an abort, when memory is short.
    pub fn new(
        layers: usize,
        num_blocks: usize,
        block_size: usize,
        kv_dim: usize,
    ) -> Result<Self, String> {
        let per_layer = num_blocks
            .checked_mul(block_size)
            .and_then(|s| s.checked_mul(kv_dim))
            .ok_or("KV cache size overflows")?;
        let alloc = || -> Result<Vec<f32>, String> {
            let mut v = Vec::new();
            v.try_reserve_exact(per_layer).map_err(|e| {
                format!(
                    "cannot allocate a KV cache layer of {} bytes: {e}",
                    per_layer * 4
                )
            })?;
            v.resize(per_layer, 0.0);
            Ok(v)
        };
        let mut k = Vec::with_capacity(layers);
        let mut v = Vec::with_capacity(layers);
        for _ in 0..layers {
            k.push(alloc()?);
            v.push(alloc()?);
        }
        Ok(Self {
            k,
            v,
            num_blocks,
            block_size,
            kv_dim,
        })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Writes rows `k[t]`, `v[t]` (`[T, kv_dim]`) into `slots[t]` of `layer`.
    pub fn write(&mut self, layer: usize, slots: &[usize], k: &[f32], v: &[f32]) {
        let d = self.kv_dim;
        let (kc, vc) = (&mut self.k[layer], &mut self.v[layer]);
        for (t, &slot) in slots.iter().enumerate() {
            kc[slot * d..(slot + 1) * d].copy_from_slice(&k[t * d..(t + 1) * d]);
            vc[slot * d..(slot + 1) * d].copy_from_slice(&v[t * d..(t + 1) * d]);
        }
    }

    /// `(K, V)` of one layer.
    pub fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        (&self.k[layer], &self.v[layer])
    }
}

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
    /// The limits of `spec` on a cache of `num_blocks` blocks of `block_size` positions.
    pub fn new(spec: &crate::models::ModelSpec, num_blocks: usize, block_size: usize) -> Self {
        Self {
            vocab: spec.vocab_size,
            max_positions: spec.max_position_embeddings,
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
