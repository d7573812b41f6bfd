//! The bytes of a captured chunk, and the runner's pool of their allocations.
//!
//! Each step the runner cuts the step's captured rows into one buffer per request, which the
//! connector holds until the request's file is written. A fresh buffer of that size is a fresh
//! mapping whose first write faults in every page: 268 MB of rows (an 8B model's step of 8,192
//! tokens, 4 layers, bf16) took ~180 ms to copy into fresh pages on the development VM and
//! ~26 ms into pages already mapped, time in which a GPU waits for the next step. So a chunk's
//! allocation goes back to the runner when the chunk is dropped (its file written or the
//! request discarded), over a bounded channel, and a later step's rows are copied into it.
//!
//! The spare allocations (on their way back and kept by the runner) are bounded in bytes by
//! a counter the returning chunks share with the pool: an idle engine holds at most that
//! much, not every allocation its last burst of requests returned.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::kernels::host_copy::copy_into;

/// The runner's pooling threshold: smaller chunks are plain allocations (the allocator
/// reuses small ones itself).
pub const MIN_POOLED_BYTES: usize = 1 << 20;

/// Spare allocations at most, on their way back and kept (a full channel drops them).
const MAX_SPARE: usize = 64;

/// A chunk's bytes. Dropped, its allocation goes back to the pool it came from, if any.
pub struct ChunkBytes {
    data: Vec<u8>,
    home: Option<Home>,
}

/// Where a pooled chunk's allocation goes back to.
#[derive(Clone)]
struct Home {
    returns: flume::Sender<Vec<u8>>,
    /// Capacity of the spare allocations, on their way back or kept by the pool.
    spare: Arc<AtomicUsize>,
    max_bytes: usize,
}

impl Home {
    /// Sends `buf` back if the spare bytes stay within the bound; else it is freed here.
    fn give_back(&self, buf: Vec<u8>) {
        let cap = buf.capacity();
        let reserved = self
            .spare
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held + cap <= self.max_bytes).then_some(held + cap)
            });
        // A full or closed channel (the runner gone): freed here after all.
        if reserved.is_ok() && self.returns.try_send(buf).is_err() {
            self.spare.fetch_sub(cap, Ordering::AcqRel);
        }
    }
}

impl From<Vec<u8>> for ChunkBytes {
    /// Bytes that go nowhere when dropped.
    fn from(data: Vec<u8>) -> Self {
        Self { data, home: None }
    }
}

impl Deref for ChunkBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.data
    }
}

impl Clone for ChunkBytes {
    /// A copy of the bytes in a plain allocation (only the original goes back).
    fn clone(&self) -> Self {
        self.data.clone().into()
    }
}

impl fmt::Debug for ChunkBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChunkBytes({} bytes)", self.data.len())
    }
}

impl Drop for ChunkBytes {
    fn drop(&mut self) {
        if let Some(home) = self.home.take() {
            home.give_back(std::mem::take(&mut self.data));
        }
    }
}

/// The runner's spare chunk allocations: at most `max_bytes` of capacity, counting those on
/// their way back.
pub struct ChunkPool {
    free: Vec<Vec<u8>>,
    min_bytes: usize,
    returns: flume::Receiver<Vec<u8>>,
    home: Home,
}

impl ChunkPool {
    /// A pool keeping at most `max_bytes` of spare capacity (0: chunks are plain allocations),
    /// for chunks of at least `min_bytes`.
    pub fn new(max_bytes: usize, min_bytes: usize) -> Self {
        let (tx, returns) = flume::bounded(MAX_SPARE);
        let home = Home {
            returns: tx,
            spare: Arc::new(AtomicUsize::new(0)),
            max_bytes,
        };
        Self {
            free: Vec::new(),
            min_bytes,
            returns,
            home,
        }
    }

    /// A chunk holding a copy of `rows`, in a returned allocation of at least their size and
    /// at most twice it where there is one.
    pub fn copy(&mut self, rows: &[u8]) -> ChunkBytes {
        if rows.len() < self.min_bytes || self.home.max_bytes == 0 {
            return rows.to_vec().into();
        }
        self.collect_returns();
        let mut data = self.take_fitting(rows.len()).unwrap_or_default();
        copy_into(&mut data, rows);
        ChunkBytes {
            data,
            home: Some(self.home.clone()),
        }
    }

    /// Capacity kept for later chunks (on its way back included).
    pub fn spare_bytes(&self) -> usize {
        self.home.spare.load(Ordering::Acquire)
    }

    fn collect_returns(&mut self) {
        // At most MAX_SPARE: the channel's capacity.
        self.free.extend(self.returns.try_iter());
    }

    /// The smallest spare allocation holding `len` bytes, if it is at most twice that (a much
    /// larger one would hold its extra pages for as long as the chunk is pending); else the
    /// largest smaller one, grown in place of a fresh one: a large allocation is its own
    /// mapping, which grows by remapping, so only the growth is faulted in.
    fn take_fitting(&mut self, len: usize) -> Option<Vec<u8>> {
        let cap = |i: usize| self.free[i].capacity();
        let indices = 0..self.free.len();
        let fitting = (indices.clone())
            .filter(|&i| (len..=len.saturating_mul(2)).contains(&cap(i)))
            .min_by_key(|&i| cap(i));
        let i = fitting.or_else(|| indices.filter(|&i| cap(i) < len).max_by_key(|&i| cap(i)))?;
        let buf = self.free.swap_remove(i);
        self.home.spare.fetch_sub(buf.capacity(), Ordering::AcqRel);
        Some(buf)
    }
}

impl fmt::Debug for ChunkPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChunkPool")
            .field("kept", &self.free.len())
            .field("spare_bytes", &self.spare_bytes())
            .field("max_bytes", &self.home.max_bytes)
            .finish()
    }
}

impl Default for ChunkPool {
    /// Keeps nothing: every chunk a plain allocation.
    fn default() -> Self {
        Self::new(0, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    fn rows(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    #[test]
    fn a_dropped_chunks_allocation_holds_a_later_one() {
        let mut pool = ChunkPool::new(64 * MIB, MIB);
        let first = pool.copy(&rows(3 * MIB, 1));
        let addr = first.as_ptr();
        drop(first);
        // Fewer bytes, other values: the same allocation, exactly the new bytes.
        let want = rows(2 * MIB, 7);
        let second = pool.copy(&want);
        assert_eq!(second.as_ptr(), addr, "the returned allocation is reused");
        assert_eq!(&*second, want.as_slice());
        assert_eq!(pool.spare_bytes(), 0);
    }

    #[test]
    fn allocations_much_larger_than_the_chunk_are_not_used() {
        let mut pool = ChunkPool::new(64 * MIB, MIB);
        let (big, mid) = (pool.copy(&rows(8 * MIB, 1)), pool.copy(&rows(5 * MIB, 2)));
        let mid_addr = mid.as_ptr();
        drop((big, mid));
        // Of the two that fit, the smaller.
        let fit = pool.copy(&rows(4 * MIB, 3));
        assert_eq!(fit.as_ptr(), mid_addr);
        assert_eq!(pool.spare_bytes(), 8 * MIB);
        // More than twice the chunk: a fresh allocation, the spare one kept.
        let small = pool.copy(&rows(3 * MIB, 4));
        assert_eq!(small.data.capacity(), 3 * MIB);
        assert_eq!(pool.spare_bytes(), 8 * MIB);
    }

    #[test]
    fn without_a_fitting_one_the_largest_smaller_allocation_grows() {
        let mut pool = ChunkPool::new(64 * MIB, MIB);
        drop((pool.copy(&rows(2 * MIB, 1)), pool.copy(&rows(3 * MIB, 2))));
        let want = rows(7 * MIB, 3);
        let grown = pool.copy(&want);
        assert_eq!(&*grown, want.as_slice());
        assert_eq!(grown.data.capacity(), 7 * MIB, "grown exactly, not doubled");
        assert_eq!(pool.spare_bytes(), 2 * MIB, "the 3 MiB one was taken");
    }

    #[test]
    fn spare_capacity_is_bounded_and_small_chunks_are_plain() {
        let mut pool = ChunkPool::new(5 * MIB, MIB);
        let chunks: Vec<_> = (0..3).map(|i| pool.copy(&rows(2 * MIB, i))).collect();
        drop(chunks);
        // Before the pool takes any back (an idle runner): two of the three fit in 5 MiB, the
        // third was freed by its chunk.
        assert_eq!(pool.spare_bytes(), 4 * MIB);
        let taken = pool.copy(&rows(MIB, 9));
        assert_eq!(pool.spare_bytes(), 2 * MIB);
        drop(taken);
        assert_eq!(pool.spare_bytes(), 4 * MIB);
        let small = pool.copy(&rows(MIB - 1, 3));
        assert!(small.home.is_none());
        let unpooled = ChunkPool::default().copy(&rows(2 * MIB, 0));
        assert!(unpooled.home.is_none());
    }

    #[test]
    fn chunks_outliving_their_pool_are_dropped_quietly() {
        let mut pool = ChunkPool::new(64 * MIB, MIB);
        let chunk = pool.copy(&rows(2 * MIB, 5));
        let copy = chunk.clone();
        drop(pool);
        assert_eq!(&*copy, &*chunk);
        drop(chunk);
        assert!(copy.home.is_none());
    }
}
