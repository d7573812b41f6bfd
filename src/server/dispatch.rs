//! One EventHub subscription for all HTTP requests: each completion event is routed to the
//! handler waiting for that request id (a map of oneshot senders), instead of one subscription
//! per request. If the hub drops this subscriber for lagging, it resubscribes from its last seq,
//! so no event is lost.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{oneshot, watch};

use super::Shared;
use crate::actors::events::Subscription;
use crate::actors::messages::{CompletionEvent, EventKind, RequestId};

#[derive(Debug)]
pub struct Dispatcher {
    // A std mutex: the critical sections are a map insert or remove, never an await.
    waiters: Mutex<HashMap<RequestId, oneshot::Sender<CompletionEvent>>>,
    /// Becomes true when the dispatcher stopped (the engine's hub stopped).
    stopped: watch::Sender<bool>,
}

impl Default for Dispatcher {
    fn default() -> Self {
        Self {
            waiters: Mutex::new(HashMap::new()),
            stopped: watch::Sender::new(false),
        }
    }
}

/// Removes its waiter when dropped (the HTTP client went away) and, unless the request
/// ended, aborts it so that no work is done for nobody.
pub struct WaitGuard {
    shared: Arc<Shared>,
    id: RequestId,
    armed: bool,
}

impl WaitGuard {
    /// The request ended (its event arrived): nothing to clean up.
    pub fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.shared.dispatcher().unregister(&self.id);
        let shared = self.shared.clone();
        let id = self.id.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { shared.abort(id).await });
        }
    }
}

impl Dispatcher {
    /// Registers interest in `id`'s event; call before submitting it.
    pub fn register(&self, id: RequestId) -> oneshot::Receiver<CompletionEvent> {
        let (tx, rx) = oneshot::channel();
        if *self.stopped.borrow() {
            return rx; // dropped sender: the receiver sees the end at once
        }
        self.lock().insert(id, tx);
        rx
    }

    /// A guard that unregisters and aborts `id` unless disarmed.
    pub fn guard(shared: &Arc<Shared>, id: RequestId) -> WaitGuard {
        WaitGuard {
            shared: shared.clone(),
            id,
            armed: true,
        }
    }

    pub fn unregister(&self, id: &RequestId) {
        self.lock().remove(id);
    }

    pub fn waiting(&self) -> usize {
        self.lock().len()
    }

    /// Resolves once the dispatcher has stopped (every waiter answered or dropped).
    pub async fn stopped(&self) {
        let mut rx = self.stopped.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<RequestId, oneshot::Sender<CompletionEvent>>> {
        // A panic while holding this lock cannot leave the map inconsistent.
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn deliver(&self, event: CompletionEvent) {
        let state = match &event.kind {
            EventKind::Completed { .. } => "completed",
            EventKind::Failed { .. } => "failed",
        };
        metrics::counter!("hsx_requests_total", "state" => state).increment(1);
        if let Some(tx) = self.lock().remove(&event.id) {
            let _ = tx.send(event);
        }
    }

    /// Routes events until the engine's hub stops, then drops every remaining waiter.
    /// `start_seq` is the hub's last seq when `sub` was made (where to resume if it ends early).
    pub(crate) async fn run(
        self: Arc<Self>,
        shared: Arc<Shared>,
        mut sub: Subscription,
        start_seq: u64,
    ) {
        loop {
            while let Some(event) = sub.next().await {
                self.deliver(event);
            }
            // The stream ended: either the hub stopped, or it dropped us for lagging.
            if shared.engine().event_stats().await.is_none() {
                break;
            }
            tracing::warn!("event dispatcher fell behind; resubscribing");
            let from = sub.last_seq().unwrap_or(start_seq);
            sub = shared.engine().subscribe(Some(from)).await;
        }
        self.lock().clear();
        self.stopped.send_replace(true);
    }
}
