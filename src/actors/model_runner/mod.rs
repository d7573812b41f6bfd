//! Model runner: owns the backend (device, weights, cache memory) on its own OS thread, fed
//! plans through a bounded flume channel. For each step it sends the captured rows of every
//! request straight to the connector (and, with prefix reuse, the rows of each completed
//! prompt block to the block manager), then reports the committed output to the scheduler.

mod block_rows;
mod state;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
            let mut times = RunnerTimes::default();
            let mut waiting = Instant::now();
            while let Ok(plan) = plans.recv() {
                let started = times.waited(waiting.elapsed());
                let result = run_step(
                    &mut state,
                    backend.as_mut(),
                    shape,
                    &plan,
                    &links,
                    &mut times,
                );
                times.stepped(started.elapsed());
                waiting = Instant::now();
                if links.scheduler.tell(result).blocking_send().is_err() {
                    tracing::warn!("scheduler gone; model runner stops");
                    break;
                }
            }
            times.log();
        })
}

/// Where the runner thread's time goes: in the backend's forward (on a GPU: launching, then
/// waiting for the device and copying the captured rows out of its buffer), in the runner's
/// own work after it (cutting the rows per request, handing them on: a full connector mailbox
/// waits there), and waiting for the scheduler's next plan. Per step as metrics, in total in
/// one log line when the runner ends: a device that idles between steps shows as host work
/// and waiting.
#[derive(Debug, Default)]
struct RunnerTimes {
    steps: u64,
    forward: Duration,
    host: Duration,
    waiting: Duration,
    /// The forward of the step in progress.
    this_forward: Duration,
}

impl RunnerTimes {
    /// Records the wait for a plan; returns when the step starts.
    fn waited(&mut self, d: Duration) -> Instant {
        self.waiting += d;
        metrics::histogram!("hsx_runner_wait_seconds").record(d.as_secs_f64());
        Instant::now()
    }

    fn forwarded(&mut self, d: Duration) {
        self.this_forward = d;
        self.forward += d;
        metrics::histogram!("hsx_runner_forward_seconds").record(d.as_secs_f64());
    }

    /// The step took `d` in all, its forward included.
    fn stepped(&mut self, d: Duration) {
        let host = d.saturating_sub(std::mem::take(&mut self.this_forward));
        self.steps += 1;
        self.host += host;
        metrics::histogram!("hsx_runner_host_seconds").record(host.as_secs_f64());
    }

    fn log(&self) {
        tracing::info!(
            "model runner: {} steps; forward {:.3} s, host work after it {:.3} s, waiting for plans {:.3} s",
            self.steps,
            self.forward.as_secs_f64(),
            self.host.as_secs_f64(),
            self.waiting.as_secs_f64()
        );
    }
}

fn run_step(
    state: &mut RunnerState,
    backend: &mut dyn Backend,
    shape: RowShape,
    plan: &StepPlan,
    links: &RunnerLinks,
    times: &mut RunnerTimes,
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
    let started = Instant::now();
    let out = catch_unwind(AssertUnwindSafe(|| backend.forward(&batch)));
    times.forwarded(started.elapsed());
    let out = match out {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_work_is_each_step_less_its_forward() {
        let ms = Duration::from_millis;
        let mut t = RunnerTimes::default();
        t.waited(ms(5));
        t.forwarded(ms(30));
        t.stepped(ms(42));
        t.waited(ms(1));
        t.forwarded(ms(20));
        t.stepped(ms(21));
        assert_eq!(t.steps, 2);
        assert_eq!((t.forward, t.host, t.waiting), (ms(50), ms(13), ms(6)));
        // A step that failed before its forward: all host work.
        t.stepped(ms(3));
        assert_eq!(t.host, ms(16));
    }
}
