//! The EventHub actor: a thin kameo wrapper that moves messages into [`EventJournal`].

use kameo::prelude::*;
use tokio::sync::mpsc;

use super::{EventHubOptions, EventJournal, EventsError, Replay};
use crate::actors::messages::{CompletionEvent, EventKind, RequestId};

#[derive(Actor)]
pub struct EventHub {
    journal: EventJournal,
}

/// Number, keep and fan out one event. The reply is its seq (ignored by `tell`).
#[derive(Debug, Clone)]
pub struct Publish {
    pub id: RequestId,
    pub kind: EventKind,
}

/// Subscribe, replaying every kept event after `from_seq` first (`None`: live events only).
#[derive(Debug, Clone, Copy)]
pub struct Subscribe {
    pub from_seq: Option<u64>,
}

/// Replies with [`HubStats`].
#[derive(Debug, Clone, Copy)]
pub struct Stats;

/// The hub's counters, for `status` and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Reply)]
pub struct HubStats {
    pub last_seq: u64,
    pub subscribers: usize,
    pub dropped_subscribers: u64,
}

impl Message<Stats> for EventHub {
    type Reply = HubStats;

    async fn handle(&mut self, _: Stats, _: &mut Context<Self, Self::Reply>) -> HubStats {
        HubStats {
            last_seq: self.journal.last_seq(),
            subscribers: self.journal.subscriber_count(),
            dropped_subscribers: self.journal.dropped_subscribers(),
        }
    }
}

impl Message<Publish> for EventHub {
    type Reply = u64;

    async fn handle(&mut self, msg: Publish, _: &mut Context<Self, Self::Reply>) -> u64 {
        self.journal.publish(msg.id, msg.kind).seq
    }
}

impl Message<Subscribe> for EventHub {
    type Reply = Subscription;

    // Replay and registration happen in this one handler, between two publishes: that is what
    // makes the hand-off from replayed to live events gap-free and duplicate-free.
    async fn handle(&mut self, msg: Subscribe, _: &mut Context<Self, Self::Reply>) -> Subscription {
        let (replay, live) = self.journal.subscribe(msg.from_seq);
        Subscription::new(replay, live)
    }
}

/// A subscriber's stream: the replayed events, then live ones.
///
/// `next` returns `None` when the hub disconnected this subscriber (it fell behind) or stopped;
/// resubscribe with `from_seq = last_seq()` to continue without losing anything still kept.
#[derive(Debug, Reply)]
pub struct Subscription {
    replay: std::vec::IntoIter<CompletionEvent>,
    live: mpsc::Receiver<CompletionEvent>,
    truncated: bool,
    last_seq: Option<u64>,
}

impl Subscription {
    fn new(replay: Replay, live: mpsc::Receiver<CompletionEvent>) -> Self {
        Self {
            replay: replay.events.into_iter(),
            live,
            truncated: replay.truncated,
            last_seq: None,
        }
    }

    /// A stream with nothing in it (the hub is gone).
    fn ended() -> Self {
        let (_, live) = mpsc::channel(1);
        Self::new(Replay::default(), live)
    }

    pub async fn next(&mut self) -> Option<CompletionEvent> {
        let event = match self.replay.next() {
            Some(e) => Some(e),
            None => self.live.recv().await,
        };
        self.seen(event)
    }

    /// The next event if one is ready, without waiting.
    pub fn try_next(&mut self) -> Option<CompletionEvent> {
        let event = self.replay.next().or_else(|| self.live.try_recv().ok());
        self.seen(event)
    }

    /// Events after the requested `from_seq` had already left the journal when subscribing.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// The seq of the last event returned, to resubscribe from.
    pub fn last_seq(&self) -> Option<u64> {
        self.last_seq
    }

    fn seen(&mut self, event: Option<CompletionEvent>) -> Option<CompletionEvent> {
        if let Some(e) = &event {
            self.last_seq = Some(e.seq);
        }
        event
    }
}

/// The typed way to talk to the hub; cheap to clone.
#[derive(Debug, Clone)]
pub struct EventHubHandle {
    actor: ActorRef<EventHub>,
}

impl EventHubHandle {
    /// Spawns the hub on the current tokio runtime.
    pub fn spawn(options: EventHubOptions) -> Self {
        Self::spawn_with_journal(EventJournal::new(&options), options.mailbox)
    }

    /// Spawns the hub around an existing journal (for instance one restored from disk).
    pub fn spawn_with_journal(journal: EventJournal, mailbox_capacity: usize) -> Self {
        // A zero-capacity tokio channel panics; one slot is the smallest bounded mailbox.
        let mailbox = mailbox::bounded(mailbox_capacity.max(1));
        let actor = EventHub::spawn_with_mailbox(EventHub { journal }, mailbox);
        Self { actor }
    }

    /// Publishes an event; waits only for mailbox space, never for subscribers.
    pub async fn publish(&self, id: RequestId, kind: EventKind) -> Result<(), EventsError> {
        self.actor
            .tell(Publish { id, kind })
            .await
            .map_err(|_| EventsError::NotRunning)
    }

    /// Publishes and returns the event's seq.
    pub async fn publish_numbered(
        &self,
        id: RequestId,
        kind: EventKind,
    ) -> Result<u64, EventsError> {
        self.actor
            .ask(Publish { id, kind })
            .await
            .map_err(|_| EventsError::NotRunning)
    }

    /// Every kept event after `from_seq` (`None`: none, live events only), then live ones.
    /// A stopped hub gives a stream that ends at once.
    pub async fn subscribe(&self, from_seq: Option<u64>) -> Subscription {
        match self.actor.ask(Subscribe { from_seq }).await {
            Ok(sub) => sub,
            Err(_) => Subscription::ended(),
        }
    }

    pub async fn stats(&self) -> Option<HubStats> {
        self.actor.ask(Stats).await.ok()
    }

    /// Stops the hub after the messages already queued; subscribers' streams then end.
    pub async fn stop(&self) {
        if self.actor.stop_gracefully().await.is_ok() {
            self.actor.wait_for_shutdown().await;
        }
    }

    pub fn actor_ref(&self) -> &ActorRef<EventHub> {
        &self.actor
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rid(s: &str) -> RequestId {
        RequestId::new(s).unwrap()
    }

    fn failed() -> EventKind {
        EventKind::Failed { error: "e".into() }
    }

    #[tokio::test]
    async fn replay_then_live_without_gap() {
        let hub = EventHubHandle::spawn(EventHubOptions::default());
        hub.publish(rid("a"), failed()).await.unwrap();
        assert_eq!(hub.publish_numbered(rid("b"), failed()).await.unwrap(), 2);
        let mut sub = hub.subscribe(Some(0)).await;
        hub.publish(rid("c"), failed()).await.unwrap();
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(sub.next().await.unwrap().id.to_string());
        }
        assert_eq!(got, ["a", "b", "c"]);
        assert_eq!(sub.last_seq(), Some(3));
        assert!(!sub.truncated());
        hub.stop().await;
        assert_eq!(sub.next().await, None);
        assert_eq!(hub.subscribe(None).await.next().await, None);
        assert!(hub.publish(rid("d"), failed()).await.is_err());
    }

    #[tokio::test]
    async fn slow_subscriber_resubscribes_without_loss() {
        let options = EventHubOptions {
            subscriber_capacity: 1,
            ..EventHubOptions::default()
        };
        let hub = EventHubHandle::spawn(options);
        let mut slow = hub.subscribe(None).await;
        for i in 0..4 {
            hub.publish(rid(&format!("r{i}")), failed()).await.unwrap();
        }
        // Ask round-trip: every publish above has been handled.
        let mut fresh = hub.subscribe(None).await;
        assert_eq!(slow.next().await.map(|e| e.seq), Some(1));
        assert_eq!(
            slow.next().await,
            None,
            "disconnected after its buffer filled"
        );
        let mut again = hub.subscribe(slow.last_seq()).await;
        for seq in 2..=4 {
            assert_eq!(again.next().await.map(|e| e.seq), Some(seq));
        }
        hub.publish(rid("late"), failed()).await.unwrap();
        assert_eq!(again.next().await.map(|e| e.seq), Some(5));
        assert_eq!(fresh.next().await.map(|e| e.seq), Some(5));
        assert_eq!(fresh.try_next(), None);
    }
}
