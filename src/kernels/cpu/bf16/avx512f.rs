//! The `avx512` path: the `avx2` path's arithmetic on AVX-512F — f32 activations times the
//! packed bf16 or f16 tiles widened in registers, one FMA chain per output element over k in
//! order, so the same bits as `avx2` (and as its scalar `reference`) — for CPUs with AVX-512F and
//! no bf16 unit (Skylake-SP to Ice Lake), where it replaces widening whole panels into memory
//! for the `gemm` crate (the `f32` path).
//!
//! One zmm holds a whole bf16 tile row: 16 columns × the pair `W[j][2kk], W[j][2kk + 1]`; the
//! dwords shifted left 16 bits are the even inputs as f32, the dwords with their low half
//! cleared the odd ones. An f16 tile row's halves widen with `vcvtph2ps` (16 at a time). A
//! comes in `avx2`'s panels of [`MR`] rows (`[panel][k][MR]`).
//! Micro-kernel: 2 panels (12 rows) × 2 column tiles (32 columns) in 24 zmm accumulators; per
//! tile row 2 loads of B, and each row's two inputs broadcast from the panel. Rows are taken
//! in blocks of [`M_BLOCK`] so their panels stay in L2 while the job's column tiles stream by.

use super::avx2::MR;

/// Whether this CPU runs the path.
pub(super) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Rows per block: its panels (`M_BLOCK × k` f32, 192 KiB at k = 1024) stay in L2 while the
/// job's column tiles stream by.
const M_BLOCK: usize = 48;
const _: () = assert!(
    M_BLOCK.is_multiple_of(2 * MR),
    "blocks are whole panel pairs"
);

#[cfg(target_arch = "x86_64")]
pub(super) use imp::job;

#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn job(
    _: &[f32],
    _: usize,
    _: &super::PackedHalf,
    _: std::ops::Range<usize>,
    _: *mut f32,
) {
    unreachable!("the avx512 bf16 path is only available on x86-64")
}

#[cfg(target_arch = "x86_64")]
mod imp {
    use std::arch::x86_64::*;

    use super::super::{Half, PackedHalf, TILE_K, TILE_N};
    use super::{M_BLOCK, MR};

    /// Column tiles `cols` of C for every row, block of rows by block of rows.
    ///
    /// # Safety
    /// AVX-512F is present; `panels` holds A's panels (`m` rows padded to [`MR`], `k_padded`
    /// inputs); the caller owns columns `cols` of C `[m, n]` at `out`.
    #[target_feature(enable = "avx512f")]
    pub(in super::super) unsafe fn job(
        panels: &[f32],
        m: usize,
        w: &PackedHalf,
        cols: std::ops::Range<usize>,
        out: *mut f32,
    ) {
        let c = Dest { out, m, n: w.n };
        for r0 in (0..m).step_by(M_BLOCK) {
            let ps = r0 / MR..(r0 + M_BLOCK).min(m).div_ceil(MR);
            for nb in cols.clone().step_by(2) {
                let two = nb + 1 < cols.end;
                for p in ps.clone().step_by(2) {
                    // SAFETY: (caller) panels p, p + 1 < ps.end exist; tiles nb, nb + 1 <
                    // cols.end are this job's.
                    unsafe {
                        match w.half {
                            Half::Bf16 => blocks::<false>(panels, w, (p, nb), &c, (ps.end, two)),
                            Half::F16 => blocks::<true>(panels, w, (p, nb), &c, (ps.end, two)),
                        }
                    }
                }
            }
        }
    }

    /// [`block`] for panels `p, p + 1` (those below `end`) × column tiles `nb` (and `nb + 1`
    /// where `two`), on weights in f16 (`F16`) or bf16.
    ///
    /// # Safety
    /// As [`block`].
    #[inline(always)]
    unsafe fn blocks<const F16: bool>(
        panels: &[f32],
        w: &PackedHalf,
        at: (usize, usize),
        c: &Dest,
        (end, two): (usize, bool),
    ) {
        // SAFETY: (caller).
        unsafe {
            match (at.0 + 1 < end, two) {
                (true, true) => block::<2, 2, F16>(panels, w, at, c),
                (true, false) => block::<2, 1, F16>(panels, w, at, c),
                (false, true) => block::<1, 2, F16>(panels, w, at, c),
                (false, false) => block::<1, 1, F16>(panels, w, at, c),
            }
        }
    }

    /// C `[m, n]`.
    struct Dest {
        out: *mut f32,
        m: usize,
        n: usize,
    }

    /// Panels `p..p + P` × column tiles `nb..nb + T` of C, stored clipped to `[m, n]`. One
    /// step is one tile row: each row's even input times the tiles' even weights, then its
    /// odd input times the odd weights — the FMA chain of `avx2::reference`. f16 weights
    /// (`F16`): a tile row's first 16 halves are the even weights, its last 16 the odd ones.
    ///
    /// # Safety
    /// As [`job`]; panels `p..p + P` and column tiles `nb..nb + T` exist.
    #[inline(always)]
    unsafe fn block<const P: usize, const T: usize, const F16: bool>(
        panels: &[f32],
        w: &PackedHalf,
        (p, nb): (usize, usize),
        c: &Dest,
    ) {
        let kp = w.k_padded();
        let steps = kp / 2;
        assert!(panels.len() >= (p + P) * MR * kp);
        // SAFETY: `steps` tile rows of 64 bytes from tile (nb + t, 0) stay inside that column
        // tile's k tiles (contiguous); `steps` steps of 2·MR floats inside each panel.
        unsafe {
            let a: [*const f32; P] =
                std::array::from_fn(|q| panels.as_ptr().add((p + q) * MR * kp));
            let b: [*const u16; T] = std::array::from_fn(|t| w.tile(nb + t, 0).as_ptr());
            let high = _mm512_set1_epi32(0xffff_0000_u32 as i32);
            let mut acc = [[[_mm512_setzero_ps(); T]; MR]; P];
            for s in 0..steps {
                let mut even = [_mm512_setzero_ps(); T];
                let mut odd = [_mm512_setzero_ps(); T];
                for t in 0..T {
                    let row = b[t].add(s * TILE_K);
                    // 16 rows ahead (the hardware prefetchers stop at each 4 KiB page).
                    _mm_prefetch::<_MM_HINT_T0>(row.add(16 * TILE_K).cast());
                    if F16 {
                        even[t] = _mm512_cvtph_ps(_mm256_loadu_si256(row.cast()));
                        odd[t] = _mm512_cvtph_ps(_mm256_loadu_si256(row.add(TILE_N).cast()));
                    } else {
                        let raw = _mm512_loadu_si512(row.cast());
                        even[t] = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(raw));
                        odd[t] = _mm512_castsi512_ps(_mm512_and_si512(raw, high));
                    }
                }
                for (q, acc) in acc.iter_mut().enumerate() {
                    let at = a[q].add(s * 2 * MR);
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let x = _mm512_set1_ps(*at.add(r));
                        for (acc, &e) in acc.iter_mut().zip(&even) {
                            *acc = _mm512_fmadd_ps(x, e, *acc);
                        }
                        let x = _mm512_set1_ps(*at.add(MR + r));
                        for (acc, &o) in acc.iter_mut().zip(&odd) {
                            *acc = _mm512_fmadd_ps(x, o, *acc);
                        }
                    }
                }
            }
            for (q, acc) in acc.iter().enumerate() {
                for (r, acc) in acc.iter().enumerate() {
                    let row = (p + q) * MR + r;
                    if row >= c.m {
                        return;
                    }
                    for (t, &v) in acc.iter().enumerate() {
                        let c0 = (nb + t) * TILE_N;
                        let cols = c.n.saturating_sub(c0).min(TILE_N);
                        let mask = ((1u32 << cols) - 1) as __mmask16;
                        // SAFETY: row < m, columns c0..c0 + cols <= n of C, this job's.
                        _mm512_mask_storeu_ps(c.out.add(row * c.n + c0), mask, v);
                    }
                }
            }
        }
    }
}
