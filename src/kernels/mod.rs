//! The devices and the device-ops layer the models are written over.
//!
//! - [`device`]: the [`Device`] trait (fused ops over associated buffer / weight / cache types);
//!   [`cpu`] and [`cuda`] implement it. Nothing here knows an architecture or a checkpoint name.
//! - [`plan`], [`rope`], [`routing`]: device-neutral planning (the checked per-token plan of a
//!   batch and its recurrent-state chunks, RoPE tables, MoE routing in expert order).
//! - [`Backend`]: what the model runner drives: a packed, unpadded [`Batch`] in, the captured
//!   rows (already in the file dtype) and sampled tokens out. `models::ModelBackend` implements
//!   it for any architecture on any [`Device`].

#[cfg(test)]
pub(crate) mod attention_reference;
pub mod cpu;
pub mod cuda;
pub mod device;
pub mod dsa;
#[cfg(test)]
pub(crate) mod dsa_reference;
pub mod dtype;
pub mod fp8;
pub mod host_copy;
pub mod plan;
pub mod qsa;
#[cfg(test)]
pub(crate) mod qsa_reference;
pub mod rope;
pub mod routing;

pub use cpu::CpuDevice;
pub use cpu::bf16::Bf16Kernel;
pub use device::{Device, DeviceError};
pub use dtype::{OutputDtype, RopeScaling, WeightDtype};

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
    /// The request's tokens right before `start`, the last [`CHUNK_CONTEXT`] of them (fewer
    /// near the start): what a token's n-gram inputs reach back to (Qwen4-Exp's per-layer
    /// embeddings). A model that reads them checks there are as many as it needs.
    pub context: Vec<u32>,
}

/// Tokens of context a [`SeqChunk`] carries from before its start.
pub const CHUNK_CONTEXT: usize = 8;

impl SeqChunk {
    /// This chunk with its context taken from its request's `tokens` (positions from 0).
    pub fn with_context(mut self, tokens: &[u32]) -> Self {
        let end = self.start.min(tokens.len());
        self.context = tokens[end.saturating_sub(CHUNK_CONTEXT)..end].to_vec();
        self
    }
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
#[derive(Debug, Clone)]
pub struct BatchOutput {
    /// Captured rows `[num_tokens, K, H]` row-major as little-endian bytes of the file dtype
    /// ([`Backend::output_dtype`]), rows in batch order, the K capture layers in ascending
    /// layer-id order (DESIGN.md §1.1).
    pub captured: Vec<u8>,
    /// dtype of `captured`.
    pub dtype: OutputDtype,
    /// One entry per seq chunk: `Some(token)` where `sample` was set, else `None`.
    pub sampled: Vec<Option<u32>>,
    /// Captured rows the finite-and-non-empty guard refused, by batch row then layer (empty
    /// when the guard is off).
    pub bad_rows: Vec<BadRow>,
}

/// Why the guard refused a captured row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowFault {
    /// A NaN or an infinity.
    NonFinite,
    /// Every value zero at a layer id >= 1 (an embedding row may legitimately be zero).
    AllZero,
}

impl RowFault {
    /// What the guard finds in one captured row, from the row's two flags.
    pub fn of(non_finite: bool, any_nonzero: bool, zero_check: bool) -> Option<Self> {
        if non_finite {
            Some(Self::NonFinite)
        } else if zero_check && !any_nonzero {
            Some(Self::AllZero)
        } else {
            None
        }
    }

    /// The metric label.
    pub fn name(self) -> &'static str {
        match self {
            Self::NonFinite => "non_finite",
            Self::AllZero => "all_zero",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Self::NonFinite => "holds NaN or infinite values",
            Self::AllZero => "is all zeros",
        }
    }
}

/// A captured row the guard refused: batch row, layer id, why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadRow {
    pub row: usize,
    pub layer: usize,
    pub fault: RowFault,
}

impl BatchOutput {
    /// The output of a batch without tokens: nothing captured, nothing sampled.
    pub fn empty(batch: &Batch<'_>, dtype: OutputDtype) -> Self {
        Self {
            captured: Vec::new(),
            dtype,
            sampled: vec![None; batch.seqs.len()],
            bad_rows: Vec::new(),
        }
    }

    /// The captured values widened to f32 (fp8: dequantized), `width` = K × H per row.
    pub fn captured_f32(&self, width: usize) -> Vec<f32> {
        let stored = match self.dtype {
            OutputDtype::F32 => WeightDtype::F32,
            OutputDtype::Bf16 => WeightDtype::Bf16,
            OutputDtype::F16 => WeightDtype::F16,
            OutputDtype::Fp8 => return fp8::dequantize_rows(&self.captured, width),
        };
        dtype::widen(&self.captured, stored)
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
    /// The device can run nothing more (a sticky CUDA error such as an illegal address: every
    /// later call on its context fails too). The engine fails its requests and stops admitting.
    #[error("the device is lost ({0}); restart hsx")]
    DeviceLost(String),
}

/// A compute backend. Implementations must give each token's result independently of which
/// other tokens share its batch and of how its request was split into chunks.
pub trait Backend: Send {
    /// Values per token of each captured layer (the residual stream's width).
    fn hidden_size(&self) -> usize;
    /// Layer ids captured by `forward`, ascending.
    fn capture_layers(&self) -> &[usize];
    /// dtype of the captured rows in [`BatchOutput::captured`].
    fn output_dtype(&self) -> OutputDtype;
    fn forward(&mut self, batch: &Batch<'_>) -> Result<BatchOutput, BackendError>;
    /// Bytes of one recurrent-state slot (conv + recurrent state of every recurrent layer);
    /// 0 for models without recurrent layers.
    fn state_slot_bytes(&self) -> usize {
        0
    }
    /// Makes `n` more recurrent-state slots after the running requests' ones, for prefix
    /// reuse's snapshots (only [`Backend::copy_state_slots`] touches them); returns the index
    /// of the first. Called once, before any forward.
    fn add_snapshot_slots(&mut self, n: usize) -> Result<usize, BackendError> {
        match n {
            0 => Ok(0),
            _ => Err(BackendError::InvalidBatch(
                "this backend keeps no recurrent state".into(),
            )),
        }
    }
    /// Copies recurrent-state slot `from` into slot `to` for each pair, bit for bit (a
    /// request's state snapshotted at a block boundary, or restored from one).
    fn copy_state_slots(&mut self, copies: &[(usize, usize)]) -> Result<(), BackendError> {
        match copies {
            [] => Ok(()),
            _ => Err(BackendError::InvalidBatch(
                "this backend keeps no recurrent state".into(),
            )),
        }
    }
    /// Takes back a [`BatchOutput::captured`] once its rows were cut into requests, for a
    /// later forward to reuse (default: dropped).
    fn recycle_captured(&mut self, _bytes: Vec<u8>) {}
    /// The device and its kernels, in words (logged at start).
    fn device_name(&self) -> String {
        String::from("unnamed device")
    }
}
