//! The `avx2` path: f32 activations times the packed bf16 or f16 tiles, widened in registers,
//! with AVX2 FMA — the numerics of f32 compute (as the `f32` path) without widening the
//! weights into memory first.
//!
//! A bf16 tile row `kk` is 16 columns × the pair `W[j][2kk], W[j][2kk + 1]` (module docs of
//! `bf16`); one ymm holds 8 columns' pairs, and a pair's dword shifted left 16 bits is
//! `W[j][2kk]` as f32, the dword with its low half cleared `W[j][2kk + 1]`. An f16 tile row
//! holds the 16 columns' `W[j][2kk]`, then their `W[j][2kk + 1]` ([`Half::F16`](super::Half)):
//! `vcvtph2ps` widens 8 of them from memory.
//!
//! A is copied into panels of [`MR`] rows, `[panel][k padded][MR]`, so one micro-kernel step
//! broadcasts consecutive floats (rows of A at a power-of-two stride would share L1 sets).
//! Micro-kernel: [`MR`] rows × 16 columns in 12 ymm accumulators, one FMA chain per output
//! element over k in order — what `reference` (tests) computes with `mul_add` — so a row's result
//! does not depend on which panel, block or thread it falls in.

use rayon::prelude::*;

use super::{OutPtr, PackedHalf, TILE_K, TILE_N, Tile};

/// Rows per micro-kernel: 6 × 2 ymm accumulators, 2 weight vectors, a broadcast and a mask
/// are the 16 ymm registers.
pub(super) const MR: usize = 6;
/// Rows per block: the block's panels of A (`M_BLOCK × k` f32, 96 KiB at k = 1024) stay in
/// L2 while the job's column tiles stream by (24 measured best of 12–96 on a Zen 3 with
/// 512 KiB of L2).
const M_BLOCK: usize = 24;
const _: () = assert!(M_BLOCK.is_multiple_of(MR), "blocks are whole panels");

/// Whether this CPU runs the path.
pub(super) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // F16C (the f16 weights' widening) came with AVX2 on every CPU that has both.
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `a [m, k]` into panels of [`MR`] rows (`[panel][kp][MR]`, rows past `m` and inputs past
/// `k` zero) in `out`, reused between calls; returns the panels.
fn pack_a<'a>(a: &[f32], m: usize, k: usize, kp: usize, out: &'a mut Vec<Tile>) -> &'a [f32] {
    let floats = m.div_ceil(MR) * MR * kp;
    let tiles = (floats * 4).div_ceil(std::mem::size_of::<Tile>());
    if out.len() < tiles {
        out.resize(tiles, Tile([0; TILE_N * TILE_K]));
    }
    let panels = &mut bytemuck::cast_slice_mut::<Tile, f32>(out)[..floats];
    panels
        .par_chunks_mut(MR * kp)
        .enumerate()
        .for_each(|(p, panel)| {
            // In the panel's order (input by input, its MR rows each): one pass of contiguous
            // writes (a strided pass per row took ~5% of the avx512 path's GEMM time).
            let rows: [Option<&[f32]>; MR] = std::array::from_fn(|r| {
                let row = p * MR + r;
                (row < m).then(|| &a[row * k..(row + 1) * k])
            });
            let (inputs, padding) = panel.split_at_mut(k * MR);
            for (i, dst) in inputs.chunks_exact_mut(MR).enumerate() {
                for (d, row) in dst.iter_mut().zip(&rows) {
                    *d = row.map_or(0.0, |row| row[i]);
                }
            }
            padding.fill(0.0);
        });
    panels
}

/// `c [m, n] = a [m, k] · Wᵀ` on `threads` workers, each taking a range of column tiles
/// (whole pairs of them: `avx512f`'s micro-kernel takes two), on AVX2 or, where `wide`, on
/// AVX-512F (`avx512f.rs`, the same bits). `scratch` keeps A's panels between calls.
pub(super) fn matmul(
    a: &[f32],
    m: usize,
    w: &PackedHalf,
    c: &mut [f32],
    (threads, wide): (usize, bool),
    scratch: &mut Vec<Tile>,
) {
    if wide {
        assert!(
            super::avx512f::available(),
            "avx512 bf16 kernel called without AVX-512F"
        );
    } else {
        assert!(
            available(),
            "avx2 bf16 kernel called without AVX2, FMA and F16C"
        );
    }
    let panels = pack_a(a, m, w.k, w.k_padded(), scratch);
    let (tiles, pairs) = (w.n.div_ceil(TILE_N), w.column_tiles() / 2);
    let workers = threads.clamp(1, pairs);
    let out = OutPtr(c.as_mut_ptr());
    let run = |i: usize| {
        let cols = 2 * (pairs * i / workers)..(2 * (pairs * (i + 1) / workers)).min(tiles);
        // SAFETY: the features are present (asserted above); the worker writes only its
        // tiles' columns of C [m, n].
        unsafe {
            match wide {
                true => super::avx512f::job(panels, m, w, cols, out.get()),
                false => imp::job(panels, m, w, cols, out.get()),
            }
        }
    };
    if workers == 1 {
        run(0);
    } else {
        (0..workers).into_par_iter().for_each(run);
    }
}

/// The path's reference (tests): the same FMA chain per output, scalar.
#[cfg(test)]
pub(super) fn reference(a: &[f32], m: usize, w: &PackedHalf) -> Vec<f32> {
    let (n, k) = (w.n, w.k);
    let mut wide = vec![0f32; k];
    let mut c = vec![0f32; m * n];
    for j in 0..n {
        w.row_into(j, &mut wide);
        for r in 0..m {
            // Zero padding past k: fma(0, 0, acc) = acc, except that it turns -0 into +0.
            let acc = a[r * k..(r + 1) * k]
                .iter()
                .zip(&wide)
                .fold(0f32, |acc, (&x, &y)| x.mul_add(y, acc));
            let pad = if k < w.k_padded() {
                0f32.mul_add(0.0, acc)
            } else {
                acc
            };
            c[r * n + j] = pad;
        }
    }
    c
}

#[cfg(target_arch = "x86_64")]
mod imp {
    use super::super::{Half, PackedHalf, TILE_K, TILE_N};
    use super::{M_BLOCK, MR};

    /// The micro-kernel's loop over `steps` tile rows from `t`, the panel at `a`, stored to
    /// `o`: `$even` leaves a tile row's even inputs of columns 0–7 / 8–15 as f32 in ymm12 /
    /// ymm13, `$odd` its odd inputs (ymm15 holds the bf16 high-half mask).
    macro_rules! tile_asm {
        (($t:expr, $a:expr, $n:expr, $o:expr), [$($even:literal),*], [$($odd:literal),*]) => {
            std::arch::asm!(
            "vxorps ymm0, ymm0, ymm0",
            "vxorps ymm6, ymm6, ymm6",
            "vxorps ymm1, ymm1, ymm1",
            "vxorps ymm7, ymm7, ymm7",
            "vxorps ymm2, ymm2, ymm2",
            "vxorps ymm8, ymm8, ymm8",
            "vxorps ymm3, ymm3, ymm3",
            "vxorps ymm9, ymm9, ymm9",
            "vxorps ymm4, ymm4, ymm4",
            "vxorps ymm10, ymm10, ymm10",
            "vxorps ymm5, ymm5, ymm5",
            "vxorps ymm11, ymm11, ymm11",
            "vpcmpeqd ymm15, ymm15, ymm15",
            "vpslld ymm15, ymm15, 16",
            "2:",
            "prefetcht0 [{t} + 1024]",
            $($even,)*
            "vbroadcastss ymm14, dword ptr [{a} + 0]",
            "vfmadd231ps ymm0, ymm14, ymm12",
            "vfmadd231ps ymm6, ymm14, ymm13",
            "vbroadcastss ymm14, dword ptr [{a} + 4]",
            "vfmadd231ps ymm1, ymm14, ymm12",
            "vfmadd231ps ymm7, ymm14, ymm13",
            "vbroadcastss ymm14, dword ptr [{a} + 8]",
            "vfmadd231ps ymm2, ymm14, ymm12",
            "vfmadd231ps ymm8, ymm14, ymm13",
            "vbroadcastss ymm14, dword ptr [{a} + 12]",
            "vfmadd231ps ymm3, ymm14, ymm12",
            "vfmadd231ps ymm9, ymm14, ymm13",
            "vbroadcastss ymm14, dword ptr [{a} + 16]",
            "vfmadd231ps ymm4, ymm14, ymm12",
            "vfmadd231ps ymm10, ymm14, ymm13",
            "vbroadcastss ymm14, dword ptr [{a} + 20]",
            "vfmadd231ps ymm5, ymm14, ymm12",
            "vfmadd231ps ymm11, ymm14, ymm13",
            $($odd,)*
            "vbroadcastss ymm14, dword ptr [{a} + 24]",
            "vfmadd231ps ymm0, ymm14, ymm12",
            "vfmadd231ps ymm6, ymm14, ymm13",
            "vbroadcastss ymm14, dword ptr [{a} + 28]",
            "vfmadd231ps ymm1, ymm14, ymm12",
            "vfmadd231ps ymm7, ymm14, ymm13",
            "vbroadcastss ymm14, dword ptr [{a} + 32]",
            "vfmadd231ps ymm2, ymm14, ymm12",
            "vfmadd231ps ymm8, ymm14, ymm13",
            "vbroadcastss ymm14, dword ptr [{a} + 36]",
            "vfmadd231ps ymm3, ymm14, ymm12",
            "vfmadd231ps ymm9, ymm14, ymm13",
            "vbroadcastss ymm14, dword ptr [{a} + 40]",
            "vfmadd231ps ymm4, ymm14, ymm12",
            "vfmadd231ps ymm10, ymm14, ymm13",
            "vbroadcastss ymm14, dword ptr [{a} + 44]",
            "vfmadd231ps ymm5, ymm14, ymm12",
            "vfmadd231ps ymm11, ymm14, ymm13",
            "add {t}, 64",
            "add {a}, 48",
            "dec {n}",
            "jnz 2b",
            "vmovups [{o} + 0], ymm0",
            "vmovups [{o} + 32], ymm6",
            "vmovups [{o} + 64], ymm1",
            "vmovups [{o} + 96], ymm7",
            "vmovups [{o} + 128], ymm2",
            "vmovups [{o} + 160], ymm8",
            "vmovups [{o} + 192], ymm3",
            "vmovups [{o} + 224], ymm9",
            "vmovups [{o} + 256], ymm4",
            "vmovups [{o} + 288], ymm10",
            "vmovups [{o} + 320], ymm5",
            "vmovups [{o} + 352], ymm11",
            t = inout(reg) $t => _,
            a = inout(reg) $a => _,
            n = inout(reg) $n => _,
            o = in(reg) $o,
            out("ymm0") _,
            out("ymm1") _,
            out("ymm2") _,
            out("ymm3") _,
            out("ymm4") _,
            out("ymm5") _,
            out("ymm6") _,
            out("ymm7") _,
            out("ymm8") _,
            out("ymm9") _,
            out("ymm10") _,
            out("ymm11") _,
            out("ymm12") _,
            out("ymm13") _,
            out("ymm14") _,
            out("ymm15") _,
            options(nostack),
            )
        };
    }

    /// Column tiles `cols` of C for every row, block of rows by block of rows.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn job(
        panels: &[f32],
        m: usize,
        w: &PackedHalf,
        cols: std::ops::Range<usize>,
        out: *mut f32,
    ) {
        let kp = w.k_padded();
        for r0 in (0..m).step_by(M_BLOCK) {
            for nb in cols.clone() {
                for p in (r0..(r0 + M_BLOCK).min(m)).step_by(MR) {
                    let panel = &panels[p * kp..(p + MR) * kp];
                    let acc = tile(panel, w, nb);
                    // SAFETY: as the caller's: this worker owns column tile nb.
                    unsafe { store(&acc, out, (p, m), (nb * TILE_N, w.n)) };
                }
            }
        }
    }

    /// Rows of one panel × the 16 columns of tile `nb`, row-major `[MR][16]`.
    ///
    /// In assembly: the 12 accumulators (ymm0–11), the two weight vectors of a tile row
    /// (ymm12–13), a broadcast (ymm14) and the bf16 high-half mask (ymm15) take all 16 ymm
    /// registers, and compiled intrinsics spill or merge the broadcasts. One step is one tile
    /// row: its 16 columns' even input, every row's `a[2kk]` broadcast times it, then the odd
    /// input times `a[2kk + 1]` — the FMA chain of [`super::reference`]. bf16: the even input
    /// is the pair's dword shifted left 16 bits, the odd one the dword with its low half
    /// cleared; f16: each is 8 halves converted (`vcvtph2ps`) from its half of the row.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn tile(panel: &[f32], w: &PackedHalf, nb: usize) -> [f32; MR * TILE_N] {
        // Every value is stored by the assembly: no zeroing on this hot path.
        let mut out = std::mem::MaybeUninit::<[f32; MR * TILE_N]>::uninit();
        let steps = w.k_tiles() * TILE_K / 2;
        assert!(steps > 0 && panel.len() == MR * 2 * steps);
        // The column tile's k tiles are contiguous: one run of `steps` 64-byte rows, fetched
        // 16 rows ahead (the hardware prefetchers stop at each 4 KiB page of the run; measured
        // on Zen 3: 1 thread 61-73 -> 64-76 GFLOP/s, llama bf16 443-512 -> 519-563 tok/s).
        let t = w.tile(nb, 0).as_ptr();
        let o = out.as_mut_ptr().cast::<f32>();
        // SAFETY: `steps` tile rows of 64 bytes from tile (nb, 0) stay inside the column
        // tile's k tiles; `steps` steps of 2·MR floats stay inside `panel`; `out` holds
        // MR × 16 floats, all 12 × 8 of them stored. The registers written are declared clobbered.
        unsafe {
            match w.half {
                Half::Bf16 => tile_asm!(
                    (t, panel.as_ptr(), steps, o),
                    [
                        "vmovdqu ymm12, [{t}]",
                        "vmovdqu ymm13, [{t} + 32]",
                        "vpslld ymm12, ymm12, 16",
                        "vpslld ymm13, ymm13, 16"
                    ],
                    [
                        "vpand ymm12, ymm15, [{t}]",
                        "vpand ymm13, ymm15, [{t} + 32]"
                    ]
                ),
                Half::F16 => tile_asm!(
                    (t, panel.as_ptr(), steps, o),
                    ["vcvtph2ps ymm12, [{t}]", "vcvtph2ps ymm13, [{t} + 16]"],
                    ["vcvtph2ps ymm12, [{t} + 32]", "vcvtph2ps ymm13, [{t} + 48]"]
                ),
            }
        }
        // SAFETY: the assembly stored all MR × 16 values (12 ymm stores of 8).
        unsafe { out.assume_init() }
    }

    /// Writes rows `p..p + MR` of `vals` (`[MR][16]`), columns `c0..c0 + 16`, clipped to
    /// `[m, n]`.
    unsafe fn store(
        vals: &[f32; MR * TILE_N],
        out: *mut f32,
        (p, m): (usize, usize),
        (c0, n): (usize, usize),
    ) {
        let cols = n.saturating_sub(c0).min(TILE_N);
        for r in 0..MR.min(m.saturating_sub(p)) {
            // SAFETY: row p + r < m, columns c0..c0 + cols <= n lie inside C [m, n].
            unsafe {
                std::ptr::copy_nonoverlapping(
                    vals[r * TILE_N..].as_ptr(),
                    out.add((p + r) * n + c0),
                    cols,
                )
            };
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod imp {
    use super::super::PackedHalf;

    pub(super) unsafe fn job(
        _: &[f32],
        _: usize,
        _: &PackedHalf,
        _: std::ops::Range<usize>,
        _: *mut f32,
    ) {
        unreachable!("the avx2 bf16 path is only available on x86-64")
    }
}
