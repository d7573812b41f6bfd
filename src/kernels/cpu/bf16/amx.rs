//! AMX-BF16: `tdpbf16ps` on tiles, through `asm!` (the AMX intrinsics are unstable in Rust
//! 1.95; the instructions assemble fine).
//!
//! Kernel: 2 A tiles (32 rows × 32 inputs) × 2 B tiles (32 inputs × 32 columns) → 4 C tiles
//! (tmm0–3). k is taken in chunks of [`K_CHUNK`] tiles: a column pair's B chunk (16 KiB)
//! stays in L1 while every 32-row band of A streams by from L2, and the band's C tiles are
//! stored to a per-job f32 scratch between chunks (exact, so each output still sums its k
//! pairs in one fixed order). Tiles of A and B are 1 KiB contiguous (row stride 64 bytes).
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
pub(super) use imp::{ready, run};

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

    /// C tile `$tmm` loaded from / stored to the scratch at `$base` (row stride `$stride`).
    macro_rules! c_tile {
        (load $tmm:literal, $base:expr, $stride:expr) => {
            asm!(concat!("tileloadd ", $tmm, ", [{p} + {s}*1]"), p = in(reg) $base,
                 s = in(reg) $stride, options(nostack, readonly))
        };
        (store $tmm:literal, $base:expr, $stride:expr) => {
            asm!(concat!("tilestored [{p} + {s}*1], ", $tmm), p = in(reg) $base,
                 s = in(reg) $stride, options(nostack))
        };
    }

    /// k tiles per chunk, 32-row bands per block and column pairs per block: a block's A
    /// (4 × 8 tiles) and B (2 × 2 × 8 tiles) are 64 KiB, in L2 (mostly L1), each tile loaded
    /// serving two products. Measured on a Sapphire Rapids VM (512 × 1024 × 1536, 1 thread):
    /// every choice of (4..64, 1..8, 1..4) ran at 470–550 GFLOP/s, ~20% of the register-only
    /// tile peak, with operands at 16 bytes past a cache line (malloc's alignment): each
    /// 64-byte tile row then straddles two lines. On 64-byte aligned tiles ([`super::super::Tile`])
    /// the same shapes run at ~770 GFLOP/s with the activation rounding and the copy into
    /// `C` included (2048 rows, 1 thread); A_BLOCK_BYTES 256 KiB..1 MiB × K_CHUNK 8 / 16 all
    /// within 10% of each other.
    const K_CHUNK: usize = 8;
    const BANDS: usize = 2;
    const PAIRS: usize = 2;
    /// Bytes of A per outer row block.
    const A_BLOCK_BYTES: usize = 1 << 20;

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
        let (kbs, mp) = (job.w.k_tiles(), job.mp());
        let cols = PAIRS * 32;
        let stride = cols * 4;
        // Rows per outer block: A's block (~1 MiB) stays in L2 while all the job's columns
        // pass, so A is read from memory once per call rather than once per column group.
        let mc = ((A_BLOCK_BYTES / (kbs * 64 * 32)).max(1) * 32).min(mp);
        // C of a block of rows × a group of column pairs, [mc][cols] f32 (kept per thread:
        // a fresh allocation of this size is a page-faulting mmap on every call).
        C_SCRATCH.with_borrow_mut(|c| {
            c.clear();
            c.resize(mc * cols / 16, CLine([0.0; 16]));
            blocks(job, bytemuck::cast_slice_mut(c), mc, stride);
        });
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

    thread_local! {
        static C_SCRATCH: std::cell::RefCell<Vec<CLine>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    /// The job in blocks of `mc` rows, C through the scratch `c` (`[mc][stride / 4]`).
    fn blocks(job: &Job<'_>, c: &mut [f32], mc: usize, stride: usize) {
        let (kbs, mp, cols) = (job.w.k_tiles(), job.mp(), stride / 4);
        let groups = groups(job);
        for m0 in (0..mp).step_by(mc) {
            let m1 = (m0 + mc).min(mp);
            for group in groups.iter().map(|(g, n)| &g[..*n]) {
                for k0 in (0..kbs).step_by(K_CHUNK) {
                    let k1 = (k0 + K_CHUNK).min(kbs);
                    for mb in (m0..m1).step_by(32 * BANDS) {
                        for m2 in (mb..(mb + 32 * BANDS).min(m1)).step_by(32) {
                            for (g, &p) in group.iter().enumerate() {
                                let top = c[(m2 - m0) * cols + g * 32..].as_mut_ptr();
                                // SAFETY: inside the scratch (rows m2 - m0 .. + 32 of [mc][cols]).
                                let bot = unsafe { top.add(16 * cols) };
                                // SAFETY: the tiles stay inside A, the packed weight and the
                                // scratch.
                                unsafe { product(job, m2 / 16, 2 * p, k0..k1, top, bot, stride) };
                            }
                        }
                    }
                }
                let rows = c.chunks_exact(cols).enumerate().take(m1 - m0);
                if job.silu_mul {
                    for (r, row) in rows {
                        job.store_silu_mul(m0 + r, 2 * group[0] * TILE_N, &row[..32], &row[32..64]);
                    }
                    continue;
                }
                for (r, row) in rows {
                    for (g, &p) in group.iter().enumerate() {
                        job.store_row(m0 + r, 2 * p * TILE_N, &row[g * 32..g * 32 + 32]);
                    }
                }
            }
        }
    }

    /// The column pairs computed together (C of one group shares the scratch): consecutive
    /// pairs, or for the fused SwiGLU a gate pair with its up pair (`n / 64` pairs later).
    fn groups(job: &Job<'_>) -> Vec<([usize; PAIRS], usize)> {
        if job.silu_mul {
            let half = job.w.n / 64;
            return job.pairs.clone().map(|p| ([p, p + half], 2)).collect();
        }
        let pairs: Vec<usize> = job.pairs.clone().collect();
        pairs
            .chunks(PAIRS)
            .map(|g| {
                let mut a = [0; PAIRS];
                a[..g.len()].copy_from_slice(g);
                (a, g.len())
            })
            .collect()
    }

    /// C tiles of rows `16 mt..16 mt + 32` × columns of tiles `nb, nb + 1` (scratch at `top`,
    /// lower half at `bot`) += the k tiles `ks`; zero first when `ks` starts at 0.
    ///
    /// # Safety
    /// AMX configured on this thread; `top` / `bot` address 16 rows × 32 f32 at `stride`.
    unsafe fn product(
        job: &Job<'_>,
        mt: usize,
        nb: usize,
        ks: std::ops::Range<usize>,
        top: *mut f32,
        bot: *mut f32,
        stride: usize,
    ) {
        // SAFETY: (caller) the scratch tiles; the A / B tiles are 1 KiB each.
        unsafe {
            let (c01, c11) = (top.add(16), bot.add(16));
            if ks.start == 0 {
                asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    options(nostack, nomem)
                );
            } else {
                c_tile!(load "tmm0", top, stride);
                c_tile!(load "tmm1", c01, stride);
                c_tile!(load "tmm2", bot, stride);
                c_tile!(load "tmm3", c11, stride);
            }
            for kb in ks {
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
            c_tile!(store "tmm0", top, stride);
            c_tile!(store "tmm1", c01, stride);
            c_tile!(store "tmm2", bot, stride);
            c_tile!(store "tmm3", c11, stride);
        }
    }
}
