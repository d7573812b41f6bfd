//! Model runner: owns the backend (device, weights, cache memory) on its own OS thread, fed
//! plans through a bounded flume channel. For each step it sends the captured rows of every
//! request straight to the connector (and, with prefix reuse, the rows of each completed
//! prompt block to the block manager), then reports the committed output to the scheduler.

mod block_rows;
mod state;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::thread::JoinHandle;

use kameo::actor::ActorRef;

pub use state::{PlanError, PreparedStep, RowShape, RunnerState};

use crate::actors::block_manager::{BlockManagerHandle, BlocksComputed};
use crate::actors::chunk_bytes::{ChunkPool, MIN_POOLED_BYTES};
use crate::actors::connector::ConnectorHandle;
use crate::actors::messages::{SlotCopy, StepPlan};
use crate::actors::scheduler::{Scheduler, StepResult};
use crate::kernels::{Backend, BackendError, Batch};

/// Where a runner sends its results.
pub struct RunnerLinks {
    pub scheduler: ActorRef<Scheduler>,
    pub connector: ConnectorHandle,
    /// With prefix reuse: the block manager, and its block size.
    pub blocks: Option<(BlockManagerHandle, usize)>,
}

/// Starts the runner thread; it ends when every sender of `plans` is dropped. `step_tokens`:
/// the most tokens a plan holds (spare chunk allocations are kept for two steps' rows).
pub fn spawn(
    mut backend: Box<dyn Backend>,
    shape: RowShape,
    step_tokens: usize,
    plans: flume::Receiver<StepPlan>,
    links: RunnerLinks,
) -> std::io::Result<JoinHandle<()>> {
    let spare_bytes = step_tokens.saturating_mul(shape.bytes()).saturating_mul(2);
    std::thread::Builder::new()
        .name("hsx-runner".into())
        .spawn(move || {
            let state = match &links.blocks {
                Some((_, block_size)) => RunnerState::with_block_rows(*block_size, shape.bytes()),
                None => RunnerState::default(),
            };
            let mut state = state.with_chunk_pool(ChunkPool::new(spare_bytes, MIN_POOLED_BYTES));
            while let Ok(plan) = plans.recv() {
                let result = run_step(&mut state, backend.as_mut(), shape, &plan, &links);
                if links.scheduler.tell(result).blocking_send().is_err() {
                    tracing::warn!("scheduler gone; model runner stops");
                    break;
                }
            }
        })
}

fn run_step(
    state: &mut RunnerState,
    backend: &mut dyn Backend,
    shape: RowShape,
    plan: &StepPlan,
    links: &RunnerLinks,
) -> StepResult {
    let failed = |error: String| StepResult::Failed {
        step: plan.step,
        error,
    };
    let prepared = match state.prepare(plan) {
        Ok(p) => p,
        Err(e) => return failed(e.to_string()),
    };
    if prepared.seqs.is_empty() {
        return StepResult::Done(crate::actors::messages::StepOutput {
            step: plan.step,
            ..Default::default()
        });
    }
    if let Some(e) = crate::faults::step_fault(plan) {
        // Test hook (src/faults.rs): as if the backend failed this step.
        return failed(e);
    }
    if let Err(e) = copy_slots(backend, &plan.restores) {
        return failed(format!("restoring cached recurrent state: {e}"));
    }
    let batch = Batch {
        token_ids: &prepared.token_ids,
        seqs: &prepared.seqs,
    };
    let out = match catch_unwind(AssertUnwindSafe(|| backend.forward(&batch))) {
        Ok(Ok(out)) => out,
        Ok(Err(e @ BackendError::DeviceLost(_))) => {
            return StepResult::DeviceLost {
                step: plan.step,
                error: e.to_string(),
            };
        }
        Ok(Err(e)) => return failed(e.to_string()),
        Err(_) => return failed("the backend panicked".into()),
    };
    let (output, captures) = match state.commit(plan, &out, shape) {
        Ok(r) => r,
        Err(e) => return failed(e.to_string()),
    };
    // The rows are copied out per request: the step's buffer goes back for the next step.
    backend.recycle_captured(out.captured);
    metrics::gauge!("hsx_runner_spare_chunk_bytes").set(state.spare_chunk_bytes() as f64);
    if let Err(e) = copy_slots(backend, &plan.snapshots) {
        return failed(format!("snapshotting recurrent state: {e}"));
    }
    // Completed prompt blocks are published before the scheduler hears of the step, so the
    // admission it plans next sees them (and a request it releases has published them).
    if let Some((blocks, _)) = &links.blocks {
        let computed = state.computed_blocks(&captures);
        if !computed.is_empty() {
            blocks.computed_blocking(BlocksComputed(computed));
        }
    }
    // Captures are queued before the scheduler hears of the step, so the connector always
    // holds a request's rows before the scheduler's `Finish` for it.
    for chunk in captures {
        if let Err(e) = links.connector.capture_blocking(chunk) {
            return failed(format!("connector unavailable: {e}"));
        }
    }
    StepResult::Done(output)
}

/// Copies recurrent-state slots (prefix reuse of hybrid models).
fn copy_slots(backend: &mut dyn Backend, copies: &[SlotCopy]) -> Result<(), BackendError> {
    if copies.is_empty() {
        return Ok(());
    }
    let pairs: Vec<(usize, usize)> = (copies.iter())
        .map(|c| (c.from as usize, c.to as usize))
        .collect();
    catch_unwind(AssertUnwindSafe(|| backend.copy_state_slots(&pairs)))
        .unwrap_or_else(|_| Err(BackendError::Compute("the backend panicked".into())))
}
