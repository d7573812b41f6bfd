//! The scheduler's plain state: queues, admission, chunked-prefill planning and applying a
//! step's committed output (vLLM v1's schedule / update_from_output). No tensors, no channels.

use std::collections::{HashMap, VecDeque};

pub use super::limits::{SchedulerLimits, SubmitError};
use crate::actors::block_manager::{Candidate, Grant};
use crate::actors::messages::{
    FinishedRequest, NewRequestData, PlannedChunk, Request, RequestId, SlotCopy, StepOutput,
    StepPlan,
};
use crate::kernels::plan::RECURRENT_BLOCK;

/// What the actor must do after a state change: messages to the other actors.
#[derive(Debug, Default)]
pub struct Effects {
    /// Requests with all rows computed: the connector writes their files.
    pub finished: Vec<FinishedRequest>,
    /// Requests whose blocks go back to the pool.
    pub release_blocks: Vec<RequestId>,
    /// Requests whose pending rows the connector drops.
    pub discard: Vec<RequestId>,
    /// Failure events to publish.
    pub failed: Vec<(RequestId, String)>,
}

/// The cached rows `0..rows` of a request admitted with a prefix hit, one entry per block
/// (opaque bytes the scheduler only forwards to the connector).
#[derive(Debug)]
pub struct PrefixRows {
    pub id: RequestId,
    pub rows: usize,
    pub blocks: Vec<std::sync::Arc<[u8]>>,
}

#[derive(Debug)]
struct Running {
    req: Request,
    /// Tokens already through the model (the runner's committed count).
    computed: usize,
    generated: Vec<u32>,
    grant: Grant,
    /// Whether the runner has been sent this request's tokens and blocks.
    announced: bool,
}

impl Running {
    /// This request's next chunk under `budget` tokens: (start, len, sample).
    fn next_chunk(&self, budget: usize) -> Option<(usize, usize, bool)> {
        let prompt = self.req.prompt.len();
        let wanted = self.req.max_tokens as usize;
        if self.computed < prompt {
            // A chunk ends at the next snapshot position: the state is copied there.
            let to_snapshot = self
                .next_snapshot()
                .map_or(usize::MAX, |(p, _)| p - self.computed);
            let to_end = (prompt - self.computed).min(to_snapshot);
            let mut len = to_end.min(budget);
            if len < to_end {
                // The budget cut this chunk.
                len = self.aligned_cut(len);
            }
            let sample = self.computed + len == prompt && wanted >= 1;
            return (len > 0).then_some((self.computed, len, sample));
        }
        let known = prompt + self.generated.len();
        let decode = self.computed < known && self.generated.len() < wanted;
        (decode && budget > 0).then_some((self.computed, 1, true))
    }

    /// A chunk of `len` tokens cut by the step budget, shortened to end at a multiple of
    /// [`RECURRENT_BLOCK`] where the request has recurrent state and that leaves a chunk: the
    /// chunked recurrences then see the same blocks as in one pass.
    fn aligned_cut(&self, len: usize) -> usize {
        let end = self.computed + len;
        let aligned = end - end % RECURRENT_BLOCK;
        match self.grant.state_slot {
            Some(_) if aligned > self.computed => aligned - self.computed,
            _ => len,
        }
    }

    /// The first snapshot (position, slot) past the computed tokens (hybrid prefix reuse).
    fn next_snapshot(&self) -> Option<(usize, u32)> {
        let snapshots = &self.grant.snapshots;
        snapshots.iter().copied().find(|&(p, _)| p > self.computed)
    }

    /// The state copies of a chunk `start..end`: the restore of a new request's slot from the
    /// cache before it, the snapshot of its slot after it.
    fn slot_copies(&self, end: usize, new: bool, plan: &mut StepPlan) {
        let Some(slot) = self.grant.state_slot else {
            return;
        };
        if let Some(from) = self.grant.restore_from.filter(|_| new) {
            plan.restores.push(SlotCopy { from, to: slot });
        }
        if let Some((_, to)) = self.next_snapshot().filter(|&(p, _)| p == end) {
            plan.snapshots.push(SlotCopy { from: slot, to });
        }
    }

    fn is_done(&self) -> bool {
        self.computed >= self.req.total_forward_tokens()
            && self.generated.len() >= self.req.max_tokens as usize
    }

    fn finished(&self) -> FinishedRequest {
        let rows = self.req.expected_rows();
        let mut token_ids: Vec<u32> = self.req.prompt.to_vec();
        token_ids.extend(&self.generated);
        token_ids.truncate(rows);
        FinishedRequest {
            id: self.req.id.clone(),
            token_ids,
            output_token_ids: self.generated.clone(),
            path: self.req.path.clone(),
            prefixes: self.req.prefixes.clone(),
        }
    }
}

/// Queue depths and counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, kameo::Reply)]
pub struct SchedulerStats {
    pub waiting: usize,
    pub running: usize,
    pub steps: u64,
    pub tokens_computed: u64,
    /// The part of `tokens_computed` that were prompt tokens.
    pub prompt_tokens_computed: u64,
    /// Hidden-state bytes held for admitted requests (until the connector releases them).
    pub pending_hidden_bytes: usize,
    /// The most `pending_hidden_bytes` has been (never above `max_pending_bytes`).
    pub peak_pending_hidden_bytes: usize,
    /// Requests that waited at the head of the queue for hidden-state bytes to be released.
    pub memory_waits: u64,
    /// The device failed for good ([`SchedulerState::device_lost`]).
    pub device_lost: bool,
}

#[derive(Debug)]
pub struct SchedulerState {
    limits: SchedulerLimits,
    waiting: VecDeque<Request>,
    running: Vec<Running>,
    next_step: u64,
    in_flight: Option<StepPlan>,
    /// Runner-side state to drop with the next plan.
    to_release: Vec<RequestId>,
    /// Running requests to drop (with why) once their step in flight comes back.
    doomed: HashMap<RequestId, String>,
    tokens_computed: u64,
    prompt_tokens_computed: u64,
    /// Blocks granted to requests that could not be admitted (no longer queued, or planned
    /// while a step was in flight).
    unused_grants: Vec<RequestId>,
    /// Hidden-state bytes of each admitted request the connector has not released yet (a list:
    /// a finished id may be submitted again before its file's bytes are released).
    held: HashMap<RequestId, Vec<usize>>,
    held_bytes: usize,
    peak_held_bytes: usize,
    memory_waits: u64,
    /// The waiting request last counted in `memory_waits`.
    held_back: Option<RequestId>,
    /// Cached prefix rows of just-admitted requests (see [`Self::take_prefix_rows`]).
    prefix_rows: Vec<PrefixRows>,
    /// Why the device can run nothing more, once it cannot.
    lost: Option<String>,
}

impl SchedulerState {
    pub fn new(limits: SchedulerLimits) -> Self {
        Self {
            limits,
            waiting: VecDeque::new(),
            running: Vec::new(),
            next_step: 0,
            in_flight: None,
            to_release: Vec::new(),
            doomed: HashMap::new(),
            tokens_computed: 0,
            prompt_tokens_computed: 0,
            unused_grants: Vec::new(),
            held: HashMap::new(),
            held_bytes: 0,
            peak_held_bytes: 0,
            memory_waits: 0,
            held_back: None,
            prefix_rows: Vec::new(),
            lost: None,
        }
    }

    pub fn stats(&self) -> SchedulerStats {
        SchedulerStats {
            waiting: self.waiting.len(),
            running: self.running.len(),
            steps: self.next_step,
            tokens_computed: self.tokens_computed,
            prompt_tokens_computed: self.prompt_tokens_computed,
            pending_hidden_bytes: self.held_bytes,
            peak_pending_hidden_bytes: self.peak_held_bytes,
            memory_waits: self.memory_waits,
            device_lost: self.lost.is_some(),
        }
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty() && self.in_flight.is_none()
    }

    pub fn step_in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Validates and queues a request.
    pub fn submit(&mut self, req: Request) -> Result<(), SubmitError> {
        if let Some(why) = &self.lost {
            return Err(SubmitError::DeviceLost(why.clone()));
        }
        self.limits.validate(&req)?;
        if self.contains(&req.id) {
            return Err(SubmitError::DuplicateId(req.id));
        }
        if self.waiting.len() >= self.limits.max_waiting {
            return Err(SubmitError::Overloaded(self.waiting.len()));
        }
        self.waiting.push_back(req);
        Ok(())
    }

    fn contains(&self, id: &RequestId) -> bool {
        self.waiting.iter().any(|r| &r.id == id) || self.running.iter().any(|r| &r.req.id == id)
    }

    /// Aborts a waiting or running request. A request inside the step in flight is dropped
    /// when that step's output arrives.
    pub fn abort(&mut self, id: &RequestId) -> Effects {
        let mut fx = Effects::default();
        if let Some(pos) = self.waiting.iter().position(|r| &r.id == id) {
            self.waiting.remove(pos);
            fx.failed.push((id.clone(), "aborted".into()));
        } else if self.in_flight_has(id) {
            self.doomed.insert(id.clone(), "aborted".into());
        } else if let Some(pos) = self.running.iter().position(|r| &r.req.id == id) {
            self.running.remove(pos);
            self.drop_running(id, "aborted".into(), &mut fx);
        }
        fx
    }

    fn in_flight_has(&self, id: &RequestId) -> bool {
        self.in_flight
            .as_ref()
            .is_some_and(|p| p.chunks.iter().any(|c| &c.id == id))
    }

    fn drop_running(&mut self, id: &RequestId, why: String, fx: &mut Effects) {
        fx.release_blocks.push(id.clone());
        fx.discard.push(id.clone());
        fx.failed.push((id.clone(), why));
        self.to_release.push(id.clone());
    }

    /// Tokens the running requests take from this step's budget.
    fn running_budget_use(&self) -> usize {
        let mut budget = self.limits.max_num_batched_tokens;
        for r in &self.running {
            if let Some((_, len, _)) = r.next_chunk(budget) {
                budget -= len;
            }
        }
        self.limits.max_num_batched_tokens - budget
    }

    /// Waiting requests that could start in the next step, with the tokens each will keep in
    /// the KV cache; the actor reserves their blocks, then calls [`Self::plan_step`].
    pub fn admission_candidates(&self) -> Vec<Candidate> {
        if self.in_flight.is_some() {
            return Vec::new();
        }
        let mut budget = self.limits.max_num_batched_tokens - self.running_budget_use();
        let slots = self.limits.max_num_seqs.saturating_sub(self.running.len());
        let mut held = self.held_bytes;
        let mut out = Vec::new();
        for req in self.waiting.iter().take(slots) {
            if budget == 0 || !self.fits_memory(held, req) {
                break;
            }
            held += self.limits.hidden_bytes(req);
            budget -= req.prompt.len().min(budget);
            out.push(Candidate {
                id: req.id.clone(),
                tokens: req.total_forward_tokens(),
                prompt: req.prompt.clone(),
            });
        }
        out
    }

    /// Admits the granted requests (a prefix of the candidates) and plans the next step.
    /// Returns `None` when there is nothing to run (or a step is already in flight).
    pub fn plan_step(&mut self, granted: Vec<(RequestId, Grant)>) -> Option<StepPlan> {
        if self.in_flight.is_some() || self.lost.is_some() {
            self.unused_grants
                .extend(granted.into_iter().map(|(id, _)| id));
            return None;
        }
        self.admit(granted);
        self.note_memory_wait();
        let mut plan = StepPlan {
            step: self.next_step,
            ..StepPlan::default()
        };
        let mut budget = self.limits.max_num_batched_tokens;
        for r in &mut self.running {
            let Some((start, len, sample)) = r.next_chunk(budget) else {
                continue;
            };
            budget -= len;
            r.slot_copies(start + len, !r.announced, &mut plan);
            if !r.announced {
                r.announced = true;
                plan.new_requests.push(NewRequestData {
                    id: r.req.id.clone(),
                    prompt: r.req.prompt.clone(),
                    block_ids: r.grant.blocks.clone(),
                    state_slot: r.grant.state_slot,
                    cached_tokens: r.grant.cached_tokens,
                });
            }
            let capture_len = r.req.expected_rows().saturating_sub(start).min(len);
            plan.chunks.push(PlannedChunk {
                id: r.req.id.clone(),
                start,
                len,
                sample,
                capture_len,
            });
        }
        if plan.chunks.is_empty() {
            return None;
        }
        plan.released = std::mem::take(&mut self.to_release);
        self.next_step += 1;
        self.in_flight = Some(plan.clone());
        Some(plan)
    }

    /// Moves the granted requests from the queue to running, in queue order. They are
    /// the candidates up to the first that did not fit, less those waiting for blocks a
    /// running request is computing (they stay queued, in place).
    fn admit(&mut self, granted: Vec<(RequestId, Grant)>) {
        let mut grants: HashMap<RequestId, Grant> = granted.into_iter().collect();
        let mut queue = VecDeque::with_capacity(self.waiting.len());
        for req in std::mem::take(&mut self.waiting) {
            match grants.remove(&req.id) {
                Some(grant) => self.start(req, grant),
                None => queue.push_back(req),
            }
        }
        self.waiting = queue;
        self.unused_grants.extend(grants.into_keys());
    }

    fn start(&mut self, req: Request, mut grant: Grant) {
        if self.held_back.as_ref() == Some(&req.id) {
            self.held_back = None;
        }
        self.hold(&req);
        if grant.cached_tokens > 0 {
            self.prefix_rows.push(PrefixRows {
                id: req.id.clone(),
                rows: grant.cached_tokens,
                blocks: std::mem::take(&mut grant.prefix_rows),
            });
        }
        self.running.push(Running {
            computed: grant.cached_tokens,
            req,
            generated: Vec::new(),
            grant,
            announced: false,
        });
    }

    /// Whether `req` can be admitted with `held` bytes already held for admitted requests.
    fn fits_memory(&self, held: usize, req: &Request) -> bool {
        held.saturating_add(self.limits.hidden_bytes(req)) <= self.limits.max_pending_bytes
    }

    fn hold(&mut self, req: &Request) {
        let bytes = self.limits.hidden_bytes(req);
        self.held.entry(req.id.clone()).or_default().push(bytes);
        self.held_bytes += bytes;
        self.peak_held_bytes = self.peak_held_bytes.max(self.held_bytes);
    }

    /// Counts the request at the head of the queue once if the bytes bound keeps it waiting
    /// (while a slot is free for it).
    fn note_memory_wait(&mut self) {
        let Some(head) = self.waiting.front() else {
            return;
        };
        let slot_free = self.running.len() < self.limits.max_num_seqs;
        if slot_free
            && !self.fits_memory(self.held_bytes, head)
            && self.held_back.as_ref() != Some(&head.id)
        {
            self.held_back = Some(head.id.clone());
            self.memory_waits += 1;
            tracing::debug!(
                id = %head.id,
                held = self.held_bytes,
                max = self.limits.max_pending_bytes,
                "admission waits for hidden-state bytes to be released"
            );
        }
    }

    /// The connector holds nothing more of `id` (file written or failed, rows discarded): its
    /// bytes no longer count against `max_pending_bytes`. Returns the bytes released.
    pub fn release_hidden(&mut self, id: &RequestId) -> usize {
        let Some(list) = self.held.get_mut(id) else {
            return 0;
        };
        let bytes = list.remove(0);
        if list.is_empty() {
            self.held.remove(id);
        }
        self.held_bytes -= bytes;
        bytes
    }

    /// The cached rows of requests admitted with a prefix hit: the actor hands them to the connector as the request's first chunk, before the
    /// plan goes to the runner. Opaque bytes: the scheduler only forwards them.
    pub fn take_prefix_rows(&mut self) -> Vec<PrefixRows> {
        std::mem::take(&mut self.prefix_rows)
    }

    /// Grants that [`Self::plan_step`] could not use; their blocks must be released.
    pub fn take_unused_grants(&mut self) -> Vec<RequestId> {
        std::mem::take(&mut self.unused_grants)
    }

    /// Applies the committed output of the step in flight.
    pub fn apply(&mut self, out: &StepOutput) -> Effects {
        let mut fx = Effects::default();
        let Some(plan) = self.in_flight.take() else {
            return fx;
        };
        if plan.step != out.step {
            self.in_flight = Some(plan);
            return fx;
        }
        let sampled: HashMap<&RequestId, u32> = out.sampled.iter().map(|(i, t)| (i, *t)).collect();
        for (id, why) in &out.failed {
            self.doomed.insert(id.clone(), why.clone());
        }
        for chunk in &plan.chunks {
            let Some(r) = self.running.iter_mut().find(|r| r.req.id == chunk.id) else {
                continue;
            };
            let prompt_part = r
                .req
                .prompt
                .len()
                .saturating_sub(chunk.start)
                .min(chunk.len);
            r.computed += chunk.len;
            self.tokens_computed += chunk.len as u64;
            self.prompt_tokens_computed += prompt_part as u64;
            if chunk.sample {
                match sampled.get(&chunk.id) {
                    Some(&t) => r.generated.push(t),
                    None => {
                        let why = "internal error: the runner sampled no token".to_owned();
                        self.doomed.insert(chunk.id.clone(), why);
                    }
                }
            }
        }
        self.retire(&mut fx);
        fx
    }

    /// The step in flight failed: every request in it fails.
    pub fn fail_step(&mut self, step: u64, error: &str) -> Effects {
        let mut fx = Effects::default();
        let Some(plan) = self.in_flight.take_if(|p| p.step == step) else {
            return fx;
        };
        for chunk in &plan.chunks {
            if let Some(pos) = self.running.iter().position(|r| r.req.id == chunk.id) {
                self.running.remove(pos);
                self.doomed.remove(&chunk.id);
                self.drop_running(&chunk.id, format!("model runner error: {error}"), &mut fx);
            }
        }
        fx
    }

    /// Moves finished and aborted requests out of `running`.
    fn retire(&mut self, fx: &mut Effects) {
        let mut keep = Vec::with_capacity(self.running.len());
        for r in std::mem::take(&mut self.running) {
            let id = r.req.id.clone();
            if let Some(why) = self.doomed.remove(&id) {
                self.drop_running(&id, why, fx);
            } else if r.is_done() {
                fx.finished.push(r.finished());
                fx.release_blocks.push(id.clone());
                self.to_release.push(id);
            } else {
                keep.push(r);
            }
        }
        self.running = keep;
    }

    /// The device can run nothing more (a sticky CUDA error): the step in flight, every
    /// running and every waiting request fail with `error`, and nothing is admitted again —
    /// instead of failing each later step the same way.
    pub fn device_lost(&mut self, step: u64, error: &str) -> Effects {
        let why = format!("the device is lost: {error}");
        self.in_flight.take_if(|p| p.step == step);
        let mut fx = self.drain_waiting(&why);
        for r in std::mem::take(&mut self.running) {
            self.doomed.remove(&r.req.id);
            self.drop_running(&r.req.id, why.clone(), &mut fx);
        }
        self.lost = Some(why);
        fx
    }

    /// Fails everything waiting (shutdown without drain).
    pub fn drain_waiting(&mut self, why: &str) -> Effects {
        let mut fx = Effects::default();
        for r in self.waiting.drain(..) {
            fx.failed.push((r.id, why.to_owned()));
        }
        fx
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "prefix_wait_tests.rs"]
mod prefix_wait_tests;

#[cfg(test)]
#[path = "hybrid_chunk_tests.rs"]
mod hybrid_chunk_tests;
