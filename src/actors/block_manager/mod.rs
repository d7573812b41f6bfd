//! Block manager actor: owns the KV-block bookkeeping (ids only; the model runner owns the
//! memory). One `Reserve` per step, `Release` on every exit path (abort, error),
//! `ReleaseFinished` for finished requests; with prefix reuse ([`prefix`]) finished requests'
//! full blocks and their captured rows (`CacheRows`, from the connector) are kept for later
//! requests that start with the same tokens.

mod pool;
pub mod prefix;

use std::sync::Arc;

use kameo::prelude::*;

pub use pool::{BlockPool, Grant, PoolStats, SnapshotSlots};

use crate::actors::messages::RequestId;

/// A waiting request that could start: its id, the tokens it will ever hold in the cache, and
/// its prompt (for prefix reuse).
#[derive(Debug, Clone)]
pub struct Candidate {
    pub id: RequestId,
    pub tokens: usize,
    pub prompt: Arc<[u32]>,
}

/// Reserve blocks for each candidate, in order, stopping at the first that does not fit (so
/// a large request is not starved by smaller ones behind it).
#[derive(Debug, Clone)]
pub struct Reserve {
    pub candidates: Vec<Candidate>,
}

/// Blocks granted to a prefix of the candidates.
#[derive(Debug, Clone, Default, Reply)]
pub struct Reservation {
    pub granted: Vec<(RequestId, Grant)>,
}

/// Give back every block of these requests.
#[derive(Debug, Clone)]
pub struct Release(pub Vec<RequestId>);

/// These requests computed every token: their prompts' full blocks may be kept for reuse.
#[derive(Debug, Clone)]
pub struct ReleaseFinished(pub Vec<RequestId>);

/// A finished request's captured rows for prefix reuse: `row_bytes` per token of `tokens`, in
/// the connector's chunks (shared, not copied: only the blocks kept are copied, within the
/// cache's byte bound).
#[derive(Debug, Clone)]
pub struct CacheRows {
    pub tokens: Vec<u32>,
    pub chunks: Arc<[Vec<u8>]>,
    pub row_bytes: usize,
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
        let mut granted = Vec::new();
        let hits_before = self.pool.stats().prefix.hit_tokens;
        for c in msg.candidates {
            match self.pool.allocate(&c.id, c.tokens, &c.prompt) {
                Some(grant) => granted.push((c.id, grant)),
                None => break,
            }
        }
        let hits = self.pool.stats().prefix.hit_tokens - hits_before;
        metrics::counter!("hsx_prefix_cache_hit_tokens_total").increment(hits);
        self.record_gauges();
        Reservation { granted }
    }
}

impl Message<Release> for BlockManager {
    type Reply = ();
    async fn handle(&mut self, msg: Release, _: &mut Context<Self, Self::Reply>) {
        for id in &msg.0 {
            self.pool.free(id, false);
        }
        self.record_gauges();
    }
}

impl Message<ReleaseFinished> for BlockManager {
    type Reply = ();
    async fn handle(&mut self, msg: ReleaseFinished, _: &mut Context<Self, Self::Reply>) {
        for id in &msg.0 {
            self.pool.free(id, true);
        }
        self.record_gauges();
    }
}

impl Message<CacheRows> for BlockManager {
    type Reply = ();
    async fn handle(&mut self, msg: CacheRows, _: &mut Context<Self, Self::Reply>) {
        self.pool
            .offer_rows(&msg.tokens, &msg.chunks, msg.row_bytes);
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

    pub async fn release_finished(&self, ids: Vec<RequestId>) {
        if !ids.is_empty() {
            let _ = self.actor.tell(ReleaseFinished(ids)).await;
        }
    }

    /// Offers a finished request's rows for prefix reuse.
    pub async fn cache_rows(&self, rows: CacheRows) {
        let _ = self.actor.tell(rows).await;
    }

    pub async fn stats(&self) -> Option<PoolStats> {
        self.actor.ask(Stats).await.ok()
    }

    pub async fn stop(&self) {
        let _ = self.actor.stop_gracefully().await;
        self.actor.wait_for_shutdown().await;
    }
}
