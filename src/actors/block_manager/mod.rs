//! Block manager actor: owns the KV-block bookkeeping (ids only; the model runner owns the
//! memory). One `Reserve` per step, `Release` on every exit path (finish, abort, error).

mod pool;

use kameo::prelude::*;

pub use pool::{BlockPool, Grant, PoolStats};

use crate::actors::messages::RequestId;

/// Reserve blocks for each candidate, in order, stopping at the first that does not fit (so
/// a large request is not starved by smaller ones behind it).
#[derive(Debug, Clone)]
pub struct Reserve {
    /// (request, tokens it will ever hold in the cache).
    pub candidates: Vec<(RequestId, usize)>,
}

/// Blocks granted to a prefix of the candidates.
#[derive(Debug, Clone, Default, Reply)]
pub struct Reservation {
    pub granted: Vec<(RequestId, Grant)>,
}

/// Give back every block of these requests.
#[derive(Debug, Clone)]
pub struct Release(pub Vec<RequestId>);

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
        for (id, tokens) in msg.candidates {
            match self.pool.allocate(&id, tokens) {
                Some(grant) => granted.push((id, grant)),
                None => break,
            }
        }
        Reservation { granted }
    }
}

impl Message<Release> for BlockManager {
    type Reply = ();
    async fn handle(&mut self, msg: Release, _: &mut Context<Self, Self::Reply>) {
        for id in &msg.0 {
            self.pool.free(id);
        }
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

    pub async fn reserve(&self, candidates: Vec<(RequestId, usize)>) -> Reservation {
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

    pub async fn stats(&self) -> Option<PoolStats> {
        self.actor.ask(Stats).await.ok()
    }

    pub async fn stop(&self) {
        let _ = self.actor.stop_gracefully().await;
        self.actor.wait_for_shutdown().await;
    }
}
