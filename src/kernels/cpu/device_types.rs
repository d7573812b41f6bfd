//! The CPU device's buffers, caches and step, and the helpers its ops share.

use std::ops::Range;

use rayon::prelude::*;

use crate::kernels::cpu::dsa::{IndexCache, Selection};
use crate::kernels::cpu::kv_cache::KvCache;
use crate::kernels::cpu::recurrent::StateCache;
use crate::kernels::device::{Cols, DevResult, DeviceError, KvShape};
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
    /// DeepSeek Sparse Attention's indexer keys, when the model has an indexer.
    pub(super) index: Option<IndexCache>,
    /// The last indexer layer's selection (GLM-5's shared layers reuse it).
    pub(super) selection: Selection,
    pub(super) q: Vec<f32>,
    pub(super) k: Vec<f32>,
    pub(super) v: Vec<f32>,
}

impl CpuKv {
    /// The KV cache (and the indexer keys' cache, for a model with one) of `s`.
    pub(super) fn new(s: KvShape) -> DevResult<Self> {
        let cache = KvCache::new(s.layers, s.num_blocks, s.block_size, s.kv_dim)
            .map_err(DeviceError::Invalid)?;
        let slots = s.num_blocks.saturating_mul(s.block_size);
        let index = (s.index)
            .map(|shape| IndexCache::new(shape, slots))
            .transpose()
            .map_err(DeviceError::Invalid)?;
        Ok(Self {
            cache,
            index,
            selection: Selection::default(),
            q: Vec::new(),
            k: Vec::new(),
            v: Vec::new(),
        })
    }
}

/// Recurrent-state slots plus contiguous copies of the strided inputs.
pub struct CpuStates {
    pub(super) cache: StateCache,
    pub(super) first: Vec<f32>,
    pub(super) second: Vec<f32>,
}

impl CpuStates {
    pub(super) fn new(shapes: &[(usize, usize)], slots: usize) -> DevResult<Self> {
        let cache = StateCache::new(shapes, slots).map_err(DeviceError::Invalid)?;
        Ok(Self {
            cache,
            first: Vec::new(),
            second: Vec::new(),
        })
    }
}

/// One forward's plan.
pub struct CpuStep<'a> {
    pub(super) tokens: &'a [u32],
    pub(super) plan: &'a BatchPlan<'a>,
    pub(super) seqs: &'a [SeqState],
}

/// An error unless the columns `x` and the gate columns `c` of an op `what` each lie inside
/// their buffer and have one width and one row count (the ops zip them row by row: a shorter
/// gate would leave rows unwritten).
pub(super) fn check_gate(what: &str, x: &Cols<'_, CpuBuf>, c: &Cols<'_, CpuBuf>) -> DevResult<()> {
    let inside = |c: &Cols<'_, CpuBuf>| c.col + c.width <= c.buf.width;
    let same = c.width == x.width && c.buf.rows() == x.buf.rows();
    if !(inside(x) && inside(c) && same) {
        let shown = |c: &Cols<'_, CpuBuf>| {
            let (b, end) = (c.buf, c.col + c.width);
            format!(
                "columns {}..{end} of a {}-wide, {}-row buffer",
                c.col,
                b.width,
                b.rows()
            )
        };
        return Err(DeviceError::Invalid(format!(
            "{what}: gate {} for input {}",
            shown(c),
            shown(x)
        )));
    }
    Ok(())
}

/// `out[t, i] = f(x[t, i], c[t, i])` for columns `x` and `c` of one width (checked: `what`
/// names the op in the error).
pub(super) fn gate_rows(
    what: &str,
    x: Cols<'_, CpuBuf>,
    c: Cols<'_, CpuBuf>,
    out: &mut CpuBuf,
    f: impl Fn(f32, f32) -> f32 + Sync,
) -> DevResult<()> {
    check_gate(what, &x, &c)?;
    // Every element is written below: resizing zeroes only growth.
    out.data.resize(x.buf.rows() * x.width, 0.0);
    out.data
        .par_chunks_mut(x.width.max(1))
        .zip(col_rows(x))
        .zip(col_rows(c))
        .for_each(|((o, x), g)| {
            for ((o, &a), &g) in o.iter_mut().zip(x).zip(g) {
                *o = f(a, g);
            }
        });
    set(out, x.width);
    Ok(())
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
    let cw = c.width;
    if c.buf.width == 0 || cw == 0 {
        out.clear();
        return;
    }
    // Every element is written below: resizing zeroes only growth. Rows in parallel (a
    // memory-bound copy that was serial on the pool's first thread), 64 to a task.
    out.resize(c.buf.rows() * cw, 0.0);
    out.par_chunks_mut(cw)
        .zip(col_rows(c))
        .with_min_len(64)
        .for_each(|(o, row)| o.copy_from_slice(row));
}

pub(super) fn set(out: &mut CpuBuf, width: usize) {
    out.width = width;
}
/// `out[t] = row(tokens[t]) · scale` (`width` values a row), rows in parallel; `row` fills one
/// row or says why it cannot.
pub(super) fn gather_scaled(
    tokens: &[u32],
    (width, scale): (usize, f32),
    out: &mut CpuBuf,
    row: impl Fn(usize, &mut [f32]) -> Result<(), String> + Sync,
) -> DevResult<()> {
    // Every element is written below: resizing zeroes only growth.
    out.data.resize(tokens.len() * width, 0.0);
    out.data
        .par_chunks_mut(width.max(1))
        .zip(tokens.par_iter())
        .try_for_each(|(r, &t)| {
            row(t as usize, r)?;
            if scale != 1.0 {
                r.iter_mut().for_each(|v| *v *= scale);
            }
            Ok(())
        })
        .map_err(DeviceError::Invalid)?;
    set(out, width);
    Ok(())
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

/// `out[i] = x[rows[i]]`; an error for a row outside `x`.
pub(super) fn gather_rows(x: &CpuBuf, rows: &[usize], out: &mut CpuBuf) -> DevResult<()> {
    let w = x.width;
    if let Some(&bad) = rows.iter().find(|&&r| w > 0 && r >= x.rows()) {
        return Err(DeviceError::Invalid(format!(
            "gather_rows: row {bad} of a {}-row buffer",
            x.rows()
        )));
    }
    // Every row is written below: resizing zeroes only growth. In parallel: the MoE
    // blocks gather `top_k` rows per token (a Qwen3-30B-A3B-shaped run spent ~5% of its
    // time in this copy on one thread).
    out.data.resize(rows.len() * w, 0.0);
    out.data
        .par_chunks_mut(w.max(1))
        .zip(rows.par_iter())
        .for_each(|(o, &r)| o.copy_from_slice(&x.data[r * w..(r + 1) * w]));
    set(out, w);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::Bf16Kernel;
    use crate::kernels::cpu::CpuDevice;
    use crate::kernels::device::Device;
    use crate::kernels::device::GateFn;

    fn buf(rows: usize, width: usize) -> CpuBuf {
        let data = (0..rows * width).map(|i| i as f32).collect();
        CpuBuf { data, width }
    }

    /// The gate ops read their gate columns in place; a gate of other rows, width or past its
    /// buffer's columns is an error, not rows left unwritten or a panic.
    #[test]
    fn gate_columns_are_read_in_place_and_checked() {
        let (x, wide) = (buf(3, 2), buf(3, 5));
        let gate = Cols::new(&wide, 1, 2);
        let whole = Cols::new(&x, 0, 2);
        check_gate("t", &whole, &gate).unwrap();
        let rows: Vec<&[f32]> = col_rows(gate).collect();
        assert_eq!(rows, [&[1.0, 2.0][..], &[6.0, 7.0], &[11.0, 12.0]]);
        let short = buf(2, 5);
        for bad in [
            Cols::new(&wide, 1, 3),
            Cols::new(&wide, 4, 2),
            Cols::new(&short, 1, 2),
        ] {
            assert!(check_gate("t", &whole, &bad).is_err());
            assert!(
                check_gate("t", &bad, &whole).is_err(),
                "x checked as the gate is"
            );
        }
        let dev = CpuDevice::new(1, Bf16Kernel::F32).unwrap();
        let mut out = CpuBuf::default();
        let sig = GateFn::Sigmoid;
        dev.gate(Cols::new(&x, 0, 2), Cols::new(&wide, 1, 2), sig, &mut out)
            .unwrap();
        let sigmoid = crate::kernels::cpu::recurrent::sigmoid;
        let want: Vec<f32> = (0..3)
            .flat_map(|r| (0..2).map(move |c| (r * 2 + c) as f32 * sigmoid((r * 5 + 1 + c) as f32)))
            .collect();
        assert_eq!(out.data, want);
        let x_cols = Cols::new(&x, 0, 2);
        assert!(
            dev.gate(x_cols, Cols::new(&short, 1, 2), sig, &mut out)
                .is_err()
        );
        // Two column ranges of one buffer, as LFM2's short convolution gates them.
        dev.gate(
            Cols::new(&wide, 0, 2),
            Cols::new(&wide, 3, 2),
            GateFn::Product,
            &mut out,
        )
        .unwrap();
        let want: Vec<f32> = (0..3)
            .flat_map(|r| (0..2).map(move |c| ((r * 5 + c) * (r * 5 + 3 + c)) as f32))
            .collect();
        assert_eq!(out.data, want);
        assert!(
            dev.gate(Cols::new(&wide, 4, 2), x_cols, sig, &mut out)
                .is_err()
        );
    }

    /// A gather-only table gives the rows `embed` gathers from the same bf16 matrix, bit for
    /// bit, scaled alike; a token past either is an error, not a panic.
    #[test]
    fn table_rows_are_the_embedding_rows() {
        use crate::kernels::device::{HostMatrix, HostTable};
        use crate::kernels::plan::{BatchPlan, PlanLimits, SeqState};
        use crate::kernels::{Batch, SeqChunk};
        let dev = CpuDevice::new(2, Bf16Kernel::F32).unwrap();
        let values: Vec<f32> = (0..8 * 5).map(|i| (i as f32 * 0.37).sin()).collect();
        let f32s = HostMatrix::from_f32(&values, 8, 5);
        let m = f32s.to_dtype(crate::kernels::WeightDtype::Bf16);
        let (linear, table) = (
            dev.linear(m.clone(), None).unwrap(),
            dev.table(HostTable::from_matrix(&m)).unwrap(),
        );
        let run = |ids: &[u32], f: &dyn Fn(&CpuStep<'_>, &mut CpuBuf) -> DevResult<()>| {
            let seqs = [SeqChunk {
                context: Vec::new(),
                start: 0,
                len: ids.len(),
                block_table: vec![0],
                sample: false,
                state_slot: None,
            }];
            let batch = Batch {
                token_ids: ids,
                seqs: &seqs,
            };
            let plan = BatchPlan::new(&batch, &PlanLimits::new(16, 64, 4, 16)).unwrap();
            let states = [SeqState {
                rows: 0..ids.len(),
                slot: 0,
                start: 0,
            }];
            let step = dev.begin(ids, &plan, &states, None).unwrap();
            let mut out = CpuBuf::default();
            f(&step, &mut out).map(|()| out)
        };
        let ids = [3u32, 0, 7, 3];
        let a = run(&ids, &|st, o| dev.embed(st, &linear, 1.5, o)).unwrap();
        let b = run(&ids, &|st, o| dev.embed_table(st, &table, 1.5, o)).unwrap();
        assert_eq!((a.width, &a.data), (b.width, &b.data));
        assert_eq!(
            b.data[..5],
            m.to_f32()[15..20]
                .iter()
                .map(|v| v * 1.5)
                .collect::<Vec<_>>()[..]
        );
        assert!(run(&[1, 9], &|st, o| dev.embed_table(st, &table, 1.0, o)).is_err());
        assert!(run(&[1, 9], &|st, o| dev.embed(st, &linear, 1.0, o)).is_err());
    }

    /// The experts' row gather copies the rows asked for, in order; a row past the buffer is an
    /// error.
    #[test]
    fn gather_rows_copies_in_order_and_refuses_a_missing_row() {
        let dev = CpuDevice::new(2, Bf16Kernel::F32).unwrap();
        let (x, mut out) = (buf(4, 3), CpuBuf::default());
        dev.gather_rows(&x, &[2, 0, 2], &mut out).unwrap();
        assert_eq!(out.data, [6.0, 7.0, 8.0, 0.0, 1.0, 2.0, 6.0, 7.0, 8.0]);
        assert_eq!(out.width, 3);
        assert!(dev.gather_rows(&x, &[1, 4], &mut out).is_err());
        assert!(dev.gather_rows(&x, &[usize::MAX], &mut out).is_err());
    }
}
