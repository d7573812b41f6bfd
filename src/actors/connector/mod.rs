//! Connector (DESIGN.md §2): owns the captured hidden states of unfinished requests in host
//! memory and writes one safetensors file per request once all its rows are there.
//!
//! [`ConnectorState`] appends chunks in order and turns a finished request into a
//! [`CompleteHiddenStates`] only when it holds exactly one row per token; that type cannot be
//! built anywhere else, so an incomplete file is unrepresentable. Its [`write`] puts the file in
//! place atomically (`.tmp`, fsync, rename, fsync dir). [`Connector`] is the kameo actor that runs
//! those writes on a bounded blocking pool and reports each outcome to the EventHub.
//!
//! [`write`]: CompleteHiddenStates::write

mod actor;
mod state;
mod writer;

pub use actor::{
    Capture, Connector, ConnectorHandle, ConnectorStats, Discard, Finish, Flush, Stats,
};
pub use state::ConnectorState;
pub use writer::{CompleteHiddenStates, SCALES_TENSOR, TensorSource, WriteError};

use crate::actors::messages::{OutputDtype, RequestId};

/// What every file of this engine run looks like: `hidden_states` is `[T, K, H]` in `dtype`,
/// with `K = layer_ids.len()` layers in ascending id order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileLayout {
    pub layer_ids: Vec<usize>,
    pub hidden_size: usize,
    pub dtype: OutputDtype,
    /// Written into the file's metadata (provenance only).
    pub model: String,
}

impl FileLayout {
    /// Non-empty, strictly ascending layer ids, a non-zero hidden size, and a row size that
    /// fits in memory.
    pub fn validate(&self) -> Result<(), ConnectorError> {
        let bad = |msg: String| Err(ConnectorError::Layout(msg));
        if self.layer_ids.is_empty() {
            return bad("no layer ids".into());
        }
        if self.layer_ids.windows(2).any(|w| w[0] >= w[1]) {
            return bad(format!(
                "layer ids {:?} must be strictly ascending (no duplicates)",
                self.layer_ids
            ));
        }
        if self.hidden_size == 0 {
            return bad("hidden size 0".into());
        }
        match self.dtype.row_bytes(self.layer_ids.len(), self.hidden_size) {
            Some(r) if r <= isize::MAX as usize => Ok(()),
            _ => bad("one row would not fit in memory".into()),
        }
    }

    /// K: layers per row.
    pub fn num_layers(&self) -> usize {
        self.layer_ids.len()
    }

    /// Bytes of one token's row: `K * H * dtype size` (fp8: + its 4-byte scale).
    pub fn row_bytes(&self) -> usize {
        self.dtype
            .row_bytes(self.layer_ids.len(), self.hidden_size)
            .unwrap_or(usize::MAX)
    }
}

/// Knobs of the connector actor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectorOptions {
    /// The actor's mailbox (captures, finishes, discards).
    pub mailbox: usize,
    /// Files written at once on tokio's blocking pool.
    pub max_concurrent_writes: usize,
    /// Also hold vLLM's `{file}.lock` (flock) while writing, for clients that poll it.
    pub lock_files: bool,
}

impl Default for ConnectorOptions {
    fn default() -> Self {
        Self {
            mailbox: 1024,
            max_concurrent_writes: 4,
            lock_files: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectorError {
    #[error("invalid file layout: {0}")]
    Layout(String),
    #[error("request {id}: chunk starts at row {start} but only {held} rows are held (gap)")]
    Gap {
        id: RequestId,
        start: usize,
        held: usize,
    },
    #[error("request {id}: chunk starts at row {start} but {held} rows are already held (overlap)")]
    Overlap {
        id: RequestId,
        start: usize,
        held: usize,
    },
    #[error("request {id}: chunk of {rows} rows has {got} bytes, expected {expected}")]
    WrongLength {
        id: RequestId,
        rows: usize,
        expected: usize,
        got: usize,
    },
    #[error("request {id}: chunk of {rows} rows is too large to hold")]
    TooLarge { id: RequestId, rows: usize },
    #[error("request {id} was dropped after an earlier error: {reason}")]
    Poisoned { id: RequestId, reason: String },
    #[error(
        "request {id}: {held} rows of hidden states captured but the file needs {expected} \
         (one per token); not written"
    )]
    Incomplete {
        id: RequestId,
        held: usize,
        expected: usize,
    },
    #[error("request {id}: no tokens, nothing to write")]
    Empty { id: RequestId },
    #[error("the connector is not running")]
    NotRunning,
}
