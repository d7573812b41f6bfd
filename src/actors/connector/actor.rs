//! The Connector actor: moves messages into [`ConnectorState`] and runs file writes on tokio's
//! blocking pool, at most `max_concurrent_writes` at once, publishing each outcome.

use std::sync::Arc;

use kameo::prelude::*;
use tokio::sync::{Semaphore, oneshot};

use super::{CompleteHiddenStates, ConnectorError, ConnectorOptions, ConnectorState, FileLayout};
use crate::actors::events::EventHubHandle;
use crate::actors::messages::{
    CapturedChunk, EventKind, FinishedRequest, HiddenStatesReleased, ReleaseSender, RequestId,
};

#[derive(Actor)]
pub struct Connector {
    state: ConnectorState,
    events: EventHubHandle,
    writers: Arc<Semaphore>,
    writes_in_flight: usize,
    writing_bytes: usize,
    drain_waiters: Vec<oneshot::Sender<()>>,
    /// Where to report that a request's hidden states are no longer held (the scheduler's
    /// `max_pending_bytes` accounting).
    releases: Option<ReleaseSender>,
}

/// Reports a request's hidden states as released when dropped: shared by the writes of a
/// request's file and of the files sliced from it, so it fires once, after the last of them
/// ended (whatever the outcome, even if the write task is cancelled).
struct ReleaseOnDrop {
    releases: Option<ReleaseSender>,
    id: RequestId,
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        report_released(self.releases.as_ref(), self.id.clone());
    }
}

fn report_released(releases: Option<&ReleaseSender>, id: RequestId) {
    // A closed channel means the scheduler has stopped: nobody is counting any more.
    if let Some(tx) = releases {
        let _ = tx.send(HiddenStatesReleased(id));
    }
}

/// Append a request's rows (in order; a bad chunk poisons the request).
#[derive(Debug)]
pub struct Capture(pub CapturedChunk);

/// The request produced its last row: write its file, or publish why not.
#[derive(Debug)]
pub struct Finish(pub FinishedRequest);

/// Drop a request's pending rows (abort or failure); nothing is written or published.
#[derive(Debug)]
pub struct Discard(pub RequestId);

/// Replies with a receiver that resolves once no write is in flight.
#[derive(Debug)]
pub struct Flush;

/// Replies with [`ConnectorStats`].
#[derive(Debug)]
pub struct Stats;

/// Host memory held by the connector (for admission control and metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Reply)]
pub struct ConnectorStats {
    pub pending_requests: usize,
    pub pending_bytes: usize,
    pub writes_in_flight: usize,
    /// Hidden states handed to writers and not yet released.
    pub writing_bytes: usize,
}

/// A write task ended (its event is already published).
struct WriteDone {
    bytes: usize,
    /// Dropped once the accounting is updated, so the release is reported after it.
    release: Arc<ReleaseOnDrop>,
}

impl Message<Capture> for Connector {
    type Reply = ();

    async fn handle(&mut self, Capture(chunk): Capture, _: &mut Context<Self, ()>) {
        match self.state.capture(chunk) {
            Ok(()) => {}
            // Already reported when it was poisoned; the finish will say why it failed.
            Err(e @ ConnectorError::Poisoned { .. }) => tracing::debug!("{e}"),
            Err(e) => tracing::warn!("{e}"),
        }
    }
}

impl Message<Finish> for Connector {
    type Reply = ();

    async fn handle(&mut self, Finish(req): Finish, ctx: &mut Context<Self, ()>) {
        let id = req.id.clone();
        match self.state.finish(req) {
            Ok(mut complete) => {
                let release = Arc::new(ReleaseOnDrop {
                    releases: self.releases.clone(),
                    id,
                });
                for prefix in complete.take_prefixes() {
                    self.start_write(prefix, Arc::clone(&release), ctx);
                }
                self.start_write(complete, release, ctx);
            }
            Err(e) => {
                report_released(self.releases.as_ref(), id.clone());
                tracing::warn!("{e}");
                metrics::counter!("hsx_files_failed_total", "kind" => "incomplete").increment(1);
                let failed = EventKind::Failed {
                    error: e.to_string(),
                };
                if self.events.publish(id, failed).await.is_err() {
                    tracing::warn!("event hub gone; failure of a request not reported");
                }
            }
        }
    }
}

impl Message<Discard> for Connector {
    type Reply = ();

    async fn handle(&mut self, Discard(id): Discard, _: &mut Context<Self, ()>) {
        self.state.discard(&id);
        report_released(self.releases.as_ref(), id);
    }
}

impl Message<Flush> for Connector {
    type Reply = oneshot::Receiver<()>;

    async fn handle(&mut self, _: Flush, _: &mut Context<Self, Self::Reply>) -> Self::Reply {
        let (tx, rx) = oneshot::channel();
        if self.writes_in_flight == 0 {
            let _ = tx.send(());
        } else {
            self.drain_waiters.push(tx);
        }
        rx
    }
}

impl Message<Stats> for Connector {
    type Reply = ConnectorStats;

    async fn handle(&mut self, _: Stats, _: &mut Context<Self, Self::Reply>) -> ConnectorStats {
        ConnectorStats {
            pending_requests: self.state.pending_requests(),
            pending_bytes: self.state.pending_bytes(),
            writes_in_flight: self.writes_in_flight,
            writing_bytes: self.writing_bytes,
        }
    }
}

impl Message<WriteDone> for Connector {
    type Reply = ();

    async fn handle(&mut self, done: WriteDone, _: &mut Context<Self, ()>) {
        self.writes_in_flight = self.writes_in_flight.saturating_sub(1);
        self.writing_bytes = self.writing_bytes.saturating_sub(done.bytes);
        drop(done.release);
        if self.writes_in_flight == 0 {
            for waiter in self.drain_waiters.drain(..) {
                let _ = waiter.send(());
            }
        }
    }
}

impl Connector {
    /// Runs the write off the actor's task so captures keep flowing while files are written.
    /// The task publishes the outcome itself (after the rename), then reports back for the
    /// accounting, so an event is never lost even if the connector stops meanwhile.
    /// `release` is dropped (reporting the bytes released once no other write holds it) after
    /// the outcome is published and the write is accounted as ended.
    fn start_write(
        &mut self,
        complete: CompleteHiddenStates,
        release: Arc<ReleaseOnDrop>,
        ctx: &mut Context<Self, ()>,
    ) {
        let bytes = complete.hidden_bytes();
        self.writes_in_flight += 1;
        self.writing_bytes += bytes;
        let writers = Arc::clone(&self.writers);
        let events = self.events.clone();
        ctx.pipe(async move {
            let started = std::time::Instant::now();
            let (id, outcome) = write_file(writers, complete).await;
            match &outcome {
                EventKind::Completed {
                    bytes, num_tokens, ..
                } => {
                    metrics::histogram!("hsx_save_duration_seconds").record(started.elapsed());
                    metrics::counter!("hsx_files_saved_total").increment(1);
                    metrics::counter!("hsx_hidden_state_bytes_written_total").increment(*bytes);
                    // Beside hsx_tokens_computed_total: rows sliced from a longer request's
                    // states (prefix fan-out) are written without being computed.
                    metrics::counter!("hsx_tokens_written_total").increment(*num_tokens as u64);
                }
                EventKind::Failed { .. } => {
                    metrics::counter!("hsx_files_failed_total", "kind" => "write").increment(1);
                }
            }
            if events.publish(id, outcome).await.is_err() {
                tracing::warn!("event hub gone; outcome of a write not reported");
            }
            WriteDone { bytes, release }
        });
    }
}

/// Waits for a writer slot, writes on the blocking pool and turns the result into an event.
async fn write_file(
    writers: Arc<Semaphore>,
    complete: CompleteHiddenStates,
) -> (RequestId, EventKind) {
    let id = complete.id().clone();
    // The semaphore is never closed; without a permit the write would just not be limited.
    let _permit = writers.acquire_owned().await.ok();
    let joined = tokio::task::spawn_blocking(move || {
        // Benchmark-only knob (bench/README.md): measure compute without file writing.
        let written = if discard_output() {
            Ok(complete.hidden_bytes() as u64)
        } else {
            complete.write()
        };
        (written, complete)
    })
    .await;
    let outcome = match joined {
        Ok((Ok(bytes), complete)) => complete.completed_event(bytes),
        Ok((Err(e), _)) => {
            tracing::warn!("{e}");
            EventKind::Failed {
                error: e.to_string(),
            }
        }
        Err(e) => EventKind::Failed {
            error: format!("writer task failed: {e}"),
        },
    };
    (id, outcome)
}

/// The typed way to talk to the connector; cheap to clone.
#[derive(Debug, Clone)]
pub struct ConnectorHandle {
    actor: ActorRef<Connector>,
    layout: Arc<FileLayout>,
}

impl ConnectorHandle {
    /// Spawns the connector on the current tokio runtime; rejects an invalid layout.
    pub fn spawn(
        layout: FileLayout,
        options: ConnectorOptions,
        events: EventHubHandle,
    ) -> Result<Self, ConnectorError> {
        Self::spawn_reporting(layout, options, events, None)
    }

    /// Like [`Self::spawn`], also reporting on `releases` each request whose hidden states it
    /// no longer holds: after its file and the files sliced from it were written or failed,
    /// when its finish fails, and when its rows are discarded (once per finish or discard).
    pub fn spawn_reporting(
        layout: FileLayout,
        options: ConnectorOptions,
        events: EventHubHandle,
        releases: Option<ReleaseSender>,
    ) -> Result<Self, ConnectorError> {
        let state = ConnectorState::new(layout.clone(), options.lock_files)?;
        let connector = Connector {
            state,
            events,
            writers: Arc::new(Semaphore::new(options.max_concurrent_writes.max(1))),
            writes_in_flight: 0,
            writing_bytes: 0,
            drain_waiters: Vec::new(),
            releases,
        };
        // A zero-capacity tokio channel panics; one slot is the smallest bounded mailbox.
        let mailbox = mailbox::bounded(options.mailbox.max(1));
        let actor = Connector::spawn_with_mailbox(connector, mailbox);
        Ok(Self {
            actor,
            layout: Arc::new(layout),
        })
    }

    /// The layout every chunk must follow (`row_bytes()` per row).
    pub fn layout(&self) -> &FileLayout {
        &self.layout
    }

    /// Queues a chunk; waits only for mailbox space.
    pub async fn capture(&self, chunk: CapturedChunk) -> Result<(), ConnectorError> {
        let sent = self.actor.tell(Capture(chunk)).await;
        sent.map_err(|_| ConnectorError::NotRunning)
    }

    /// Queues a chunk from a plain OS thread (the model runner), blocking while the mailbox is
    /// full. Must not be called from an async task (tokio panics there).
    pub fn capture_blocking(&self, chunk: CapturedChunk) -> Result<(), ConnectorError> {
        let sent = self.actor.tell(Capture(chunk)).blocking_send();
        sent.map_err(|_| ConnectorError::NotRunning)
    }

    pub async fn finish(&self, req: FinishedRequest) -> Result<(), ConnectorError> {
        let sent = self.actor.tell(Finish(req)).await;
        sent.map_err(|_| ConnectorError::NotRunning)
    }

    pub async fn discard(&self, id: RequestId) -> Result<(), ConnectorError> {
        let sent = self.actor.tell(Discard(id)).await;
        sent.map_err(|_| ConnectorError::NotRunning)
    }

    /// Resolves once every write started by the messages sent before it has ended and its
    /// event has been handed to the hub.
    pub async fn flush(&self) -> Result<(), ConnectorError> {
        let drained = self.actor.ask(Flush).await;
        let drained = drained.map_err(|_| ConnectorError::NotRunning)?;
        drained.await.map_err(|_| ConnectorError::NotRunning)
    }

    pub async fn stats(&self) -> Result<ConnectorStats, ConnectorError> {
        let stats = self.actor.ask(Stats).await;
        stats.map_err(|_| ConnectorError::NotRunning)
    }

    /// Waits for queued messages and in-flight writes, then stops the actor.
    pub async fn stop(&self) {
        // Not running: nothing left to wait for.
        let _ = self.flush().await;
        if self.actor.stop_gracefully().await.is_ok() {
            self.actor.wait_for_shutdown().await;
        }
    }

    pub fn actor_ref(&self) -> &ActorRef<Connector> {
        &self.actor
    }
}

/// `HSX_BENCH_DISCARD_OUTPUT=1`: files are not written (their writes report success), for the
/// compute-only benchmark run. Not a user setting; read once.
fn discard_output() -> bool {
    static DISCARD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DISCARD.get_or_init(|| std::env::var_os("HSX_BENCH_DISCARD_OUTPUT").is_some_and(|v| v == "1"))
}

#[cfg(test)]
#[path = "actor_tests.rs"]
mod tests;
