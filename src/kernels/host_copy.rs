//! Large host copies on rayon's threads.
//!
//! Between two forwards the model runner's thread copies a step's captured rows twice while a
//! GPU waits: out of the download buffer, then into one chunk per request (256 MiB each for an
//! 8B model's step of 8,192 tokens, 4 layers, bf16). One thread copies ~10 GB/s; a server's
//! memory moves several times that with more threads.

use rayon::prelude::*;

/// Copies shorter than this stay on the calling thread (a task costs more than it saves).
const PARALLEL_FROM: usize = 8 << 20;

/// Bytes per task.
const PIECE: usize = 1 << 20;

/// Replaces `dst`'s bytes with `src`'s, reusing its allocation (grown exactly where short).
pub fn copy_into(dst: &mut Vec<u8>, src: &[u8]) {
    dst.clear();
    dst.reserve_exact(src.len());
    if src.len() < PARALLEL_FROM {
        dst.extend_from_slice(src);
        return;
    }
    let spare = &mut dst.spare_capacity_mut()[..src.len()];
    (spare.par_chunks_mut(PIECE))
        .zip(src.par_chunks(PIECE))
        .for_each(|(d, s)| {
            debug_assert_eq!(d.len(), s.len());
            // SAFETY: pieces at the same offsets of equal lengths, so `d` holds `s.len()`
            // bytes; `d` is `dst`'s unused capacity, `s` another borrow: no overlap.
            unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), d.as_mut_ptr().cast(), s.len()) };
        });
    // SAFETY: the first `src.len()` bytes were all written just above.
    unsafe { dst.set_len(src.len()) };
}

/// Keeps `bytes` as the buffer a later step writes into when they hold more than `spare`: the
/// capture backends' `recycle` (pages already mapped, not fresh ones).
pub fn keep_larger(spare: &mut Vec<u8>, bytes: Vec<u8>) {
    if bytes.capacity() > spare.capacity() {
        *spare = bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8 ^ seed).collect()
    }

    #[test]
    fn copies_every_byte_in_place_of_the_old_ones() {
        let mut dst = bytes(3 * PARALLEL_FROM, 9);
        let addr = dst.as_ptr();
        // Serial and parallel sizes, ragged last pieces, shorter than the old contents.
        for len in [
            0,
            1,
            PIECE + 3,
            PARALLEL_FROM - 1,
            PARALLEL_FROM,
            2 * PARALLEL_FROM + 17,
        ] {
            let src = bytes(len, len as u8);
            copy_into(&mut dst, &src);
            assert!(dst == src, "{len} bytes");
            assert_eq!(dst.as_ptr(), addr, "{len} bytes: the allocation is reused");
        }
        // Longer than the allocation: grown to exactly the length.
        let src = bytes(3 * PARALLEL_FROM + 5, 1);
        copy_into(&mut dst, &src);
        assert!(dst == src);
        assert_eq!(dst.capacity(), src.len());
    }
}
