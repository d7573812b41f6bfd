//! AVX512-BF16: `vdpbf16ps` (stable intrinsics since Rust 1.89).
//!
//! Micro-kernel: [`MR`] rows × 32 columns (two tiles' columns) in 2·MR zmm accumulators; per
//! tile row `kk` one zmm of B pairs per column tile, and each row's A pair broadcast. Rows are
//! taken in blocks of [`M_BLOCK`] so A stays in L2 while the job's column pairs stream by.
//! The fused SwiGLU (`swiglu.rs`) computes a gate pair's block and its up pair's block with the
//! same micro-kernel and hands both to the job's epilogue.

#[cfg(not(target_arch = "x86_64"))]
pub(super) fn available() -> bool {
    false
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) fn run(job: &super::Job<'_>) {
    super::portable::run(job)
}

#[cfg(target_arch = "x86_64")]
pub(super) use imp::{available, run};

#[cfg(target_arch = "x86_64")]
mod imp {
    use std::arch::x86_64::*;

    use super::super::{Job, TILE_K, TILE_N};

    /// Rows per micro-kernel (2 × 8 accumulators of 32 zmm); divides the 16 rows of an A tile.
    const MR: usize = 8;
    /// Rows per block (A's block stays in L2 while the job's column pairs stream by).
    const M_BLOCK: usize = 256;

    pub fn available() -> bool {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
    }

    pub fn run(job: &Job<'_>) {
        assert!(available(), "AVX512-BF16 kernel called without AVX512-BF16");
        // SAFETY: the features are present (checked above).
        unsafe { run_inner(job) }
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
    fn run_inner(job: &Job<'_>) {
        // A is padded to whole tiles, so blocks of MR rows never pass its end; rows >= m are
        // computed on zeros and not stored (but for the fused epilogue's A tiles, whose
        // padding rows it writes as zeros).
        let rows = if job.fused() {
            job.epilogue_end()
        } else {
            job.m
        };
        let m = rows.div_ceil(MR) * MR;
        // The fused SwiGLU's gate pair p has its up pair n / 64 pairs later.
        let half = job.w.n / 64;
        for mb in (0..m).step_by(M_BLOCK) {
            for p in job.pairs.clone() {
                for r0 in (mb..(mb + M_BLOCK).min(m)).step_by(MR) {
                    if job.fused() {
                        swiglu_block(job, (2 * p, 2 * (p + half)), r0);
                    } else {
                        block(job, 2 * p, r0);
                    }
                }
            }
        }
    }

    /// Accumulators of rows `r0..r0 + MR` × the columns of tiles `nb`, `nb + 1`.
    type Acc = [[__m512; 2]; MR];

    /// Rows `r0..r0 + MR` (inside one A tile band) × the columns of tiles `nb`, `nb + 1`.
    #[target_feature(enable = "avx512f,avx512bf16")]
    fn product(job: &Job<'_>, nb: usize, r0: usize) -> Acc {
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        for kb in 0..job.w.k_tiles() {
            let (t0, t1) = (job.w.tile(nb, kb).as_ptr(), job.w.tile(nb + 1, kb).as_ptr());
            // Row r0's inputs of this A tile; rows r0..r0 + MR follow at 32 u16 each.
            let a = job.a_tile(r0 / 16, kb)[(r0 % 16) * TILE_K..].as_ptr();
            for kk in 0..TILE_K / 2 {
                // SAFETY: tile row kk is 32 u16 (64 bytes) inside the 1 KiB B tiles; A pair kk of
                // rows r0 % 16 + r < 16 lies inside the 1 KiB A tile.
                unsafe {
                    let b0: __m512bh = std::mem::transmute::<__m512i, __m512bh>(
                        _mm512_loadu_si512(t0.add(kk * TILE_K).cast()),
                    );
                    let b1: __m512bh = std::mem::transmute::<__m512i, __m512bh>(
                        _mm512_loadu_si512(t1.add(kk * TILE_K).cast()),
                    );
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let pair = a.add(r * TILE_K + 2 * kk).cast::<i32>().read_unaligned();
                        let av: __m512bh =
                            std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(pair));
                        acc[0] = _mm512_dpbf16_ps(acc[0], av, b0);
                        acc[1] = _mm512_dpbf16_ps(acc[1], av, b1);
                    }
                }
            }
        }
        acc
    }

    /// The MR rows of `acc` as f32, 32 columns each.
    #[target_feature(enable = "avx512f")]
    fn rows_of(acc: &Acc) -> [[f32; 32]; MR] {
        let mut rows = [[0f32; 32]; MR];
        for (row, acc) in rows.iter_mut().zip(acc) {
            // SAFETY: 2 × 16 f32 into a 32-element array.
            unsafe {
                _mm512_storeu_ps(row.as_mut_ptr(), acc[0]);
                _mm512_storeu_ps(row.as_mut_ptr().add(16), acc[1]);
            }
        }
        rows
    }

    /// C's rows `r0..r0 + MR` × the columns of tiles `nb`, `nb + 1`.
    #[target_feature(enable = "avx512f,avx512bf16")]
    fn block(job: &Job<'_>, nb: usize, r0: usize) {
        for (r, row) in rows_of(&product(job, nb, r0)).iter().enumerate() {
            job.store_row(r0 + r, nb * TILE_N, row);
        }
    }

    /// The fused SwiGLU's rows `r0..r0 + MR`: `silu(gate) · up` of the gate tiles `gate`,
    /// `gate + 1` and their up tiles, through the job's epilogue (the same products as
    /// [`block`], so the bits of the GEMM then `silu_mul`).
    #[target_feature(enable = "avx512f,avx512bf16")]
    fn swiglu_block(job: &Job<'_>, (gate, up): (usize, usize), r0: usize) {
        let g = rows_of(&product(job, gate, r0));
        let u = rows_of(&product(job, up, r0));
        for (r, (g, u)) in g.iter().zip(&u).enumerate() {
            job.store_silu_mul(r0 + r, gate * TILE_N, g, u);
        }
    }
}
