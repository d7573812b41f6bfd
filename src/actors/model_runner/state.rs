//! The runner's plain state: each request's tokens and blocks, turning a `StepPlan` into a
//! packed batch and a backend output back into per-request captured rows.

use std::collections::HashMap;

use thiserror::Error;

use super::block_rows::BlockRows;
use crate::actors::block_manager::ComputedBlocks;
use crate::actors::chunk_bytes::ChunkPool;
use crate::actors::messages::{CapturedChunk, OutputDtype, RequestId, StepOutput, StepPlan};
use crate::kernels::{BadRow, BatchOutput, SeqChunk};

#[derive(Debug, Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("plan names unknown request {0}")]
    UnknownRequest(RequestId),
    #[error("request {id}: chunk starts at {start} but {computed} tokens are computed")]
    WrongStart {
        id: RequestId,
        start: usize,
        computed: usize,
    },
    #[error("request {id}: chunk {start}..{end} runs past the {known} known tokens")]
    PastKnownTokens {
        id: RequestId,
        start: usize,
        end: usize,
        known: usize,
    },
    #[error("backend output has {got} bytes of captured rows, expected {expected}")]
    OutputSize { got: usize, expected: usize },
    #[error("backend captured {got:?} rows, the files are {expected:?}")]
    OutputDtype {
        got: OutputDtype,
        expected: OutputDtype,
    },
    #[error("request {0}: a token was to be sampled but the backend returned none")]
    MissingSample(RequestId),
}

#[derive(Debug)]
struct Seq {
    tokens: Vec<u32>,
    blocks: Vec<u32>,
    state_slot: Option<u32>,
    computed: usize,
}

/// The packed batch of one step.
#[derive(Debug, Default)]
pub struct PreparedStep {
    pub token_ids: Vec<u32>,
    pub seqs: Vec<SeqChunk>,
}

/// Rows per token in the captured output: K layers of H values.
#[derive(Debug, Clone, Copy)]
pub struct RowShape {
    pub layers: usize,
    pub hidden: usize,
    pub dtype: OutputDtype,
}

impl RowShape {
    /// Bytes of one token's captured row (fp8: with its scale). The connector's layout
    /// validated that this does not overflow.
    pub fn bytes(&self) -> usize {
        self.dtype
            .row_bytes(self.layers, self.hidden)
            .unwrap_or(usize::MAX)
    }
}

#[derive(Debug, Default)]
pub struct RunnerState {
    seqs: HashMap<RequestId, Seq>,
    /// Prefix reuse: full prompt blocks' rows for the block manager.
    block_rows: Option<BlockRows>,
    /// Allocations of earlier chunks, for this step's (see [`ChunkPool`]).
    chunks: ChunkPool,
}

impl RunnerState {
    /// Also cuts the captured rows of full prompt blocks (prefix reuse), `row_bytes` per
    /// row: see [`Self::computed_blocks`].
    pub fn with_block_rows(block_size: usize, row_bytes: usize) -> Self {
        Self {
            block_rows: Some(BlockRows::new(block_size, row_bytes)),
            ..Self::default()
        }
    }

    /// Cuts each step's rows into allocations of earlier chunks (see [`ChunkPool`]).
    pub fn with_chunk_pool(self, chunks: ChunkPool) -> Self {
        Self { chunks, ..self }
    }

    /// Capacity of earlier chunks kept for later steps.
    pub fn spare_chunk_bytes(&self) -> usize {
        self.chunks.spare_bytes()
    }

    /// The full prompt blocks completed by these captured chunks, with their rows (empty
    /// without prefix reuse).
    pub fn computed_blocks(&mut self, captures: &[CapturedChunk]) -> Vec<ComputedBlocks> {
        self.block_rows
            .as_mut()
            .map(|b| b.cut(captures))
            .unwrap_or_default()
    }

    pub fn num_requests(&self) -> usize {
        self.seqs.len()
    }

    /// Applies the plan's releases and new requests, then packs its chunks.
    pub fn prepare(&mut self, plan: &StepPlan) -> Result<PreparedStep, PlanError> {
        for id in &plan.released {
            self.seqs.remove(id);
            if let Some(b) = self.block_rows.as_mut() {
                b.forget(id);
            }
        }
        for new in &plan.new_requests {
            if let Some(b) = self.block_rows.as_mut() {
                b.start(&new.id, new.prompt.len(), new.cached_tokens);
            }
            let seq = Seq {
                tokens: new.prompt.to_vec(),
                blocks: new.block_ids.clone(),
                state_slot: new.state_slot,
                computed: new.cached_tokens,
            };
            self.seqs.insert(new.id.clone(), seq);
        }
        let mut step = PreparedStep::default();
        for c in &plan.chunks {
            let seq = self
                .seqs
                .get(&c.id)
                .ok_or_else(|| PlanError::UnknownRequest(c.id.clone()))?;
            check_chunk(&c.id, seq, c.start, c.len)?;
            step.token_ids
                .extend_from_slice(&seq.tokens[c.start..c.start + c.len]);
            let chunk = SeqChunk {
                context: Vec::new(),
                start: c.start,
                len: c.len,
                block_table: seq.blocks.clone(),
                sample: c.sample,
                state_slot: seq.state_slot,
            };
            step.seqs.push(chunk.with_context(&seq.tokens));
        }
        Ok(step)
    }

    /// Commits a successful forward: advances each request, appends sampled tokens, and
    /// cuts the captured rows (already in the file dtype) per request.
    pub fn commit(
        &mut self,
        plan: &StepPlan,
        out: &BatchOutput,
        shape: RowShape,
    ) -> Result<(StepOutput, Vec<CapturedChunk>), PlanError> {
        let total: usize = plan.chunks.iter().map(|c| c.len).sum();
        if out.dtype != shape.dtype {
            return Err(PlanError::OutputDtype {
                got: out.dtype,
                expected: shape.dtype,
            });
        }
        let expected = total * shape.bytes();
        if out.captured.len() != expected || out.sampled.len() != plan.chunks.len() {
            let got = out.captured.len();
            return Err(PlanError::OutputSize { got, expected });
        }
        let mut result = StepOutput {
            step: plan.step,
            ..StepOutput::default()
        };
        let mut captures = Vec::new();
        let mut row = 0;
        for (c, sampled) in plan.chunks.iter().zip(&out.sampled) {
            let seq = self
                .seqs
                .get_mut(&c.id)
                .ok_or_else(|| PlanError::UnknownRequest(c.id.clone()))?;
            seq.computed += c.len;
            if c.sample {
                let t = sampled.ok_or_else(|| PlanError::MissingSample(c.id.clone()))?;
                seq.tokens.push(t);
                result.sampled.push((c.id.clone(), t));
            }
            let captured = row..row + c.capture_len;
            if let Some(bad) = out.bad_rows.iter().find(|b| captured.contains(&b.row)) {
                metrics::counter!("hsx_bad_states_total", "reason" => bad.fault.name())
                    .increment(1);
                result
                    .failed
                    .push((c.id.clone(), refusal(bad, c.start + bad.row - row)));
            } else if c.capture_len > 0 {
                let bytes = &out.captured[row * shape.bytes()..][..c.capture_len * shape.bytes()];
                captures.push(CapturedChunk {
                    id: c.id.clone(),
                    start: c.start,
                    rows: c.capture_len,
                    data: self.chunks.copy(bytes),
                });
            }
            row += c.len;
        }
        Ok((result, captures))
    }
}

/// The error of a request whose captured row the guard refused.
fn refusal(bad: &BadRow, position: usize) -> String {
    format!(
        "the hidden state at layer {} of token position {position} {}: no file written \
         (engine.reject_bad_states = false keeps such states)",
        bad.layer,
        bad.fault.describe()
    )
}

fn check_chunk(id: &RequestId, seq: &Seq, start: usize, len: usize) -> Result<(), PlanError> {
    if start != seq.computed {
        return Err(PlanError::WrongStart {
            id: id.clone(),
            start,
            computed: seq.computed,
        });
    }
    if start + len > seq.tokens.len() {
        return Err(PlanError::PastKnownTokens {
            id: id.clone(),
            start,
            end: start + len,
            known: seq.tokens.len(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::messages::{NewRequestData, PlannedChunk};
    /// f32 rows as a backend hands them over for f32 files.
    fn f32_bytes(vals: &[f32]) -> Vec<u8> {
        bytemuck::cast_slice(vals).to_vec()
    }

    fn id(s: &str) -> RequestId {
        RequestId::new(s).unwrap()
    }

    fn chunk(name: &str, start: usize, len: usize, sample: bool) -> PlannedChunk {
        PlannedChunk {
            id: id(name),
            start,
            len,
            sample,
            capture_len: len,
        }
    }

    fn new_req(name: &str, prompt: &[u32]) -> NewRequestData {
        NewRequestData {
            id: id(name),
            prompt: prompt.into(),
            block_ids: vec![3, 4],
            state_slot: None,
            cached_tokens: 0,
        }
    }

    const SHAPE: RowShape = RowShape {
        layers: 2,
        hidden: 1,
        dtype: OutputDtype::F32,
    };

    #[test]
    fn packs_chunks_and_cuts_rows_per_request() {
        let mut s = RunnerState::default();
        let plan = StepPlan {
            step: 0,
            new_requests: vec![new_req("a", &[1, 2, 3]), new_req("b", &[9])],
            chunks: vec![chunk("a", 0, 2, false), chunk("b", 0, 1, true)],
            released: vec![],
            ..Default::default()
        };
        let step = s.prepare(&plan).unwrap();
        assert_eq!(step.token_ids, vec![1, 2, 9]);
        assert_eq!(step.seqs[1].block_table, vec![3, 4]);
        let out = BatchOutput {
            captured: f32_bytes(&[0.0, 0.5, 1.0, 1.5, 2.0, 2.5]),
            dtype: OutputDtype::F32,
            sampled: vec![None, Some(5)],
            bad_rows: vec![],
        };
        let (res, caps) = s.commit(&plan, &out, SHAPE).unwrap();
        assert_eq!(res.sampled, vec![(id("b"), 5)]);
        assert_eq!(caps.len(), 2);
        assert_eq!(caps[1].start, 0);
        assert_eq!(*caps[1].data, f32_bytes(&[2.0, 2.5]));
        assert_eq!(caps[0].rows, 2);
        // The sampled token becomes b's next input.
        let plan2 = StepPlan {
            step: 1,
            chunks: vec![chunk("a", 2, 1, true), chunk("b", 1, 1, true)],
            ..Default::default()
        };
        assert_eq!(s.prepare(&plan2).unwrap().token_ids, vec![3, 5]);
    }

    #[test]
    fn inconsistent_plans_are_errors() {
        let mut s = RunnerState::default();
        let mut plan = StepPlan {
            new_requests: vec![new_req("a", &[1, 2])],
            chunks: vec![chunk("a", 1, 1, false)],
            ..Default::default()
        };
        assert!(matches!(
            s.prepare(&plan),
            Err(PlanError::WrongStart { .. })
        ));
        plan.chunks = vec![chunk("a", 0, 3, false)];
        assert!(matches!(
            s.prepare(&plan),
            Err(PlanError::PastKnownTokens { .. })
        ));
        plan.chunks = vec![chunk("zz", 0, 1, false)];
        assert!(matches!(
            s.prepare(&plan),
            Err(PlanError::UnknownRequest(_))
        ));
    }

    /// Chunks cut into allocations of earlier, dropped chunks hold exactly their step's rows.
    #[test]
    fn pooled_chunks_hold_exactly_their_rows() {
        let pool = ChunkPool::new(1 << 20, 1);
        let mut s = RunnerState::default().with_chunk_pool(pool);
        let plan = |step, new_requests, chunks| StepPlan {
            step,
            new_requests,
            chunks,
            ..Default::default()
        };
        let output = |rows: usize, seed: f32| BatchOutput {
            captured: f32_bytes(&(0..rows * 2).map(|i| seed + i as f32).collect::<Vec<_>>()),
            dtype: OutputDtype::F32,
            sampled: vec![None; 2],
            bad_rows: vec![],
        };
        let first = plan(
            0,
            vec![new_req("a", &[1; 9]), new_req("b", &[2; 4])],
            vec![chunk("a", 0, 5, false), chunk("b", 0, 4, false)],
        );
        s.prepare(&first).unwrap();
        let (_, caps) = s.commit(&first, &output(9, 0.0), SHAPE).unwrap();
        let addrs: Vec<_> = caps.iter().map(|c| c.data.as_ptr()).collect();
        drop(caps);
        let second = plan(
            1,
            vec![new_req("c", &[3; 3])],
            vec![chunk("a", 5, 4, false), chunk("c", 0, 3, false)],
        );
        s.prepare(&second).unwrap();
        let out = output(7, 100.0);
        let (_, caps) = s.commit(&second, &out, SHAPE).unwrap();
        assert_eq!(*caps[0].data, out.captured[..32]);
        assert_eq!(*caps[1].data, out.captured[32..]);
        assert!(
            caps.iter().all(|c| addrs.contains(&c.data.as_ptr())),
            "the first step's allocations hold the second's chunks"
        );
    }

    #[test]
    fn released_requests_are_forgotten() {
        let mut s = RunnerState::default();
        let plan = StepPlan {
            new_requests: vec![new_req("a", &[1])],
            ..Default::default()
        };
        s.prepare(&plan).unwrap();
        assert_eq!(s.num_requests(), 1);
        let plan = StepPlan {
            released: vec![id("a")],
            ..Default::default()
        };
        s.prepare(&plan).unwrap();
        assert_eq!(s.num_requests(), 0);
    }

    #[test]
    fn wrong_output_size_and_missing_sample_are_errors() {
        let mut s = RunnerState::default();
        let plan = StepPlan {
            new_requests: vec![new_req("a", &[1])],
            chunks: vec![chunk("a", 0, 1, true)],
            ..Default::default()
        };
        s.prepare(&plan).unwrap();
        let short = BatchOutput {
            captured: f32_bytes(&[0.0]),
            dtype: OutputDtype::F32,
            sampled: vec![Some(1)],
            bad_rows: vec![],
        };
        assert!(matches!(
            s.commit(&plan, &short, SHAPE),
            Err(PlanError::OutputSize { .. })
        ));
        let unsampled = BatchOutput {
            captured: f32_bytes(&[0.0, 0.0]),
            dtype: OutputDtype::F32,
            sampled: vec![None],
            bad_rows: vec![],
        };
        assert!(matches!(
            s.commit(&plan, &unsampled, SHAPE),
            Err(PlanError::MissingSample(_))
        ));
        let bf16 = BatchOutput {
            dtype: OutputDtype::Bf16,
            ..unsampled
        };
        assert!(matches!(
            s.commit(&plan, &bf16, SHAPE),
            Err(PlanError::OutputDtype { .. })
        ));
    }

    #[test]
    fn refused_rows_fail_their_request_only() {
        use crate::kernels::RowFault;
        let mut s = RunnerState::default();
        let plan = StepPlan {
            step: 0,
            new_requests: vec![new_req("a", &[1, 2, 3]), new_req("b", &[9])],
            chunks: vec![chunk("a", 0, 2, false), chunk("b", 0, 1, false)],
            released: vec![],
            ..Default::default()
        };
        s.prepare(&plan).unwrap();
        let out = BatchOutput {
            captured: f32_bytes(&[0.0; 6]),
            dtype: OutputDtype::F32,
            sampled: vec![None, None],
            bad_rows: vec![BadRow {
                row: 1,
                layer: 3,
                fault: RowFault::NonFinite,
            }],
        };
        let (res, caps) = s.commit(&plan, &out, SHAPE).unwrap();
        assert_eq!(caps.len(), 1);
        assert_eq!(caps[0].id, id("b"));
        assert_eq!(res.failed.len(), 1);
        let (who, why) = &res.failed[0];
        assert_eq!(who, &id("a"));
        assert!(
            why.contains("layer 3") && why.contains("position 1"),
            "{why}"
        );
    }
}
