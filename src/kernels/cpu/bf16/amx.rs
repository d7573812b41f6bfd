//! AMX-BF16: `tdpbf16ps` on tiles, through `asm!` (the AMX intrinsics are unstable in Rust
//! 1.95; the instructions assemble fine).
//!
//! Kernel: 2 A tiles (32 rows × 32 inputs) × 2 B tiles (32 inputs × 32 columns) → 4 C tiles
//! (tmm0–3), over the whole of k: C stays in the tiles from `tilezero` to one `tilestored`,
//! straight into the output where the 32 × 32 block lies inside it (through a small scratch
//! at the edges and for the fused SwiGLU). Each output sums its k pairs in one fixed order.
//! Blocking: a block of column pairs whose B (~[`B_BLOCK_BYTES`]) stays in L2 while every
//! 32-row band of A passes by. Tiles of A and B are 1 KiB contiguous (row stride 64 bytes).
//!
//! Why whole k (measured on a Sapphire Rapids VM, 1 thread, the dense bench model's shapes,
//! 2048 rows): spilling C to a scratch every 8 k tiles (the previous kernel, B chunk in L1)
//! cost ~45% against the same loop with C kept in the tiles — 1,450 vs 2,600 GFLOP/s with
//! every operand in L1 — and the whole GEMM ran at 580–820 GFLOP/s; whole k with A and B from
//! L2 runs at 1,100–1,250 (each tile store still drains the tile pipeline: ~20%).
//!
//! Linux refuses tile instructions until the process asks for the tile state
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`); [`ready`] asks once.

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
pub(super) fn ready() -> bool {
    false
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
pub(super) fn run(job: &super::Job<'_>) {
    super::portable::run(job)
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) use imp::with_tiles;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(super) use imp::{CTiles, ready, run};

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod imp {
    use std::arch::asm;
    use std::sync::OnceLock;

    use super::super::{Job, TILE_N};

    const ARCH_REQ_XCOMP_PERM: libc::c_ulong = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_ulong = 18;

    /// The CPU has AMX-TILE and AMX-BF16 and the kernel granted the tile state.
    pub fn ready() -> bool {
        static READY: OnceLock<bool> = OnceLock::new();
        *READY.get_or_init(|| {
            let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
            let (bf16, tile) = (edx & (1 << 22) != 0, edx & (1 << 24) != 0);
            // SAFETY: arch_prctl with these arguments only changes this process's permissions.
            bf16 && tile
                && unsafe {
                    libc::syscall(
                        libc::SYS_arch_prctl,
                        ARCH_REQ_XCOMP_PERM,
                        XFEATURE_XTILEDATA,
                    )
                } == 0
        })
    }

    /// `ldtilecfg`'s 64-byte operand: palette 1, all 8 tiles 16 rows × 64 bytes.
    #[repr(C, align(64))]
    struct TileConfig {
        palette: u8,
        start_row: u8,
        reserved: [u8; 14],
        colsb: [u16; 16],
        rows: [u8; 16],
    }

    impl TileConfig {
        fn full() -> Self {
            let mut c = TileConfig {
                palette: 1,
                start_row: 0,
                reserved: [0; 14],
                colsb: [0; 16],
                rows: [0; 16],
            };
            for t in 0..8 {
                c.colsb[t] = 64;
                c.rows[t] = 16;
            }
            c
        }
    }

    /// C tile `$tmm` stored at `$base` (row stride `$stride` bytes).
    macro_rules! c_tile {
        (store $tmm:literal, $base:expr, $stride:expr) => {
            asm!(concat!("tilestored [{p} + {s}*1], ", $tmm), p = in(reg) $base,
                 s = in(reg) $stride, options(nostack))
        };
    }

    /// Bytes of B per block of column pairs (kept in L2 while the bands of A pass). 512 KiB,
    /// 1 MiB and 1.5 MiB ran within the run-to-run spread of each other on the bench shapes
    /// (1 and 2 threads), 256 KiB ~15% slower; over L2 (a block of 16 pairs at k = 2816, 2.8
    /// MiB) ~30% slower.
    const B_BLOCK_BYTES: usize = 512 << 10;

    /// Runs `f` with the 8 tiles configured as 16 rows × 64 bytes on this thread, then
    /// releases the tile state (the attention kernel's tile products run inside).
    pub fn with_tiles<R>(f: impl FnOnce() -> R) -> R {
        assert!(ready(), "AMX kernel called without AMX");
        let cfg = TileConfig::full();
        // SAFETY: AMX is present and permitted (ready); the config is 64 aligned bytes.
        unsafe { asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly)) };
        let r = f();
        // SAFETY: releases this thread's tile state.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
        r
    }

    pub fn run(job: &Job<'_>) {
        with_tiles(|| run_tiles(job));
    }

    fn run_tiles(job: &Job<'_>) {
        let groups = groups(job);
        let pairs_per_group = if job.fused() { 2 } else { 1 };
        let pair_bytes = job.w.k_tiles() * 2 * std::mem::size_of::<super::super::Tile>();
        let per_block = (B_BLOCK_BYTES / (pair_bytes * pairs_per_group)).max(1);
        // 32 rows × 64 f32: one group's C at the edges or for the epilogue.
        let mut scratch = [CLine([0.0; 16]); 128];
        let c: &mut [f32] = bytemuck::cast_slice_mut(&mut scratch);
        for block in groups.chunks(per_block) {
            for band in 0..job.mp() / 32 {
                for &group in block {
                    band_group(job, band * 32, group, c);
                }
            }
        }
    }

    /// C's rows `r0..r0 + 32` × the columns of `group` (a pair, or a gate pair with its up
    /// pair), through `c` (32 rows × 64 f32) where not stored directly.
    fn band_group(job: &Job<'_>, r0: usize, group: Group, c: &mut [f32]) {
        let mt = r0 / 16;
        match group {
            Group::Pair(p) => {
                if let Some(out) = job.direct_out(r0, p) {
                    // SAFETY: the tiles stay inside A, the packed weight and C.
                    unsafe { product(job, mt, 2 * p, out) };
                    return;
                }
                // SAFETY: as above, C's block in the scratch.
                unsafe { product(job, mt, 2 * p, CTiles::at(c.as_mut_ptr(), 64 * 4)) };
                for (r, row) in (r0..(r0 + 32).min(job.m)).zip(c.chunks_exact(64)) {
                    job.store_row(r, 2 * p * TILE_N, &row[..32]);
                }
            }
            Group::GateUp(gate, up) => {
                // SAFETY: as above, the gate and up blocks side by side in the scratch.
                unsafe {
                    product(job, mt, 2 * gate, CTiles::at(c.as_mut_ptr(), 64 * 4));
                    product(job, mt, 2 * up, CTiles::at(c.as_mut_ptr().add(32), 64 * 4));
                }
                for (r, row) in job.epilogue_rows(r0).zip(c.chunks_exact(64)) {
                    job.store_silu_mul(r, 2 * gate * TILE_N, &row[..32], &row[32..]);
                }
            }
        }
    }

    /// 16 f32 on a cache-line boundary: C's tile rows (64 bytes) must not straddle two lines
    /// (see [`super::super::Tile`]).
    #[repr(C, align(64))]
    #[derive(Clone, Copy)]
    struct CLine([f32; 16]);

    // SAFETY: a plain f32 array of 64 bytes (its alignment): no padding, any bits valid.
    unsafe impl bytemuck::Zeroable for CLine {}
    // SAFETY: as above.
    unsafe impl bytemuck::Pod for CLine {}

    /// The columns one product group computes.
    #[derive(Clone, Copy)]
    enum Group {
        /// A column pair of a plain GEMM.
        Pair(usize),
        /// The fused SwiGLU: a gate pair and its up pair (`n / 64` pairs later).
        GateUp(usize, usize),
    }

    fn groups(job: &Job<'_>) -> Vec<Group> {
        if job.fused() {
            let half = job.w.n / 64;
            return job
                .pairs
                .clone()
                .map(|p| Group::GateUp(p, p + half))
                .collect();
        }
        job.pairs.clone().map(Group::Pair).collect()
    }

    /// Where C tiles are stored: the upper 16 rows at `top`, the lower at
    /// `top + 16 rows`, row stride `stride` bytes.
    #[derive(Clone, Copy)]
    pub struct CTiles {
        top: *mut f32,
        stride: usize,
    }

    impl CTiles {
        pub fn at(top: *mut f32, stride: usize) -> Self {
            Self { top, stride }
        }
    }

    /// C tiles of rows `16 mt..16 mt + 32` × columns of tiles `nb, nb + 1` = the product over
    /// all k tiles, stored to `store`.
    ///
    /// # Safety
    /// AMX configured on this thread; `store` addresses 32 rows × 32 f32.
    unsafe fn product(job: &Job<'_>, mt: usize, nb: usize, store: CTiles) {
        // SAFETY: (caller) the C tiles; the A / B tiles are 1 KiB each.
        unsafe {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem)
            );
            for kb in 0..job.w.k_tiles() {
                asm!(
                    "tileloadd tmm4, [{a0} + {s}*1]",
                    "tileloadd tmm6, [{b0} + {s}*1]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tileloadd tmm7, [{b1} + {s}*1]",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tileloadd tmm5, [{a1} + {s}*1]",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    a0 = in(reg) job.a_tile(mt, kb).as_ptr(),
                    a1 = in(reg) job.a_tile(mt + 1, kb).as_ptr(),
                    b0 = in(reg) job.w.tile(nb, kb).as_ptr(),
                    b1 = in(reg) job.w.tile(nb + 1, kb).as_ptr(),
                    s = in(reg) 64usize,
                    options(nostack, readonly)
                );
            }
            let CTiles { top, stride } = store;
            let bot = top.byte_add(16 * stride);
            c_tile!(store "tmm0", top, stride);
            c_tile!(store "tmm1", top.add(16), stride);
            c_tile!(store "tmm2", bot, stride);
            c_tile!(store "tmm3", bot.add(16), stride);
        }
    }
}
