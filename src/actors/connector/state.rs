//! The connector's state: pending rows per request, checked as they arrive.

use std::collections::HashMap;
use std::sync::Arc;

use super::{CompleteHiddenStates, ConnectorError, FileLayout};
use crate::actors::messages::{CapturedChunk, ChunkBytes, FinishedRequest, RequestId};

/// Rows held for one unfinished request.
#[derive(Debug)]
enum Pending {
    /// Chunks in row order; kept as received (no concatenation copy), written one after another.
    Rows {
        chunks: Vec<ChunkBytes>,
        rows: usize,
        bytes: usize,
    },
    /// A chunk was rejected: the rows are dropped and the request can only fail.
    Poisoned { reason: String },
}

/// Pending hidden states of every unfinished request.
#[derive(Debug)]
pub struct ConnectorState {
    layout: Arc<FileLayout>,
    lock_files: bool,
    pending: HashMap<RequestId, Pending>,
    pending_bytes: usize,
}

impl ConnectorState {
    /// `lock_files`: the files it completes also take vLLM's `.lock` while being written.
    pub fn new(layout: FileLayout, lock_files: bool) -> Result<Self, ConnectorError> {
        layout.validate()?;
        Ok(Self {
            layout: Arc::new(layout),
            lock_files,
            pending: HashMap::new(),
            pending_bytes: 0,
        })
    }

    pub fn layout(&self) -> &FileLayout {
        &self.layout
    }

    /// Appends a request's rows. The chunk must start right after the rows already held and
    /// carry exactly `rows * K * H * dtype size` bytes; otherwise the request is poisoned (its
    /// rows dropped) and will fail at finish.
    pub fn capture(&mut self, chunk: CapturedChunk) -> Result<(), ConnectorError> {
        let row_bytes = self.layout.row_bytes();
        let entry = self
            .pending
            .entry(chunk.id.clone())
            .or_insert(Pending::Rows {
                chunks: Vec::new(),
                rows: 0,
                bytes: 0,
            });
        let checked = match entry {
            Pending::Poisoned { reason } => {
                return Err(ConnectorError::Poisoned {
                    id: chunk.id,
                    reason: reason.clone(),
                });
            }
            Pending::Rows { rows, .. } => check_chunk(&chunk, *rows, row_bytes),
        };
        if let Err(e) = checked {
            self.poison(&chunk.id, &e);
            return Err(e);
        }
        if let Pending::Rows {
            chunks,
            rows,
            bytes,
        } = entry
            && chunk.rows > 0
        {
            *rows += chunk.rows;
            *bytes += chunk.data.len();
            self.pending_bytes += chunk.data.len();
            chunks.push(chunk.data);
        }
        Ok(())
    }

    /// Ends a request. Only when it holds exactly one row per token does this give the
    /// complete hidden states to write; in every case its pending rows leave this state.
    pub fn finish(&mut self, req: FinishedRequest) -> Result<CompleteHiddenStates, ConnectorError> {
        let expected = req.token_ids.len();
        let (chunks, held) = match self.take(&req.id) {
            Some(Pending::Poisoned { reason }) => {
                return Err(ConnectorError::Poisoned { id: req.id, reason });
            }
            Some(Pending::Rows { chunks, rows, .. }) => (chunks, rows),
            None => (Vec::new(), 0),
        };
        if expected == 0 {
            return Err(ConnectorError::Empty { id: req.id });
        }
        if held != expected {
            return Err(ConnectorError::Incomplete {
                id: req.id,
                held,
                expected,
            });
        }
        Ok(CompleteHiddenStates::new(
            req,
            Arc::clone(&self.layout),
            chunks,
            self.lock_files,
        ))
    }

    /// Drops a request's pending rows (abort or failure). Returns whether anything was held.
    pub fn discard(&mut self, id: &RequestId) -> bool {
        self.take(id).is_some()
    }

    /// Bytes of hidden states held for unfinished requests.
    pub fn pending_bytes(&self) -> usize {
        self.pending_bytes
    }

    /// Unfinished requests known to the connector (poisoned ones included).
    pub fn pending_requests(&self) -> usize {
        self.pending.len()
    }

    /// Rows held for a request (`None`: unknown or poisoned).
    pub fn rows_held(&self, id: &RequestId) -> Option<usize> {
        match self.pending.get(id) {
            Some(Pending::Rows { rows, .. }) => Some(*rows),
            _ => None,
        }
    }

    fn take(&mut self, id: &RequestId) -> Option<Pending> {
        let entry = self.pending.remove(id)?;
        if let Pending::Rows { bytes, .. } = &entry {
            self.pending_bytes -= bytes;
        }
        Some(entry)
    }

    fn poison(&mut self, id: &RequestId, error: &ConnectorError) {
        self.take(id);
        let reason = error.to_string();
        self.pending
            .insert(id.clone(), Pending::Poisoned { reason });
    }
}

/// Checks that a chunk continues the rows held and has the right byte length.
fn check_chunk(chunk: &CapturedChunk, held: usize, row_bytes: usize) -> Result<(), ConnectorError> {
    let id = || chunk.id.clone();
    if chunk.start > held {
        return Err(ConnectorError::Gap {
            id: id(),
            start: chunk.start,
            held,
        });
    }
    if chunk.start < held {
        return Err(ConnectorError::Overlap {
            id: id(),
            start: chunk.start,
            held,
        });
    }
    let Some(expected) = chunk.rows.checked_mul(row_bytes) else {
        return Err(ConnectorError::TooLarge {
            id: id(),
            rows: chunk.rows,
        });
    };
    if chunk.data.len() != expected {
        return Err(ConnectorError::WrongLength {
            id: id(),
            rows: chunk.rows,
            expected,
            got: chunk.data.len(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::messages::OutputDtype;
    use std::path::PathBuf;

    // K = 2 layers, H = 3, f32: 24 bytes per row.
    fn state() -> ConnectorState {
        let layout = FileLayout {
            layer_ids: vec![0, 2],
            hidden_size: 3,
            dtype: OutputDtype::F32,
            model: "tiny".into(),
        };
        ConnectorState::new(layout, false).unwrap()
    }

    fn rid(s: &str) -> RequestId {
        RequestId::new(s).unwrap()
    }

    fn chunk(id: &str, start: usize, rows: usize) -> CapturedChunk {
        CapturedChunk {
            id: rid(id),
            start,
            rows,
            data: vec![start as u8; rows * 24].into(),
        }
    }

    fn finished(id: &str, tokens: usize) -> FinishedRequest {
        FinishedRequest {
            id: rid(id),
            token_ids: (0..tokens as u32).collect(),
            output_token_ids: vec![],
            path: PathBuf::from(format!("/nonexistent/{id}.safetensors")),
            prefixes: vec![],
        }
    }

    #[test]
    fn layout_validation() {
        let ok = state().layout().clone();
        assert_eq!(ok.row_bytes(), 24);
        let mut bad = ok.clone();
        bad.layer_ids = vec![2, 2];
        assert!(matches!(bad.validate(), Err(ConnectorError::Layout(_))));
        bad.layer_ids = vec![3, 1];
        assert!(bad.validate().is_err());
        bad.layer_ids = vec![];
        assert!(bad.validate().is_err());
        let mut bad = ok.clone();
        bad.hidden_size = 0;
        assert!(ConnectorState::new(bad, false).is_err());
        let mut bad = ok;
        bad.hidden_size = usize::MAX / 2;
        assert!(bad.validate().is_err());
    }

    #[test]
    fn appends_in_order_and_counts_bytes() {
        let mut s = state();
        s.capture(chunk("a", 0, 2)).unwrap();
        s.capture(chunk("a", 2, 0)).unwrap();
        s.capture(chunk("a", 2, 3)).unwrap();
        s.capture(chunk("b", 0, 1)).unwrap();
        assert_eq!(s.rows_held(&rid("a")), Some(5));
        assert_eq!(s.pending_bytes(), 6 * 24);
        assert_eq!(s.pending_requests(), 2);
        let done = s.finish(finished("a", 5)).unwrap();
        assert_eq!(done.num_tokens(), 5);
        assert_eq!(s.pending_bytes(), 24);
        assert!(s.discard(&rid("b")));
        assert!(!s.discard(&rid("b")));
        assert_eq!((s.pending_bytes(), s.pending_requests()), (0, 0));
    }

    #[test]
    fn gap_poisons_request() {
        let mut s = state();
        s.capture(chunk("a", 0, 2)).unwrap();
        let e = s.capture(chunk("a", 3, 1)).unwrap_err();
        assert!(
            matches!(
                e,
                ConnectorError::Gap {
                    start: 3,
                    held: 2,
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(
            s.pending_bytes(),
            0,
            "rows of a poisoned request are dropped"
        );
        assert_eq!(s.rows_held(&rid("a")), None);
        // Later chunks, even well-placed ones, are refused; finish reports the first cause.
        assert!(matches!(
            s.capture(chunk("a", 2, 1)),
            Err(ConnectorError::Poisoned { .. })
        ));
        let e = s.finish(finished("a", 3)).unwrap_err();
        let ConnectorError::Poisoned { reason, .. } = e else {
            panic!("{e:?}")
        };
        assert!(reason.contains("gap"), "{reason}");
        assert_eq!(s.pending_requests(), 0);
    }

    #[test]
    fn overlap_and_first_chunk_not_at_zero_rejected() {
        let mut s = state();
        s.capture(chunk("a", 0, 2)).unwrap();
        let e = s.capture(chunk("a", 1, 1)).unwrap_err();
        assert!(
            matches!(
                e,
                ConnectorError::Overlap {
                    start: 1,
                    held: 2,
                    ..
                }
            ),
            "{e}"
        );
        let e = s.capture(chunk("b", 4, 1)).unwrap_err();
        assert!(
            matches!(
                e,
                ConnectorError::Gap {
                    start: 4,
                    held: 0,
                    ..
                }
            ),
            "{e}"
        );
        assert!(s.discard(&rid("b")), "poisoned entries are discardable");
    }

    #[test]
    fn wrong_length_rejected() {
        let mut s = state();
        let mut c = chunk("a", 0, 2);
        c.data = vec![0; 47].into();
        let e = s.capture(c).unwrap_err();
        assert!(
            matches!(
                e,
                ConnectorError::WrongLength {
                    rows: 2,
                    expected: 48,
                    got: 47,
                    ..
                }
            ),
            "{e}"
        );
        let huge = CapturedChunk {
            id: rid("h"),
            start: 0,
            rows: usize::MAX,
            data: vec![].into(),
        };
        assert!(matches!(
            s.capture(huge),
            Err(ConnectorError::TooLarge { .. })
        ));
        assert_eq!(s.pending_bytes(), 0);
    }

    #[test]
    fn finish_with_missing_or_extra_rows_fails() {
        let mut s = state();
        s.capture(chunk("a", 0, 2)).unwrap();
        let e = s.finish(finished("a", 3)).unwrap_err();
        assert_eq!(
            e,
            ConnectorError::Incomplete {
                id: rid("a"),
                held: 2,
                expected: 3
            }
        );
        assert!(e.to_string().contains("2 rows") && e.to_string().contains("needs 3"));
        assert_eq!(s.pending_bytes(), 0);
        s.capture(chunk("b", 0, 4)).unwrap();
        assert!(matches!(
            s.finish(finished("b", 3)),
            Err(ConnectorError::Incomplete {
                held: 4,
                expected: 3,
                ..
            })
        ));
        // Never captured at all.
        assert!(matches!(
            s.finish(finished("c", 1)),
            Err(ConnectorError::Incomplete { held: 0, .. })
        ));
        assert!(matches!(
            s.finish(finished("d", 0)),
            Err(ConnectorError::Empty { .. })
        ));
    }
}
