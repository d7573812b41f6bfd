//! The attention task on AVX2 + FMA: per lane the same operations as `task_portable` (module
//! docs of `attention.rs`), with the SIMD vector over the tile's query rows in both products.
//!
//! - Scores: [`BLOCK`] keys × 16 rows (or × 8) per block, an FMA chain over d per lane; the
//!   block's keys stay in L1 while every row block of the tile uses them.
//! - Weighted values: [`BLOCK`] dims × 16 rows (or × 8) per block, an FMA chain over keys per
//!   lane, in runs of [`KEY_RUN`] keys so that the run's values stay in L1 across the blocks.
//!   The partial sums wait in `Scratch::acc` between runs (an exact f32 store and reload: the
//!   chain is unchanged). A key that only some rows of a block see updates the others through
//!   a blend (their sums unchanged, as the portable loop skips the key), never `0 · v`: a NaN
//!   value of a later position would reach an earlier row.
//! - The next score block's K rows and the next run's V rows are prefetched a few lines per
//!   block of work ([`Ahead`]): in a long prompt they come from L3 or memory.

use std::arch::x86_64::*;

use super::softmax::softmax_avx2;
use super::{Ctx, LANES, LINE, Scratch, Task, out_row};

/// Keys per score block and dims per value block (6 × 2 registers of accumulators: 12 of the
/// 16 ymm registers).
const BLOCK: usize = 6;

/// Keys per run of the value blocks: the run's values (`KEY_RUN · hd` floats, 16 KiB at
/// hd 128) and probabilities stay in L1 while the run's blocks read them.
const KEY_RUN: usize = 32;

/// The task on AVX2+FMA: the same operations per lane as `task_portable`.
///
/// # Safety
/// The CPU must have AVX2 and FMA; `head_dim % 8 == 0`; `prepare` ran for this task.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn task_avx2(ctx: &Ctx<'_>, task: &Task, s: &mut Scratch) {
    let hd = ctx.shape.head_dim;
    let rp = s.lens.len();
    let len = s.offsets.len();
    let kc = ctx.kc.as_ptr();
    let scale = _mm256_set1_ps(ctx.shape.scale);
    let (qt, st) = (s.qt.as_ptr(), s.st.as_mut_ptr());
    // SAFETY (all pointer arithmetic below): offsets[j] + hd <= cache length (slots come from
    // the checked plan); qt is [hd][rp], st is [len][rp] and every lane index is < rp.
    unsafe {
        let mut j = 0;
        while j < len {
            let nk = (len - j).min(BLOCK);
            let mut kp = [kc; BLOCK];
            for (i, p) in kp.iter_mut().enumerate() {
                *p = kc.add(s.offsets[j + i.min(nk - 1)]);
            }
            let next = &s.offsets[(j + nk).min(len)..(j + nk + BLOCK).min(len)];
            let mut ahead = Ahead::new(kc, next, hd, rp.div_ceil(2 * LANES));
            let mut c = 0;
            while c < rp {
                ahead.step();
                if rp - c >= 2 * LANES {
                    scores_block::<2>(kp, qt.add(c), rp, hd, scale, st.add(j * rp + c), nk);
                    c += 2 * LANES;
                } else {
                    scores_block::<1>(kp, qt.add(c), rp, hd, scale, st.add(j * rp + c), nk);
                    c += LANES;
                }
            }
            j += nk;
        }
        softmax_avx2(st, rp, len, s, ctx.softmax.sinks.is_some());
        weighted_values(ctx, task, s);
    }
}

/// `out_r = (Σ_j p_rj · v_j) · inv_r` for the task's rows, through `s.acc` (`[hd][rp]`).
///
/// # Safety
/// As [`task_avx2`], after the softmax.
#[target_feature(enable = "avx2,fma")]
unsafe fn weighted_values(ctx: &Ctx<'_>, task: &Task, s: &mut Scratch) {
    let hd = ctx.shape.head_dim;
    let rp = s.lens.len();
    let len = s.offsets.len();
    let rows = task.n * ctx.group;
    s.acc.zeroed(hd * rp);
    let blocks = row_blocks(s, rows);
    // SAFETY: as `task_avx2`; acc is [hd][rp].
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
            let mut ahead = Ahead::new(v.base, next, hd, blocks.len() * hd.div_ceil(BLOCK));
            for b in &blocks {
                let (c, wide) = (b.c, b.wide);
                let lanes = Lanes::load(s, c, wide);
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
                    let at = Block { c, wide, rp, hd };
                    values_all_dims(p, acc, &at, &v, &keys, &lanes, &mut ahead);
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

/// Rows `c..` of a row block (16 when `wide`, else 8) in `[.][rp]` arrays of `hd` rows.
struct Block {
    c: usize,
    wide: bool,
    rp: usize,
    hd: usize,
}

/// [`values_block`] over every dim, 6 at a time: `acc[d][c..] += Σ_{j in keys} p[j][c..] · v_j[d]`.
///
/// # Safety
/// As [`task_avx2`]; `p` is the task's `[len][rp]` probabilities, `acc` its `[hd][rp]` sums.
#[target_feature(enable = "avx2,fma")]
unsafe fn values_all_dims(
    p: *const f32,
    acc: *mut f32,
    at: &Block,
    v: &Values,
    keys: &KeyRange,
    lanes: &Lanes,
    ahead: &mut Ahead<'_>,
) {
    let (c, rp, hd) = (at.c, at.rp, at.hd);
    let mut d = 0;
    // SAFETY: (caller) rows c.. of the block and dims < hd are inside both arrays.
    unsafe {
        let pc = p.add(c);
        while d < hd {
            let a = acc.add(d * rp + c);
            // hd % 8 == 0, so what is left after blocks of 6 is 0, 2 or 4 dims.
            let dims = if hd - d >= BLOCK { BLOCK } else { hd - d };
            ahead.step();
            match (dims, at.wide) {
                (BLOCK, true) => values_block::<2, 6>(pc, rp, v, d, keys, lanes, a),
                (BLOCK, false) => values_block::<1, 6>(pc, rp, v, d, keys, lanes, a),
                (4, true) => values_block::<2, 4>(pc, rp, v, d, keys, lanes, a),
                (4, false) => values_block::<1, 4>(pc, rp, v, d, keys, lanes, a),
                (2, true) => values_block::<2, 2>(pc, rp, v, d, keys, lanes, a),
                (2, false) => values_block::<1, 2>(pc, rp, v, d, keys, lanes, a),
                _ => unreachable!("head_dim % 8 != 0 on the AVX2 path"),
            }
            d += dims;
        }
    }
}

/// One block of rows `c..c + 8` (or `+ 16` when `wide`): the keys every row in use sees
/// (`all`) and those some row sees (`any`), as half-open key ranges.
struct RowBlock {
    c: usize,
    wide: bool,
    all: (usize, usize),
    any: (usize, usize),
}

/// The task's row blocks, 16 rows where 16 remain; padding rows (past `rows`) see no keys and
/// are never stored, so they count in neither range.
fn row_blocks(s: &Scratch, rows: usize) -> Vec<RowBlock> {
    let rp = s.lens.len();
    let mut blocks = Vec::with_capacity(rp / LANES);
    let mut c = 0;
    while c < rp {
        let wide = rp - c >= 2 * LANES;
        let width = if wide { 2 * LANES } else { LANES };
        let used = c..(c + width).min(rows).max(c);
        let starts = || used.clone().map(|r| s.starts[r] as usize);
        let ends = || used.clone().map(|r| s.lens[r] as usize);
        blocks.push(RowBlock {
            c,
            wide,
            all: (starts().max().unwrap_or(0), ends().min().unwrap_or(0)),
            any: (starts().min().unwrap_or(0), ends().max().unwrap_or(0)),
        });
        c += width;
    }
    blocks
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
struct Lanes {
    starts: [__m256i; 2],
    ends: [__m256i; 2],
}

impl Lanes {
    /// # Safety
    /// AVX2; `c + 8` (`c + 16` when `wide`) <= rp.
    #[target_feature(enable = "avx2")]
    unsafe fn load(s: &Scratch, c: usize, wide: bool) -> Self {
        // SAFETY: (caller) inside the rp-long row arrays.
        unsafe {
            let at = |v: &[u32], g: usize| _mm256_loadu_si256(v.as_ptr().add(c + g * LANES).cast());
            let g1 = usize::from(wide);
            Self {
                starts: [at(&s.starts, 0), at(&s.starts, g1)],
                ends: [at(&s.lens, 0), at(&s.lens, g1)],
            }
        }
    }

    /// Lanes of vector g whose row sees key j: start <= j < end.
    #[target_feature(enable = "avx2")]
    fn live(&self, g: usize, j: __m256i) -> __m256 {
        let before = _mm256_cmpgt_epi32(self.starts[g], j);
        _mm256_castsi256_ps(_mm256_andnot_si256(
            before,
            _mm256_cmpgt_epi32(self.ends[g], j),
        ))
    }
}

/// Scores of keys `kp[..nk]` (extra pointers repeat the last key and are not stored) against
/// `C` × 8 rows starting at `qt` (row stride `rp` per d), stored at `st` (stride `rp` per key).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn scores_block<const C: usize>(
    kp: [*const f32; BLOCK],
    qt: *const f32,
    rp: usize,
    hd: usize,
    scale: __m256,
    st: *mut f32,
    nk: usize,
) {
    // SAFETY: see `task_avx2`.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); C]; BLOCK];
        for d in 0..hd {
            let mut qv = [_mm256_setzero_ps(); C];
            for (c, v) in qv.iter_mut().enumerate() {
                *v = _mm256_loadu_ps(qt.add(d * rp + c * LANES));
            }
            for i in 0..BLOCK {
                let k = _mm256_broadcast_ss(&*kp[i].add(d));
                for c in 0..C {
                    acc[i][c] = _mm256_fmadd_ps(k, qv[c], acc[i][c]);
                }
            }
        }
        for (i, a) in acc.iter().enumerate().take(nk) {
            for (c, v) in a.iter().enumerate() {
                _mm256_storeu_ps(st.add(i * rp + c * LANES), _mm256_mul_ps(*v, scale));
            }
        }
    }
}

/// `acc[d0 + dd][lanes] += Σ_{j in keys} p[j][lanes] · v_j[d0 + dd]` for `D` dims and `C` × 8
/// rows (`p` and `acc` at the block's first row; `acc`'s stride is `rp` per dim).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn values_block<const C: usize, const D: usize>(
    p: *const f32,
    rp: usize,
    v: &Values,
    d0: usize,
    keys: &KeyRange,
    lanes: &Lanes,
    acc: *mut f32,
) {
    // SAFETY: see `task_avx2`; acc holds D rows of rp floats from here.
    unsafe {
        let mut a = [[_mm256_setzero_ps(); C]; D];
        for (dd, row) in a.iter_mut().enumerate() {
            for (c, x) in row.iter_mut().enumerate() {
                *x = _mm256_loadu_ps(acc.add(dd * rp + c * LANES));
            }
        }
        for j in keys.from..keys.to {
            let vj = v.base.add(*v.offs.add(j) + d0);
            let pj: [__m256; C] =
                std::array::from_fn(|c| _mm256_loadu_ps(p.add(j * rp + c * LANES)));
            if keys.masked {
                let jv = _mm256_set1_epi32(j as i32);
                let live: [__m256; C] = std::array::from_fn(|c| lanes.live(c, jv));
                for (dd, row) in a.iter_mut().enumerate() {
                    let x = _mm256_broadcast_ss(&*vj.add(dd));
                    for c in 0..C {
                        let t = _mm256_fmadd_ps(pj[c], x, row[c]);
                        row[c] = _mm256_blendv_ps(row[c], t, live[c]);
                    }
                }
                continue;
            }
            for (dd, row) in a.iter_mut().enumerate() {
                let x = _mm256_broadcast_ss(&*vj.add(dd));
                for c in 0..C {
                    row[c] = _mm256_fmadd_ps(pj[c], x, row[c]);
                }
            }
        }
        for (dd, row) in a.iter().enumerate() {
            for (c, x) in row.iter().enumerate() {
                _mm256_storeu_ps(acc.add(dd * rp + c * LANES), *x);
            }
        }
    }
}
