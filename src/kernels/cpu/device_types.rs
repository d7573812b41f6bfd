//! The CPU device's buffers, caches and step, and the helpers its ops share.

use std::ops::Range;

use rayon::prelude::*;

use crate::kernels::cpu::kv_cache::KvCache;
use crate::kernels::cpu::recurrent::StateCache;
use crate::kernels::device::{Cols, DevResult, DeviceError};
use crate::kernels::plan::{BatchPlan, SeqState};

/// Activations `[rows, width]`, f32.
#[derive(Debug, Default)]
pub struct CpuBuf {
    pub data: Vec<f32>,
    pub width: usize,
}

impl CpuBuf {
    pub fn rows(&self) -> usize {
        self.data.len().checked_div(self.width).unwrap_or(0)
    }
}

/// The KV cache plus the contiguous q / k / v of the layer being computed.
pub struct CpuKv {
    pub(super) cache: KvCache,
    pub(super) q: Vec<f32>,
    pub(super) k: Vec<f32>,
    pub(super) v: Vec<f32>,
}

/// Recurrent-state slots plus contiguous copies of the strided inputs.
pub struct CpuStates {
    pub(super) cache: StateCache,
    pub(super) first: Vec<f32>,
    pub(super) second: Vec<f32>,
}

/// One forward's plan.
pub struct CpuStep<'a> {
    pub(super) tokens: &'a [u32],
    pub(super) plan: &'a BatchPlan<'a>,
    pub(super) seqs: &'a [SeqState],
}

/// The columns of `c`, row by row, read in place (nothing copied or allocated: a gather into a
/// fresh vector was mapped and faulted in anew on every call once it passed the allocator's
/// mmap threshold, ~3% of a Nemotron-H-8B-shaped run).
pub(super) fn col_rows<'a>(c: Cols<'a, CpuBuf>) -> impl IndexedParallelIterator<Item = &'a [f32]> {
    let (w, col, cw) = (c.buf.width, c.col, c.width);
    c.buf
        .data
        .par_chunks(w.max(1))
        .map(move |r| &r[col..col + cw])
}

/// Columns of every row of `c` into `out`, contiguous.
pub(super) fn gather_cols(c: Cols<'_, CpuBuf>, out: &mut Vec<f32>) {
    let (w, cw) = (c.buf.width, c.width);
    if w == 0 || cw == 0 {
        out.clear();
        return;
    }
    // Every element is written below: resizing zeroes only growth. Rows in parallel (a
    // memory-bound copy that was serial on the pool's first thread).
    out.resize(c.buf.data.len() / w * cw, 0.0);
    const ROWS: usize = 64;
    out.par_chunks_mut(cw * ROWS)
        .zip(c.buf.data.par_chunks(w * ROWS))
        .for_each(|(o, src)| {
            for (orow, srow) in o.chunks_exact_mut(cw).zip(src.chunks_exact(w)) {
                orow.copy_from_slice(&srow[c.col..c.col + cw]);
            }
        });
}

pub(super) fn set(out: &mut CpuBuf, width: usize) {
    out.width = width;
}

/// Rows `rows` of `x` (width `k`) and of `out` (width `n`), for an op `what` that writes the
/// one from the other (a MoE expert's GEMM); an error unless the widths match and `out` holds
/// the rows.
pub(super) fn expert_rows<'a>(
    what: &str,
    x: &'a CpuBuf,
    rows: Range<usize>,
    (k, n): (usize, usize),
    out: &'a mut CpuBuf,
) -> DevResult<(&'a [f32], &'a mut [f32])> {
    if out.width != n || out.rows() < rows.end || x.width != k {
        return Err(DeviceError::Invalid(format!(
            "{what} {rows:?}: input width {} (weight {k}), output [{}, {}] (weight {n})",
            x.width,
            out.rows(),
            out.width
        )));
    }
    Ok((
        &x.data[rows.start * k..rows.end * k],
        &mut out.data[rows.start * n..rows.end * n],
    ))
}
