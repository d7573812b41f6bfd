//! Block manager actor: owns the KV-block bookkeeping (ids only; the model runner owns the
//! memory). One `Reserve` per step, `Release` on every exit path (finish, abort, error). With
//! prefix reuse ([`prefix`]) the model runner reports each step's completed prompt blocks with
//! their captured rows (`BlocksComputed`, sent before the scheduler hears of the step): they
//! are kept for later requests, and for requests running at the same time, that start with
//! the same tokens.

mod pool;
pub mod prefix;

use std::sync::Arc;

use kameo::prelude::*;

pub use pool::{BlockPool, Grant, NotGranted, PoolStats, SnapshotSlots};

use crate::actors::messages::RequestId;

/// A waiting request that could start: its id, the tokens it will ever hold in the cache, and
/// its prompt (for prefix reuse).
#[derive(Debug, Clone)]
pub struct Candidate {
    pub id: RequestId,
    pub tokens: usize,
    pub prompt: Arc<[u32]>,
}

/// Reserve blocks for each candidate ([`BlockPool::reserve`]).
#[derive(Debug, Clone)]
pub struct Reserve {
    pub candidates: Vec<Candidate>,
}

/// Blocks granted to candidates, in their order.
#[derive(Debug, Clone, Default, Reply)]
pub struct Reservation {
    pub granted: Vec<(RequestId, Grant)>,
}

/// Give back every block of these requests.
#[derive(Debug, Clone)]
pub struct Release(pub Vec<RequestId>);

/// Prompt blocks a step completed (KV written, rows captured, state snapshotted), per
/// request: blocks `first..first + rows.len()`, the captured rows of each.
#[derive(Debug, Clone, Default)]
pub struct BlocksComputed(pub Vec<ComputedBlocks>);

#[derive(Debug, Clone)]
pub struct ComputedBlocks {
    pub id: RequestId,
    pub first: usize,
    pub rows: Vec<Arc<[u8]>>,
}

/// Current pool occupancy.
#[derive(Debug, Clone, Copy)]
pub struct Stats;

#[derive(Actor)]
pub struct BlockManager {
    pool: BlockPool,
}

impl Message<Reserve> for BlockManager {
    type Reply = Reservation;
    async fn handle(&mut self, msg: Reserve, _: &mut Context<Self, Self::Reply>) -> Reservation {
        let hits_before = self.pool.stats().prefix;
        let granted = self.pool.reserve(&msg.candidates);
        let after = self.pool.stats().prefix;
        metrics::counter!("hsx_prefix_cache_hit_tokens_total")
            .increment(after.hit_tokens - hits_before.hit_tokens);
        metrics::counter!("hsx_prefix_cache_waited_tokens_total")
            .increment(after.waited_tokens - hits_before.waited_tokens);
        self.record_gauges();
        Reservation { granted }
    }
}

impl Message<Release> for BlockManager {
    type Reply = ();
    async fn handle(&mut self, msg: Release, _: &mut Context<Self, Self::Reply>) {
        for id in &msg.0 {
            self.pool.free(id);
        }
        self.record_gauges();
    }
}

impl Message<BlocksComputed> for BlockManager {
    type Reply = ();
    async fn handle(&mut self, msg: BlocksComputed, _: &mut Context<Self, Self::Reply>) {
        for c in msg.0 {
            self.pool.computed(&c.id, c.first, c.rows);
        }
        self.record_gauges();
    }
}

impl BlockManager {
    fn record_gauges(&self) {
        let p = self.pool.stats().prefix;
        metrics::gauge!("hsx_prefix_cache_blocks").set(p.cached_blocks as f64);
        metrics::gauge!("hsx_prefix_cache_bytes").set(p.bytes as f64);
        metrics::gauge!("hsx_prefix_cache_snapshots").set(p.snapshots as f64);
    }
}

impl Message<Stats> for BlockManager {
    type Reply = PoolStats;
    async fn handle(&mut self, _: Stats, _: &mut Context<Self, Self::Reply>) -> PoolStats {
        self.pool.stats()
    }
}

/// Cloneable handle to the block manager.
#[derive(Clone)]
pub struct BlockManagerHandle {
    actor: ActorRef<BlockManager>,
}

impl BlockManagerHandle {
    pub fn spawn(pool: BlockPool, mailbox: usize) -> Self {
        let actor =
            BlockManager::spawn_with_mailbox(BlockManager { pool }, mailbox::bounded(mailbox));
        Self { actor }
    }

    pub async fn reserve(&self, candidates: Vec<Candidate>) -> Reservation {
        if candidates.is_empty() {
            return Reservation::default();
        }
        self.actor
            .ask(Reserve { candidates })
            .await
            .unwrap_or_default()
    }

    pub async fn release(&self, ids: Vec<RequestId>) {
        if !ids.is_empty() {
            let _ = self.actor.tell(Release(ids)).await;
        }
    }

    /// Reports a step's completed prompt blocks from a plain OS thread (the model runner),
    /// blocking while the mailbox is full. Must not be called from an async task.
    pub fn computed_blocking(&self, blocks: BlocksComputed) {
        // A stopped block manager only happens at shutdown: nothing is reused any more.
        let _ = self.actor.tell(blocks).blocking_send();
    }

    pub async fn stats(&self) -> Option<PoolStats> {
        self.actor.ask(Stats).await.ok()
    }

    pub async fn stop(&self) {
        let _ = self.actor.stop_gracefully().await;
        self.actor.wait_for_shutdown().await;
    }
}
