//! Compute backends behind one narrow trait over a packed, unpadded batch.
//!
//! The model runner turns a `StepPlan` into a [`Batch`] and calls [`Backend::forward`]; the
//! backend owns the weights and the cache memory (paged KV blocks), the block tables come with
//! the batch (the block manager decides them).

pub mod cpu;
pub mod cuda;

use thiserror::Error;

/// One request's chunk inside a packed batch.
#[derive(Debug, Clone)]
pub struct SeqChunk {
    /// Absolute position (in the request's sequence) of the chunk's first token.
    pub start: usize,
    /// Number of tokens of this chunk in the batch.
    pub len: usize,
    /// KV block ids covering at least positions `0..start + len`, in order.
    pub block_table: Vec<u32>,
    /// Compute the LM head on the chunk's last token and return its greedy argmax.
    pub sample: bool,
    /// The request's recurrent-state slot (conv + SSM/delta state) for models with linear
    /// attention or Mamba layers; `None` for dense models. A chunk with `start == 0` begins
    /// from a zero state, whatever the slot held before (slots are reused).
    pub state_slot: Option<u32>,
}

/// A packed batch: the tokens of every chunk concatenated in chunk order, no padding.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    pub token_ids: &'a [u32],
    pub seqs: &'a [SeqChunk],
}

impl Batch<'_> {
    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }
}

/// What a forward pass returns.
#[derive(Debug, Clone, Default)]
pub struct BatchOutput {
    /// Captured rows `[num_tokens, K, H]`, f32 row-major, rows in batch order, the K capture
    /// layers in ascending layer-id order (DESIGN.md §1.1).
    pub captured: Vec<f32>,
    /// One entry per seq chunk: `Some(token)` where `sample` was set, else `None`.
    pub sampled: Vec<Option<u32>>,
}

impl BatchOutput {
    /// The output of a batch without tokens: nothing captured, nothing sampled.
    pub fn empty(batch: &Batch<'_>) -> Self {
        Self {
            captured: Vec::new(),
            sampled: vec![None; batch.seqs.len()],
        }
    }
}

#[derive(Debug, Error)]
pub enum BackendError {
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    #[error("token id {token} is out of range (vocab size {vocab})")]
    TokenOutOfRange { token: u32, vocab: usize },
    #[error("backend failure: {0}")]
    Compute(String),
}

/// A compute backend. Implementations must give each token's result independently of which
/// other tokens share its batch and of how its request was split into chunks.
pub trait Backend: Send {
    fn hidden_size(&self) -> usize;
    /// Layer ids captured by `forward`, ascending.
    fn capture_layers(&self) -> &[usize];
    fn forward(&mut self, batch: &Batch<'_>) -> Result<BatchOutput, BackendError>;
}
