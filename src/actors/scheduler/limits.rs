//! What the scheduler admits: its limits and why a request is refused at submit.

use thiserror::Error;

use crate::actors::messages::{Request, RequestId};

#[derive(Debug, Clone)]
pub struct SchedulerLimits {
    pub max_num_batched_tokens: usize,
    pub max_num_seqs: usize,
    pub max_waiting: usize,
    /// Longest prompt + generated tokens.
    pub max_model_len: usize,
    pub vocab_size: usize,
    /// Tokens the whole KV cache can hold (blocks × block size).
    pub kv_capacity_tokens: usize,
    /// Bytes of one captured row in host memory (`K × H ×` output dtype size), as the
    /// connector holds it.
    pub row_bytes: usize,
    /// Bound on the hidden-state bytes held for admitted requests (`engine.max_pending_bytes`):
    /// rows accumulating in the connector plus finished files not yet written.
    pub max_pending_bytes: usize,
}

impl SchedulerLimits {
    /// Host bytes the connector holds for a request's file (`T × K × H × dtype size`).
    pub fn hidden_bytes(&self, req: &Request) -> usize {
        req.expected_rows().saturating_mul(self.row_bytes)
    }

    /// Whether a request can ever run under these limits (the checks `submit` makes first).
    pub fn validate(&self, req: &Request) -> Result<(), SubmitError> {
        if req.prompt.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
        let len = req.prompt.len() + req.max_tokens as usize;
        if len > self.max_model_len {
            let max = self.max_model_len;
            return Err(SubmitError::TooLong { len, max });
        }
        let vocab = self.vocab_size;
        if let Some((position, &token)) = req
            .prompt
            .iter()
            .enumerate()
            .find(|&(_, &t)| t as usize >= vocab)
        {
            return Err(SubmitError::TokenOutOfRange {
                token,
                position,
                vocab,
            });
        }
        let capacity = self.kv_capacity_tokens;
        if req.total_forward_tokens() > capacity {
            let len = req.total_forward_tokens();
            return Err(SubmitError::TooLargeForCache { len, capacity });
        }
        // A request that could never fit under the bound is refused rather than left waiting
        // forever (or admitted past the bound): the bound is a real bound.
        let bytes = self.hidden_bytes(req);
        if bytes > self.max_pending_bytes {
            let (rows, max) = (req.expected_rows(), self.max_pending_bytes);
            return Err(SubmitError::TooLargeForHostMemory { rows, bytes, max });
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SubmitError {
    #[error("overloaded: {0} requests are already waiting")]
    Overloaded(usize),
    #[error("request id {0} is already queued or running")]
    DuplicateId(RequestId),
    #[error("empty prompt: token_ids must hold at least one token")]
    EmptyPrompt,
    #[error("request of {len} tokens (prompt + max_tokens) exceeds max_model_len {max}")]
    TooLong { len: usize, max: usize },
    #[error("token id {token} at position {position} is out of range (vocab size {vocab})")]
    TokenOutOfRange {
        token: u32,
        position: usize,
        vocab: usize,
    },
    #[error("request of {len} tokens does not fit in the KV cache ({capacity} tokens)")]
    TooLargeForCache { len: usize, capacity: usize },
    #[error(
        "request of {rows} rows needs {bytes} bytes of host memory for its hidden states, more \
         than engine.max_pending_bytes ({max})"
    )]
    TooLargeForHostMemory {
        rows: usize,
        bytes: usize,
        max: usize,
    },
    #[error("the engine is shutting down")]
    ShuttingDown,
    #[error("the engine admits nothing more: {0}")]
    DeviceLost(String),
}
