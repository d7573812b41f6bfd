//! The `f32` path: bf16 (or f16) weights widened panel by panel and multiplied by the `gemm`
//! crate (f32 FMA on AVX2 / AVX-512F), so memory holds 16 bits while the numerics are f32
//! compute.

use rayon::prelude::*;

use super::PackedHalf;
use crate::kernels::cpu::matmul::matmul_wt_rows;

/// Weight rows widened per panel: 256 rows × k f32 is 1 MiB at k = 1024, inside a 2 MiB L2
/// (Sapphire Rapids) but not a 512 KiB one (Zen 3), where widening is bound by its stores.
const PANEL: usize = 256;

thread_local! {
    /// The widened panel, reused by every call on this thread (a fresh allocation of this
    /// size is a page-faulting mmap per call).
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

pub(super) fn matmul(a: &[f32], m: usize, w: &PackedHalf, c: &mut [f32], threads: usize) {
    SCRATCH.with_borrow_mut(|wide| panels(a, m, w, c, threads, wide));
}

/// Panel by panel of output columns: widen, then multiply straight into the panel's columns
/// of `c` (gemm writes with `c`'s row stride: no product buffer, no copy out).
fn panels(a: &[f32], m: usize, w: &PackedHalf, c: &mut [f32], threads: usize, wide: &mut Vec<f32>) {
    let (n, k) = (w.n, w.k);
    wide.resize(PANEL.min(n) * k, 0.0);
    for n0 in (0..n).step_by(PANEL) {
        let nn = (n - n0).min(PANEL);
        let panel = &mut wide[..nn * k];
        if k > 0 {
            panel
                .par_chunks_mut(k)
                .enumerate()
                .for_each(|(j, row)| w.row_into(n0 + j, row));
        }
        matmul_wt_rows(a, m, k, panel, nn, (&mut c[n0..], n), threads);
    }
}
