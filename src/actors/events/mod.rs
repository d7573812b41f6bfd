//! EventHub (DESIGN.md §2): numbers every completion/failure event, keeps the last ones in a
//! bounded in-memory journal and fans them out to subscribers.
//!
//! A subscriber that reconnects with the last sequence number it saw misses nothing the journal
//! still holds; a slow subscriber (its bounded buffer full) is disconnected instead of stalling
//! the publisher. With a [`DiskJournal`] every event is appended and fsync'd under the output
//! directory before it goes out, so `from_seq` also works across restarts. [`EventJournal`] holds the logic (tested without an actor); [`EventHub`] is the
//! kameo actor around it and [`EventHubHandle`] the typed way to talk to it.

mod actor;
mod disk;
mod journal;

pub use actor::{EventHub, EventHubHandle, HubStats, Publish, Stats, Subscribe, Subscription};
pub use disk::{DiskJournal, open_journal};
pub use journal::{EventJournal, Replay};

/// Sizes of the hub's bounded buffers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventHubOptions {
    /// Events kept in memory for replay (the oldest are forgotten first).
    pub journal_capacity: usize,
    /// Live events buffered per subscriber before it is disconnected as too slow.
    pub subscriber_capacity: usize,
    /// The hub's mailbox.
    pub mailbox: usize,
}

impl Default for EventHubOptions {
    fn default() -> Self {
        Self {
            journal_capacity: 65_536,
            subscriber_capacity: 1024,
            mailbox: 1024,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventsError {
    #[error("the event hub is not running")]
    NotRunning,
}
