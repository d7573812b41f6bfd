//! Every message exchanged between actors, in one place.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use crate::actors::chunk_bytes::ChunkBytes;

/// A request id that is safe to use as a file name: no path separators, no `..`, no NUL,
/// not empty, at most 200 bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct RequestId(Arc<str>);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid request id {id:?}: {reason}")]
pub struct InvalidRequestId {
    pub id: String,
    pub reason: &'static str,
}

impl RequestId {
    pub const MAX_LEN: usize = 200;

    /// Accepts ids made of ASCII letters, digits and `-_.:+=@`, not starting with `.`.
    pub fn new(id: &str) -> Result<Self, InvalidRequestId> {
        let bad = |reason| {
            Err(InvalidRequestId {
                id: id.chars().take(64).collect(),
                reason,
            })
        };
        if id.is_empty() {
            return bad("empty");
        }
        if id.len() > Self::MAX_LEN {
            return bad("longer than 200 bytes");
        }
        if id.starts_with('.') {
            return bad("starts with '.'");
        }
        let allowed = |c: char| c.is_ascii_alphanumeric() || "-_.:+=@".contains(c);
        if !id.chars().all(allowed) {
            return bad("only ASCII letters, digits and -_.:+=@ are allowed");
        }
        Ok(Self(id.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for RequestId {
    type Error = InvalidRequestId;
    fn try_from(id: String) -> Result<Self, Self::Error> {
        Self::new(&id)
    }
}

impl From<RequestId> for String {
    fn from(id: RequestId) -> Self {
        id.0.to_string()
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

pub use crate::kernels::OutputDtype;

/// A request as the scheduler holds it.
#[derive(Debug, Clone)]
pub struct Request {
    pub id: RequestId,
    pub prompt: Arc<[u32]>,
    /// Tokens to generate greedily (0: none, no LM head computed).
    pub max_tokens: u32,
    /// Also capture the rows of generated tokens (all but the last).
    pub include_output_tokens: bool,
    /// Final file name; the connector writes `path.tmp` first and renames.
    pub path: PathBuf,
    /// Other requests whose prompts are prefixes of this one: their files are sliced from
    /// this request's rows instead of being computed again (a causal model's state at token t
    /// depends only on tokens ≤ t).
    pub prefixes: Vec<PrefixOutput>,
}

/// A file made of the first `rows` rows of another request's states.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixOutput {
    pub id: RequestId,
    pub rows: usize,
    pub path: PathBuf,
}

impl Request {
    /// Rows the file will hold: the prompt, plus generated tokens but the last when asked.
    pub fn expected_rows(&self) -> usize {
        let extra = if self.include_output_tokens {
            self.max_tokens.saturating_sub(1) as usize
        } else {
            0
        };
        self.prompt.len() + extra
    }
    /// Tokens that go through the model: prompt plus every generated token but the last.
    pub fn total_forward_tokens(&self) -> usize {
        self.prompt.len() + self.max_tokens.saturating_sub(1) as usize
    }
}

// ---------------------------------------------------------------- scheduler -> model runner

/// One step's work (vLLM v1's SchedulerOutput): new requests in full, then the chunks to run.
#[derive(Debug, Clone, Default)]
pub struct StepPlan {
    pub step: u64,
    /// Requests the runner has not seen yet: their tokens and their whole block table.
    pub new_requests: Vec<NewRequestData>,
    /// The chunks of this step, in batch order. A chunk's request is either new in this plan
    /// or known to the runner from an earlier one.
    pub chunks: Vec<PlannedChunk>,
    /// Requests whose runner-side state can be dropped (finished, aborted or failed).
    pub released: Vec<RequestId>,
    /// Before the forward: new requests' state slots restored from cached snapshots (prefix
    /// reuse of hybrid models).
    pub restores: Vec<SlotCopy>,
    /// After the forward: state slots of chunks that ended at a block boundary, snapshotted
    /// into cache slots.
    pub snapshots: Vec<SlotCopy>,
}

/// Copy recurrent-state slot `from` into slot `to`, bit for bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotCopy {
    pub from: u32,
    pub to: u32,
}

#[derive(Debug, Clone)]
pub struct NewRequestData {
    pub id: RequestId,
    pub prompt: Arc<[u32]>,
    pub block_ids: Vec<u32>,
    /// Recurrent-state slot (hybrid models only).
    pub state_slot: Option<u32>,
    /// Leading positions whose KV is already in `block_ids` (prefix reuse): the first chunk
    /// starts there.
    pub cached_tokens: usize,
}

#[derive(Debug, Clone)]
pub struct PlannedChunk {
    pub id: RequestId,
    /// First position; must equal the tokens the runner already computed for this request.
    pub start: usize,
    pub len: usize,
    /// Sample a token from this chunk's last position.
    pub sample: bool,
    /// Capture rows `start..start + capture_len` of this chunk (rows past the file's T, such as
    /// the last generated token, are not captured).
    pub capture_len: usize,
}

// ---------------------------------------------------------------- model runner -> scheduler

/// What the runner committed for a step; the scheduler's next plan reads only this.
#[derive(Debug, Clone, Default)]
pub struct StepOutput {
    pub step: u64,
    pub sampled: Vec<(RequestId, u32)>,
    /// Requests that fail with this step (their captured rows were refused by the guard):
    /// no file is written for them.
    pub failed: Vec<(RequestId, String)>,
}

// ---------------------------------------------------------------- model runner -> connector

/// Captured rows of one request from one step: `rows` rows starting at position `start`, laid
/// out `[rows, K, H]` in the output dtype.
#[derive(Debug, Clone)]
pub struct CapturedChunk {
    pub id: RequestId,
    pub start: usize,
    pub rows: usize,
    /// Back to the runner's pool when dropped (see [`ChunkBytes`]).
    pub data: ChunkBytes,
}

// ---------------------------------------------------------------- scheduler -> connector

/// The request produced its last row; the connector writes the file if all rows are there.
#[derive(Debug, Clone)]
pub struct FinishedRequest {
    pub id: RequestId,
    /// The file's `token_ids` (T of them): prompt, plus generated tokens but the last if asked.
    pub token_ids: Vec<u32>,
    /// Tokens generated greedily (reported in the completion event, not written).
    pub output_token_ids: Vec<u32>,
    pub path: PathBuf,
    /// Files sliced from this request's rows (see [`Request::prefixes`]).
    pub prefixes: Vec<PrefixOutput>,
}

// ---------------------------------------------------------------- connector -> scheduler

/// The connector holds no more hidden states of this request: its file (and the files sliced
/// from it) were written or failed, or its rows were discarded. The scheduler gives the
/// request's share of `engine.max_pending_bytes` back and may admit more.
///
/// Sent on an unbounded channel so the connector never waits on the scheduler (which waits on
/// the connector's mailbox); at most one is outstanding per admitted request whose bytes are
/// still counted, so the bytes bound also bounds that channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HiddenStatesReleased(pub RequestId);

/// The connector's end of the release channel.
pub type ReleaseSender = tokio::sync::mpsc::UnboundedSender<HiddenStatesReleased>;
/// The scheduler's end of the release channel.
pub type ReleaseReceiver = tokio::sync::mpsc::UnboundedReceiver<HiddenStatesReleased>;

// ---------------------------------------------------------------- connector / scheduler -> events

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum EventKind {
    Completed {
        path: PathBuf,
        num_tokens: usize,
        layer_ids: Vec<usize>,
        bytes: u64,
        /// Tokens generated (greedy), when `max_tokens >= 1`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        output_token_ids: Vec<u32>,
    },
    Failed {
        error: String,
    },
}

/// A numbered completion/failure event as subscribers see it (and as the disk journal keeps it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionEvent {
    pub seq: u64,
    pub id: RequestId,
    #[serde(flatten)]
    pub kind: EventKind,
}
