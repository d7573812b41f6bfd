//! The f32 attention task on AVX2 + FMA or AVX-512F: per lane the same operations as
//! `task_portable` (module docs of `attention.rs`), with the SIMD vector over the tile's query
//! rows in both products. One body, generic over the vector ([`Vector`]: a ymm of 8 rows or
//! a zmm of 16), inlined into the two entry points that carry the target features
//! ([`task_avx2`], [`task_avx512`]), so both give the bits of the portable task.
//!
//! - Scores: `SK` keys × a chunk of rows per block (AVX2: 6 keys × 16 or 8 rows; AVX-512: 12
//!   keys × 32, 16 or 8 rows), an FMA chain over d per lane; the block's keys stay in L1
//!   while every row chunk of the tile uses them.
//! - Weighted values: `VD` dims × a chunk of rows per block (AVX2: 6 dims; AVX-512: 8), an
//!   FMA chain over keys per lane, in runs of [`KEY_RUN`] keys so that the run's values stay in
//!   L1 across the blocks. The partial sums wait in `Scratch::acc` between runs (an exact f32
//!   store and reload: the chain is unchanged). A key that only some rows of a block see
//!   updates the others through a blend (their sums unchanged, as the portable loop skips the
//!   key), never `0 · v`: a NaN value of a later position would reach an earlier row.
//! - The next score block's K rows and the next run's V rows are prefetched a few lines per
//!   block of work ([`Ahead`]): in a long prompt they come from L3 or memory.
//!
//! Register budgets: AVX2 has 16 ymm (6 × 2 accumulators, 2 rows of q or p, 1 broadcast);
//! AVX-512F has 32 zmm (12 × 2 or 8 × 2). The 8-row chunk of the AVX-512 task is a ymm
//! (without AVX512-VL only ymm0–15: 12 accumulators still fit).

use std::arch::x86_64::*;

use super::softmax::softmax_avx2;
use super::{Ctx, LINE, Scratch, Task, out_row, soft_cap};
use vector::{Vector, Ymm, Zmm};

#[path = "attention_simd_vector.rs"]
mod vector;

/// Keys per run of the value blocks: the run's values (`KEY_RUN · hd` floats, 16 KiB at
/// hd 128) and probabilities stay in L1 while the run's blocks read them.
const KEY_RUN: usize = 32;

/// The task on AVX2+FMA: the same operations per lane as `task_portable`.
///
/// # Safety
/// The CPU must have AVX2 and FMA; `head_dim % 8 == 0`; `prepare` ran for this task.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn task_avx2(ctx: &Ctx<'_>, task: &Task, s: &mut Scratch) {
    // SAFETY: (caller).
    unsafe { run::<false, 6, 6>(ctx, task, s) }
}

/// The task on AVX-512F: the same operations per lane as `task_portable`.
///
/// # Safety
/// The CPU must have AVX-512F; `head_dim % 8 == 0`; `prepare` ran for this task.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn task_avx512(ctx: &Ctx<'_>, task: &Task, s: &mut Scratch) {
    // SAFETY: (caller).
    unsafe { run::<true, 12, 8>(ctx, task, s) }
}

/// The task: zmm chunks where `Z`, `SK` keys per score block, `VD` (6 or 8) dims per value
/// block.
///
/// # Safety
/// As the entry points; inlined into them (their target features reach the intrinsics).
#[inline(always)]
unsafe fn run<const Z: bool, const SK: usize, const VD: usize>(
    ctx: &Ctx<'_>,
    task: &Task,
    s: &mut Scratch,
) {
    let hd = ctx.shape.head_dim;
    let rp = s.lens.len();
    let len = s.offsets.len();
    let kc = ctx.kc.as_ptr();
    let scale = ctx.shape.scale;
    let (qt, st) = (s.qt.as_ptr(), s.st.as_mut_ptr());
    let chunks = chunks::<Z>(rp);
    // SAFETY (all pointer arithmetic below): offsets[j] + hd <= cache length (slots come from
    // the checked plan); qt is [hd][rp], st is [len][rp] and every lane index is < rp.
    unsafe {
        let mut j = 0;
        while j < len {
            let nk = (len - j).min(SK);
            let kp: [*const f32; SK] =
                std::array::from_fn(|i| kc.add(s.offsets[j + i.min(nk - 1)]));
            let next = &s.offsets[(j + nk).min(len)..(j + nk + SK).min(len)];
            let mut ahead = Ahead::new(kc, next, hd, chunks.len());
            for &(c, rows) in &chunks {
                ahead.step();
                let at = (qt.add(c), st.add(j * rp + c));
                scores_chunk::<Z, SK>(rows, kp, at, (rp, hd, nk), scale);
            }
            j += nk;
        }
        if let Some(cap) = ctx.softmax.softcap {
            soft_cap(std::slice::from_raw_parts_mut(st, len * rp), 1.0, cap);
        }
        softmax_avx2(st, rp, len, s, ctx.softmax.sinks.is_some());
        weighted_values::<Z, VD>(ctx, task, s, &chunks);
    }
}

/// The task's row chunks `(first row, rows)`, widest first: 32, 16 or 8 rows with zmm, 16 or
/// 8 with ymm (`rp % 8 == 0`).
fn chunks<const Z: bool>(rp: usize) -> Vec<(usize, usize)> {
    let widths: &[usize] = if Z { &[32, 16, 8] } else { &[16, 8] };
    let mut out = Vec::with_capacity(rp / 8);
    let mut c = 0;
    while c < rp {
        let rows = widths.iter().copied().find(|&w| w <= rp - c).unwrap_or(8);
        out.push((c, rows));
        c += rows;
    }
    out
}

/// [`scores_block`] on the vector and count that cover `rows`.
///
/// # Safety
/// As [`scores_block`].
#[inline(always)]
unsafe fn scores_chunk<const Z: bool, const SK: usize>(
    rows: usize,
    kp: [*const f32; SK],
    at: (*const f32, *mut f32),
    dims: (usize, usize, usize),
    scale: f32,
) {
    // SAFETY: (caller).
    unsafe {
        match (Z, rows) {
            (true, 32) => scores_block::<Zmm, 2, SK>(kp, at, dims, scale),
            (true, 16) => scores_block::<Zmm, 1, SK>(kp, at, dims, scale),
            (false, 16) => scores_block::<Ymm, 2, SK>(kp, at, dims, scale),
            _ => scores_block::<Ymm, 1, SK>(kp, at, dims, scale),
        }
    }
}

/// `out_r = (Σ_j p_rj · v_j) · inv_r` for the task's rows (in `chunks`, [`chunks`]'s), through
/// `s.acc` (`[hd][rp]`).
///
/// # Safety
/// As [`run`], after the softmax.
#[inline(always)]
unsafe fn weighted_values<const Z: bool, const VD: usize>(
    ctx: &Ctx<'_>,
    task: &Task,
    s: &mut Scratch,
    chunks: &[(usize, usize)],
) {
    let hd = ctx.shape.head_dim;
    let rp = s.lens.len();
    let len = s.offsets.len();
    let rows = task.n * ctx.group;
    s.acc.zeroed(hd * rp);
    let blocks = row_blocks(s, rows, chunks);
    // SAFETY: as `run`; acc is [hd][rp].
    unsafe {
        let (p, acc) = (s.st.as_ptr(), s.acc.as_mut_ptr());
        let v = Values {
            base: ctx.vc.as_ptr(),
            offs: s.offsets.as_ptr(),
        };
        let mut kb = 0;
        while kb < len {
            let ke = (kb + KEY_RUN).min(len);
            let next = &s.offsets[ke..(ke + KEY_RUN).min(len)];
            let mut ahead = Ahead::new(v.base, next, hd, blocks.len() * hd.div_ceil(VD));
            for b in &blocks {
                // Keys of the run that some row sees: those all see unmasked, the rest masked.
                let (lo, hi) = (kb.max(b.any.0), ke.min(b.any.1));
                if lo >= hi {
                    continue;
                }
                let flo = b.all.0.clamp(lo, hi);
                let fhi = b.all.1.clamp(flo, hi);
                for (from, to, masked) in [(lo, flo, true), (flo, fhi, false), (fhi, hi, true)] {
                    if from >= to {
                        continue;
                    }
                    let keys = KeyRange { from, to, masked };
                    let at = Block { c: b.c, rp, hd };
                    let work = (p, acc, &at, &v, &keys);
                    values_chunk::<Z, VD>(b.rows, work, s, &mut ahead);
                }
            }
            ahead.finish();
            kb = ke;
        }
        for r in 0..rows {
            let o = out_row(ctx, task, r);
            let inv = s.inv[r];
            for d in 0..hd {
                // SAFETY: row r of this task, column d < hd: inside `out`, this task's only.
                *o.add(d) = *acc.add(d * rp + r) * inv;
            }
        }
    }
}

/// What one call of the value blocks works on: probabilities `[len][rp]`, sums `[hd][rp]`,
/// the chunk, the value rows and the keys.
type ValueWork<'a> = (*const f32, *mut f32, &'a Block, &'a Values, &'a KeyRange);

/// [`values_all_dims`] on the vector and count that cover `rows`.
///
/// # Safety
/// As [`values_all_dims`].
#[inline(always)]
unsafe fn values_chunk<const Z: bool, const VD: usize>(
    rows: usize,
    work: ValueWork<'_>,
    s: &Scratch,
    ahead: &mut Ahead<'_>,
) {
    let c = work.2.c;
    // SAFETY: (caller) rows c..c + rows are inside the rp-long row arrays.
    unsafe {
        match (Z, rows) {
            (true, 32) => values_all_dims::<Zmm, 2, VD>(work, &Lanes::load(s, c, 2), ahead),
            (true, 16) => values_all_dims::<Zmm, 1, VD>(work, &Lanes::load(s, c, 1), ahead),
            (false, 16) => values_all_dims::<Ymm, 2, VD>(work, &Lanes::load(s, c, 2), ahead),
            _ => values_all_dims::<Ymm, 1, VD>(work, &Lanes::load(s, c, 1), ahead),
        }
    }
}

/// The cache lines of rows `base + offs[i]` (`hd` floats each) asked for ahead of their use, a
/// few at a time over the `calls` pieces of work that come before it: the keys and values of a
/// long prompt come from L3 or memory, and a burst of prefetches stalls on the miss buffers.
struct Ahead<'a> {
    base: *const f32,
    offs: &'a [usize],
    lines: usize,
    next: usize,
    per_call: usize,
}

impl<'a> Ahead<'a> {
    fn new(base: *const f32, offs: &'a [usize], hd: usize, calls: usize) -> Self {
        let lines = hd.div_ceil(LINE);
        Self {
            base,
            offs,
            lines,
            next: 0,
            per_call: (offs.len() * lines).div_ceil(calls.max(1)),
        }
    }

    /// Asks for the next share of lines.
    #[target_feature(enable = "avx2")]
    fn step(&mut self) {
        self.ask(self.per_call);
    }

    /// Asks for every line not asked for yet.
    #[target_feature(enable = "avx2")]
    fn finish(&mut self) {
        self.ask(usize::MAX);
    }

    #[target_feature(enable = "avx2")]
    fn ask(&mut self, n: usize) {
        let end = self
            .next
            .saturating_add(n)
            .min(self.offs.len() * self.lines);
        for i in self.next..end {
            let at = self.offs[i / self.lines] + i % self.lines * LINE;
            // A prefetch never faults; `wrapping_add` keeps the address computation safe.
            _mm_prefetch::<_MM_HINT_T0>(self.base.wrapping_add(at).cast());
        }
        self.next = end;
    }
}

/// Rows `c..` of a row chunk in `[.][rp]` arrays of `hd` rows.
struct Block {
    c: usize,
    rp: usize,
    hd: usize,
}

/// [`values_block`] over every dim, `VD` at a time: `acc[d][c..] += Σ_{j in keys} p[j][c..] ·
/// v_j[d]`.
///
/// # Safety
/// As [`run`]; `p` is the task's `[len][rp]` probabilities, `acc` its `[hd][rp]` sums.
#[inline(always)]
unsafe fn values_all_dims<V: Vector, const C: usize, const VD: usize>(
    (p, acc, at, v, keys): ValueWork<'_>,
    lanes: &Lanes<V>,
    ahead: &mut Ahead<'_>,
) {
    let (c, rp, hd) = (at.c, at.rp, at.hd);
    let mut d = 0;
    // SAFETY: (caller) rows c.. of the chunk and dims < hd are inside both arrays.
    unsafe {
        let pc = p.add(c);
        while d < hd {
            let a = acc.add(d * rp + c);
            // hd % 8 == 0, so what is left after blocks of VD (6 or 8) is 0, 2 or 4 dims.
            let dims = (hd - d).min(VD);
            ahead.step();
            let at = (pc, rp, a, d);
            match dims {
                _ if dims == VD => values_block::<V, C, VD>(at, v, keys, lanes),
                4 => values_block::<V, C, 4>(at, v, keys, lanes),
                2 => values_block::<V, C, 2>(at, v, keys, lanes),
                _ => unreachable!("head_dim % 8 != 0 on the SIMD path"),
            }
            d += dims;
        }
    }
}

/// One chunk of rows `c..c + rows`: the keys every row in use sees (`all`) and those some row
/// sees (`any`), as half-open key ranges.
struct RowBlock {
    c: usize,
    rows: usize,
    all: (usize, usize),
    any: (usize, usize),
}

/// The task's row chunks with their key ranges; padding rows (past `rows`) see no keys and
/// are never stored, so they count in neither range.
fn row_blocks(s: &Scratch, rows: usize, chunks: &[(usize, usize)]) -> Vec<RowBlock> {
    let block = |&(c, width): &(usize, usize)| {
        let used = c..(c + width).min(rows).max(c);
        let starts = || used.clone().map(|r| s.starts[r] as usize);
        let ends = || used.clone().map(|r| s.lens[r] as usize);
        RowBlock {
            c,
            rows: width,
            all: (starts().max().unwrap_or(0), ends().min().unwrap_or(0)),
            any: (starts().min().unwrap_or(0), ends().max().unwrap_or(0)),
        }
    };
    chunks.iter().map(block).collect()
}

/// The value rows: `base + offs[j]` is key j's.
struct Values {
    base: *const f32,
    offs: *const usize,
}

/// Keys `from..to` of a value block; `masked`: each lane adds only the keys its row sees.
struct KeyRange {
    from: usize,
    to: usize,
    masked: bool,
}

/// Each lane's keys (start, end) for up to 2 vectors of rows.
struct Lanes<V: Vector> {
    starts: [V::Bound; 2],
    ends: [V::Bound; 2],
}

impl<V: Vector> Lanes<V> {
    /// The lanes of `vectors` (1 or 2) vectors from row `c` (with 1, the second repeats the
    /// first).
    ///
    /// # Safety
    /// `c + vectors · V::W <= rp`.
    #[inline(always)]
    unsafe fn load(s: &Scratch, c: usize, vectors: usize) -> Self {
        let g1 = usize::from(vectors == 2);
        // SAFETY: (caller) inside the rp-long row arrays.
        let at = |v: &[u32], g: usize| unsafe { V::bound(v.as_ptr().add(c + g * V::W)) };
        Self {
            starts: [at(&s.starts, 0), at(&s.starts, g1)],
            ends: [at(&s.lens, 0), at(&s.lens, g1)],
        }
    }
}

/// Scores of keys `kp[..nk]` (extra pointers repeat the last key and are not stored) against
/// `C` vectors of rows starting at `qt` (row stride `rp` per d), stored at `st` (stride `rp`
/// per key).
///
/// # Safety
/// As [`run`].
#[inline(always)]
unsafe fn scores_block<V: Vector, const C: usize, const SK: usize>(
    kp: [*const f32; SK],
    (qt, st): (*const f32, *mut f32),
    (rp, hd, nk): (usize, usize, usize),
    scale: f32,
) {
    // SAFETY: see `run`.
    unsafe {
        let mut acc = [[V::zero(); C]; SK];
        for d in 0..hd {
            let qv: [V; C] = std::array::from_fn(|c| V::load(qt.add(d * rp + c * V::W)));
            for (i, row) in acc.iter_mut().enumerate() {
                let k = V::splat(kp[i].add(d));
                for (a, &q) in row.iter_mut().zip(&qv) {
                    *a = V::fma(k, q, *a);
                }
            }
        }
        let scale = V::set(scale);
        for (i, a) in acc.iter().enumerate().take(nk) {
            for (c, v) in a.iter().enumerate() {
                v.mul(scale).store(st.add(i * rp + c * V::W));
            }
        }
    }
}

/// `acc[d0 + dd][lanes] += Σ_{j in keys} p[j][lanes] · v_j[d0 + dd]` for `D` dims and `C`
/// vectors of rows (`p` and `acc` at the chunk's first row; `acc`'s stride is `rp` per dim).
///
/// # Safety
/// As [`run`]; acc holds D rows of rp floats from `acc`.
#[inline(always)]
unsafe fn values_block<V: Vector, const C: usize, const D: usize>(
    (p, rp, acc, d0): (*const f32, usize, *mut f32, usize),
    v: &Values,
    keys: &KeyRange,
    lanes: &Lanes<V>,
) {
    // SAFETY: see `run`.
    unsafe {
        let mut a = [[V::zero(); C]; D];
        for (dd, row) in a.iter_mut().enumerate() {
            for (c, x) in row.iter_mut().enumerate() {
                *x = V::load(acc.add(dd * rp + c * V::W));
            }
        }
        for j in keys.from..keys.to {
            let vj = v.base.add(*v.offs.add(j) + d0);
            let pj: [V; C] = std::array::from_fn(|c| V::load(p.add(j * rp + c * V::W)));
            if keys.masked {
                let live: [V::Live; C] =
                    std::array::from_fn(|c| V::live(lanes.starts[c], lanes.ends[c], j));
                for (dd, row) in a.iter_mut().enumerate() {
                    let x = V::splat(vj.add(dd));
                    for c in 0..C {
                        row[c] = V::select(live[c], V::fma(pj[c], x, row[c]), row[c]);
                    }
                }
                continue;
            }
            for (dd, row) in a.iter_mut().enumerate() {
                let x = V::splat(vj.add(dd));
                for c in 0..C {
                    row[c] = V::fma(pj[c], x, row[c]);
                }
            }
        }
        for (dd, row) in a.iter().enumerate() {
            for (c, x) in row.iter().enumerate() {
                x.store(acc.add(dd * rp + c * V::W));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::chunks;

    #[test]
    fn chunks_cover_the_rows_widest_first() {
        assert_eq!(chunks::<true>(64), [(0, 32), (32, 32)]);
        assert_eq!(chunks::<true>(56), [(0, 32), (32, 16), (48, 8)]);
        assert_eq!(chunks::<true>(8), [(0, 8)]);
        assert_eq!(chunks::<false>(40), [(0, 16), (16, 16), (32, 8)]);
    }
}
