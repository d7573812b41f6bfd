//! The hub's state: sequence numbering, the bounded in-memory journal and the subscriber list.

use std::collections::VecDeque;

use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

use super::EventHubOptions;
use super::disk::DiskJournal;
use crate::actors::messages::{CompletionEvent, EventKind, RequestId};

/// Events replayed to a new subscriber.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Replay {
    /// Every kept event with `seq > from_seq`, oldest first.
    pub events: Vec<CompletionEvent>,
    /// Some events after `from_seq` were already forgotten: the subscriber has a hole.
    pub truncated: bool,
}

/// Numbers events from 1 upward, keeps the last `journal_capacity` of them and fans them out.
///
/// Sequence numbers are contiguous, so the kept events are exactly the range
/// `oldest_kept_seq()..=last_seq()`. A later disk journal can hook into [`Self::publish`] (append
/// before fan-out) and rebuild the state at start-up with [`Self::restore`].
#[derive(Debug)]
pub struct EventJournal {
    next_seq: u64,
    kept: VecDeque<CompletionEvent>,
    capacity: usize,
    subscribers: Vec<mpsc::Sender<CompletionEvent>>,
    subscriber_capacity: usize,
    dropped_subscribers: u64,
    /// Appended (and fsync'd) before each fan-out, when the hub journals to disk.
    disk: Option<DiskJournal>,
}

impl EventJournal {
    pub fn new(options: &EventHubOptions) -> Self {
        Self {
            next_seq: 1,
            kept: VecDeque::with_capacity(options.journal_capacity.min(4096)),
            capacity: options.journal_capacity,
            subscribers: Vec::new(),
            // tokio's mpsc panics on a zero capacity; one slot is the smallest bounded buffer.
            subscriber_capacity: options.subscriber_capacity.max(1),
            dropped_subscribers: 0,
            disk: None,
        }
    }

    /// Appends every event published from now on to `disk` before fanning it out.
    pub fn with_disk(mut self, disk: DiskJournal) -> Self {
        self.disk = Some(disk);
        self
    }

    /// A journal that continues after events recovered from disk: numbering resumes after the
    /// last one. Events that are not in strictly ascending order are skipped.
    pub fn restore(
        options: &EventHubOptions,
        events: impl IntoIterator<Item = CompletionEvent>,
    ) -> Self {
        let mut journal = Self::new(options);
        for event in events {
            if event.seq >= journal.next_seq {
                journal.next_seq = event.seq.saturating_add(1);
                journal.keep(event);
            }
        }
        journal
    }

    /// Numbers the event, keeps it and offers it to every subscriber without waiting: a
    /// subscriber whose buffer is full is disconnected (it can resubscribe from its last seq).
    pub fn publish(&mut self, id: RequestId, kind: EventKind) -> CompletionEvent {
        let event = CompletionEvent {
            seq: self.next_seq,
            id,
            kind,
        };
        self.next_seq += 1;
        self.keep(event.clone());
        self.append_to_disk(&event);
        self.fan_out(&event);
        metrics::counter!("hsx_events_published_total").increment(1);
        event
    }

    /// A disk error is logged and counted, never fatal: the event still goes out live and
    /// stays in memory; only a restart could lose it.
    fn append_to_disk(&mut self, event: &CompletionEvent) {
        let Some(disk) = &mut self.disk else { return };
        let mut result = disk.append(event);
        if result.is_ok() && disk.wants_compaction() {
            result = disk.rewrite(self.kept.iter());
        }
        if let Err(e) = result {
            metrics::counter!("hsx_event_journal_errors_total").increment(1);
            tracing::error!(path = %disk.path().display(), seq = event.seq, "event journal: {e}");
        }
    }

    /// Every kept event with `seq > from_seq`, and whether some of them were already forgotten.
    pub fn replay_after(&self, from_seq: u64) -> Replay {
        let start = self.kept.partition_point(|e| e.seq <= from_seq);
        Replay {
            events: self.kept.range(start..).cloned().collect(),
            truncated: from_seq.saturating_add(1) < self.first_available_seq(),
        }
    }

    /// Registers a subscriber: the replay (empty when `from_seq` is `None`: live events only)
    /// and a bounded receiver of every event published from now on. Both happen in one call, so
    /// no event falls between the replay and the live stream, and none comes twice.
    pub fn subscribe(
        &mut self,
        from_seq: Option<u64>,
    ) -> (Replay, mpsc::Receiver<CompletionEvent>) {
        let replay = from_seq.map(|s| self.replay_after(s)).unwrap_or_default();
        let (tx, rx) = mpsc::channel(self.subscriber_capacity);
        self.subscribers.push(tx);
        (replay, rx)
    }

    /// The seq of the last published event (0 before the first).
    pub fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }

    pub fn oldest_kept_seq(&self) -> Option<u64> {
        self.kept.front().map(|e| e.seq)
    }

    pub fn kept_len(&self) -> usize {
        self.kept.len()
    }

    pub fn subscriber_count(&self) -> usize {
        self.subscribers.len()
    }

    /// Subscribers disconnected so far because they fell behind.
    pub fn dropped_subscribers(&self) -> u64 {
        self.dropped_subscribers
    }

    fn keep(&mut self, event: CompletionEvent) {
        if self.capacity == 0 {
            return;
        }
        if self.kept.len() == self.capacity {
            self.kept.pop_front();
        }
        self.kept.push_back(event);
    }

    /// The smallest seq a subscriber can still get (the next one when nothing is kept).
    fn first_available_seq(&self) -> u64 {
        self.oldest_kept_seq().unwrap_or(self.next_seq)
    }

    fn fan_out(&mut self, event: &CompletionEvent) {
        let mut dropped = 0;
        self.subscribers
            .retain(|tx| match tx.try_send(event.clone()) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) => {
                    dropped += 1;
                    false
                }
                // The subscriber went away on its own: nothing to report.
                Err(TrySendError::Closed(_)) => false,
            });
        if dropped > 0 {
            tracing::warn!(
                seq = event.seq,
                dropped,
                "disconnected event subscribers that fell behind"
            );
            self.dropped_subscribers += dropped;
            metrics::counter!("hsx_subscribers_dropped_total").increment(dropped);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn options(journal: usize, subscriber: usize) -> EventHubOptions {
        EventHubOptions {
            journal_capacity: journal,
            subscriber_capacity: subscriber,
            mailbox: 8,
        }
    }

    fn rid(s: &str) -> RequestId {
        RequestId::new(s).unwrap()
    }

    fn failed(msg: &str) -> EventKind {
        EventKind::Failed { error: msg.into() }
    }

    fn seqs(events: &[CompletionEvent]) -> Vec<u64> {
        events.iter().map(|e| e.seq).collect()
    }

    fn drain(rx: &mut mpsc::Receiver<CompletionEvent>) -> Vec<u64> {
        let mut out = Vec::new();
        while let Ok(e) = rx.try_recv() {
            out.push(e.seq);
        }
        out
    }

    #[test]
    fn numbers_events_from_one() {
        let mut j = EventJournal::new(&options(16, 4));
        assert_eq!(j.last_seq(), 0);
        let a = j.publish(rid("a"), failed("x"));
        let kind = EventKind::Completed {
            path: PathBuf::from("/o/b.safetensors"),
            num_tokens: 3,
            layer_ids: vec![0, 2],
            bytes: 10,
            output_token_ids: vec![],
        };
        let b = j.publish(rid("b"), kind.clone());
        assert_eq!((a.seq, b.seq), (1, 2));
        assert_eq!(b.id, rid("b"));
        assert_eq!(b.kind, kind);
        assert_eq!(j.last_seq(), 2);
    }

    #[test]
    fn replay_after_returns_later_events() {
        let mut j = EventJournal::new(&options(16, 4));
        for i in 0..5 {
            j.publish(rid(&format!("r{i}")), failed("x"));
        }
        assert_eq!(seqs(&j.replay_after(0).events), [1, 2, 3, 4, 5]);
        assert_eq!(seqs(&j.replay_after(3).events), [4, 5]);
        assert!(j.replay_after(5).events.is_empty());
        assert!(j.replay_after(99).events.is_empty());
        assert!(!j.replay_after(0).truncated);
    }

    #[test]
    fn journal_is_bounded_and_reports_holes() {
        let mut j = EventJournal::new(&options(3, 4));
        for _ in 0..10 {
            j.publish(rid("r"), failed("x"));
        }
        assert_eq!(j.kept_len(), 3);
        assert_eq!(j.oldest_kept_seq(), Some(8));
        let r = j.replay_after(2);
        assert_eq!(seqs(&r.events), [8, 9, 10]);
        assert!(r.truncated, "seqs 3..=7 are gone");
        let r = j.replay_after(7);
        assert_eq!(seqs(&r.events), [8, 9, 10]);
        assert!(!r.truncated);
    }

    #[test]
    fn zero_capacity_keeps_nothing_but_still_numbers() {
        let mut j = EventJournal::new(&options(0, 0));
        j.publish(rid("a"), failed("x"));
        let (replay, mut rx) = j.subscribe(Some(0));
        assert!(replay.events.is_empty());
        assert!(replay.truncated);
        assert_eq!(j.publish(rid("b"), failed("y")).seq, 2);
        assert_eq!(drain(&mut rx), [2]);
    }

    #[test]
    fn subscribe_replays_then_streams_live() {
        let mut j = EventJournal::new(&options(16, 4));
        j.publish(rid("a"), failed("x"));
        j.publish(rid("b"), failed("x"));
        let (replay, mut rx) = j.subscribe(Some(1));
        assert_eq!(seqs(&replay.events), [2]);
        j.publish(rid("c"), failed("x"));
        assert_eq!(drain(&mut rx), [3]);
        // Live-only subscription: no replay.
        let (replay, mut live) = j.subscribe(None);
        assert!(replay.events.is_empty() && !replay.truncated);
        j.publish(rid("d"), failed("x"));
        assert_eq!(drain(&mut live), [4]);
        assert_eq!(drain(&mut rx), [4]);
    }

    #[test]
    fn slow_subscriber_is_dropped_others_continue() {
        let mut j = EventJournal::new(&options(64, 2));
        let (_, mut slow) = j.subscribe(None);
        let (_, mut fast) = j.subscribe(None);
        let mut got_fast = Vec::new();
        for _ in 0..5 {
            j.publish(rid("r"), failed("x"));
            got_fast.extend(drain(&mut fast));
        }
        assert_eq!(got_fast, [1, 2, 3, 4, 5]);
        assert_eq!(j.subscriber_count(), 1);
        assert_eq!(j.dropped_subscribers(), 1);
        // The slow one sees what fitted, then the end of its stream...
        assert_eq!(drain(&mut slow), [1, 2]);
        assert!(slow.try_recv().is_err() && slow.is_closed());
        // ...and loses nothing by resubscribing from its last seq.
        let (replay, _) = j.subscribe(Some(2));
        assert_eq!(seqs(&replay.events), [3, 4, 5]);
        assert!(!replay.truncated);
    }

    #[test]
    fn closed_subscriber_is_forgotten() {
        let mut j = EventJournal::new(&options(4, 4));
        let (_, rx) = j.subscribe(None);
        drop(rx);
        j.publish(rid("a"), failed("x"));
        assert_eq!(j.subscriber_count(), 0);
        assert_eq!(j.dropped_subscribers(), 0);
    }

    #[test]
    fn restore_resumes_numbering() {
        let mut old = EventJournal::new(&options(8, 4));
        for _ in 0..4 {
            old.publish(rid("r"), failed("x"));
        }
        let kept = old.replay_after(0).events;
        let mut j = EventJournal::restore(&options(2, 4), kept);
        assert_eq!(j.last_seq(), 4);
        assert_eq!(seqs(&j.replay_after(0).events), [3, 4]);
        assert_eq!(j.publish(rid("r"), failed("x")).seq, 5);
    }
}
