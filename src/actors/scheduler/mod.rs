//! Scheduler actor: owns the queues and the step loop. It plans a step (admitting requests
//! whose blocks the block manager grants), hands it to the model runner, and applies the
//! committed output when it comes back. It never touches tensors.

mod limits;
mod state;

use kameo::error::Infallible;
use kameo::prelude::*;

pub use state::{Effects, SchedulerLimits, SchedulerState, SchedulerStats, SubmitError};

use crate::actors::block_manager::BlockManagerHandle;
use crate::actors::connector::ConnectorHandle;
use crate::actors::events::EventHubHandle;
use crate::actors::messages::{
    CapturedChunk, EventKind, HiddenStatesReleased, ReleaseReceiver, Request, RequestId,
    StepOutput, StepPlan,
};

/// The scheduler's peers.
pub struct SchedulerLinks {
    pub blocks: BlockManagerHandle,
    pub runner: flume::Sender<StepPlan>,
    pub connector: ConnectorHandle,
    pub events: EventHubHandle,
    /// The connector's reports of hidden states it no longer holds (taken at start and
    /// forwarded as [`Released`]); without it admitted bytes are never given back.
    pub releases: Option<ReleaseReceiver>,
}

pub struct Scheduler {
    state: SchedulerState,
    links: SchedulerLinks,
    accepting: bool,
    /// When the step in flight was sent to the runner and how many tokens it holds (metrics).
    step_started: Option<(std::time::Instant, usize)>,
}

impl Actor for Scheduler {
    type Args = (SchedulerState, SchedulerLinks);
    type Error = Infallible;

    async fn on_start(
        (state, mut links): Self::Args,
        actor: ActorRef<Self>,
    ) -> Result<Self, Self::Error> {
        if let Some(releases) = links.releases.take() {
            tokio::spawn(forward_releases(releases, actor.downgrade()));
        }
        Ok(Self {
            state,
            links,
            accepting: true,
            step_started: None,
        })
    }
}

/// Queue a request.
pub struct Submit(pub Request);
/// Abort a request (waiting or running); a `failed` event follows.
pub struct Abort(pub RequestId);
/// The model runner's answer for a step.
pub enum StepResult {
    Done(StepOutput),
    Failed {
        step: u64,
        error: String,
    },
    /// The device can run nothing more: every request fails and admission stops.
    DeviceLost {
        step: u64,
        error: String,
    },
}
/// Queue depths and counters.
pub struct Status;
/// Stop accepting new requests (work already queued still runs).
pub struct StopAccepting;
/// The connector no longer holds these requests' hidden states.
pub struct Released(pub Vec<RequestId>);

/// Forwards the connector's release reports to the scheduler, batched, until either side ends.
/// Waiting here for the scheduler's mailbox never blocks the connector.
async fn forward_releases(mut rx: ReleaseReceiver, scheduler: WeakActorRef<Scheduler>) {
    let mut batch = Vec::new();
    while rx.recv_many(&mut batch, 256).await > 0 {
        let ids = batch.drain(..).map(|HiddenStatesReleased(id)| id).collect();
        let Some(actor) = scheduler.upgrade() else {
            return;
        };
        if actor.tell(Released(ids)).await.is_err() {
            return;
        }
    }
}

impl Message<Submit> for Scheduler {
    type Reply = Result<(), SubmitError>;
    async fn handle(&mut self, msg: Submit, _: &mut Context<Self, Self::Reply>) -> Self::Reply {
        if !self.accepting {
            return Err(SubmitError::ShuttingDown);
        }
        self.state.submit(msg.0)?;
        self.schedule().await;
        Ok(())
    }
}

impl Message<Abort> for Scheduler {
    type Reply = ();
    async fn handle(&mut self, msg: Abort, _: &mut Context<Self, Self::Reply>) {
        let fx = self.state.abort(&msg.0);
        self.execute(fx).await;
        self.schedule().await;
    }
}

impl Message<StepResult> for Scheduler {
    type Reply = ();
    async fn handle(&mut self, msg: StepResult, _: &mut Context<Self, Self::Reply>) {
        if let Some((started, tokens)) = self.step_started.take() {
            metrics::histogram!("hsx_step_duration_seconds").record(started.elapsed());
            metrics::histogram!("hsx_step_tokens").record(tokens as f64);
            metrics::counter!("hsx_steps_total").increment(1);
        }
        let before = self.state.stats();
        let fx = match msg {
            StepResult::Done(out) => self.state.apply(&out),
            StepResult::Failed { step, error } => {
                tracing::error!(step, %error, "step failed");
                self.state.fail_step(step, &error)
            }
            StepResult::DeviceLost { step, error } => {
                tracing::error!(step, %error, "device lost: failing every request, admitting none");
                metrics::gauge!("hsx_device_lost").set(1.0);
                self.state.device_lost(step, &error)
            }
        };
        let after = self.state.stats();
        metrics::counter!("hsx_tokens_computed_total")
            .increment(after.tokens_computed - before.tokens_computed);
        metrics::counter!("hsx_prompt_tokens_total")
            .increment(after.prompt_tokens_computed - before.prompt_tokens_computed);
        self.execute(fx).await;
        self.schedule().await;
    }
}

impl Message<Status> for Scheduler {
    type Reply = SchedulerStats;
    async fn handle(&mut self, _: Status, _: &mut Context<Self, Self::Reply>) -> SchedulerStats {
        self.state.stats()
    }
}

impl Message<Released> for Scheduler {
    type Reply = ();
    async fn handle(&mut self, msg: Released, _: &mut Context<Self, Self::Reply>) {
        for id in &msg.0 {
            self.state.release_hidden(id);
        }
        self.schedule().await;
    }
}

impl Message<StopAccepting> for Scheduler {
    type Reply = ();
    async fn handle(&mut self, _: StopAccepting, _: &mut Context<Self, Self::Reply>) {
        self.accepting = false;
    }
}

impl Scheduler {
    /// Plans and dispatches the next step if none is in flight.
    async fn schedule(&mut self) {
        if self.state.step_in_flight() {
            return;
        }
        let candidates = self.state.admission_candidates();
        let reservation = self.links.blocks.reserve(candidates).await;
        let waits = self.state.stats().memory_waits;
        let plan = self.state.plan_step(reservation.granted);
        let waited = self.state.stats().memory_waits - waits;
        metrics::counter!("hsx_admission_memory_waits_total").increment(waited);
        self.links
            .blocks
            .release(self.state.take_unused_grants())
            .await;
        self.send_prefix_rows().await;
        let Some(plan) = plan else { return };
        let step = plan.step;
        let tokens = plan.chunks.iter().map(|c| c.len).sum();
        self.step_started = Some((std::time::Instant::now(), tokens));
        if self.links.runner.send_async(plan).await.is_err() {
            let fx = self.state.fail_step(step, "the model runner has stopped");
            Box::pin(self.execute(fx)).await;
        }
    }

    /// Hands the cached rows of requests admitted with a prefix hit to the connector as their
    /// first chunk (rows `0..cached`); sent before the plan, so before the runner's chunks.
    async fn send_prefix_rows(&mut self) {
        for state::PrefixRows { id, rows, blocks } in self.state.take_prefix_rows() {
            let chunk = CapturedChunk {
                id,
                start: 0,
                rows,
                data: blocks.concat().into(),
            };
            // A stopped connector only happens at shutdown.
            let _ = self.links.connector.capture(chunk).await;
        }
    }

    /// Sends the effects of a state change to the other actors.
    async fn execute(&mut self, fx: Effects) {
        // A stopped connector or hub only happens at shutdown; nothing is left to tell then.
        for f in fx.finished {
            let _ = self.links.connector.finish(f).await;
        }
        for id in fx.discard {
            let _ = self.links.connector.discard(id).await;
        }
        // Blocks published for reuse while the request ran stay cached.
        self.links.blocks.release(fx.release_blocks).await;
        for (id, error) in fx.failed {
            let _ = self
                .links
                .events
                .publish(id, EventKind::Failed { error })
                .await;
        }
    }
}

/// Cloneable handle to the scheduler.
#[derive(Clone)]
pub struct SchedulerHandle {
    actor: ActorRef<Scheduler>,
}

impl SchedulerHandle {
    pub fn spawn(state: SchedulerState, links: SchedulerLinks, mailbox: usize) -> Self {
        let actor = Scheduler::spawn_with_mailbox((state, links), mailbox::bounded(mailbox));
        Self { actor }
    }

    pub fn actor(&self) -> &ActorRef<Scheduler> {
        &self.actor
    }

    pub async fn submit(&self, req: Request) -> Result<(), SubmitError> {
        match self.actor.ask(Submit(req)).await {
            Ok(()) => Ok(()),
            Err(SendError::HandlerError(e)) => Err(e),
            Err(_) => Err(SubmitError::ShuttingDown),
        }
    }

    pub async fn abort(&self, id: RequestId) {
        let _ = self.actor.tell(Abort(id)).await;
    }

    pub async fn status(&self) -> Option<SchedulerStats> {
        self.actor.ask(Status).await.ok()
    }

    pub async fn stop_accepting(&self) {
        let _ = self.actor.ask(StopAccepting).await;
    }

    pub async fn stop(&self) {
        let _ = self.actor.stop_gracefully().await;
        self.actor.wait_for_shutdown().await;
    }
}
