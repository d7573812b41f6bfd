//! AMX-BF16: the GEMM on `tdpbf16ps` tiles.
//!
//! Kernel: 2 A tiles (32 rows × 32 inputs) × 2 B tiles (32 inputs × 32 columns) → 4 C tiles
//! (tmm0–3). Each output sums its k pairs in one fixed order, tile after tile along k.
//!
//! Blocking (outer to inner): a block of column pairs whose B (~[`B_BLOCK_BYTES`]) stays in L2;
//! each 32-row band of A; a chunk of [`K_CHUNK`] k tiles, whose slice of the band (32 KiB)
//! stays in L1; each column pair of the block. C goes out of the tiles after each chunk, into a
//! per-group accumulator, and is loaded back for the next chunk (an exact f32 round trip: the
//! same bits as C kept in the tiles over the whole of k); after the last chunk it goes straight
//! into the output where the 32 × 32 block lies inside it (through the accumulator at the
//! edges and for the fused SwiGLU). B is loaded with `tileloaddt1` (used once per band: kept
//! out of L1, where A's slice is). During a pair's last chunk, the next pair's output block is
//! prefetched for writing, a few lines per k tile: `tilestored` into lines that are not in the
//! cache holds the tile unit until they arrive (C is written once, so they never are).
//!
//! Why (measured on a Sapphire Rapids VM, 1 thread, the dense bench model's shapes, 2048 rows,
//! stand-alone lab kernels): any `tilestored` (even of a tile no `tdpbf16ps` writes) costs
//! ~700–1,000 cycles while the tile loads around it stream from L2, and ~100–300 while A's side
//! hits L1; at k = 1024 one product is ~2,000 cycles of `tdpbf16ps`. C over the whole of k
//! with A and B from L2 ran at 1,150–1,250 GFLOP/s (k = 1024) and 800–990 (k = 2816); 16-tile
//! chunks with A's slice in L1 at 1,350–1,460 and 1,100–1,230. Chunks of 8 or 32 tiles were
//! slower, and so were software prefetches of the next slice of A; without the T1 hint on B,
//! chunks gained nothing. On an Emerald-Rapids-class VM (session 50, lab kernels, 1 thread,
//! best of 30 interleaved rounds): the output prefetch took the mix from 880–910 to 930–970
//! GFLOP/s; the same blocking on operands that stay in L1 runs at ~1,550 and, storing into
//! cache-resident lines, ~1,750 (the tile peak ~2,000–2,100 on real data): what remains is
//! the tile loads from L2 (~8 ns per KiB) and L3 (~40 ns per KiB) that the in-order tile unit
//! cannot hide with only 4 operand tiles. Double-buffered 2 × 1 blocks (6 operand tiles),
//! a larger or smaller B block, other loop orders and software prefetch of A / B were slower.
//!
//! The tile instructions go through a `TileUnit` (`amx_unit.rs`): the CPU's tiles where it has
//! AMX, else — in tests, and under the feature `amx-emu` — their software model
//! (`amx_emu.rs`), which runs this kernel's own code on any CPU.

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
pub(crate) fn hardware() -> bool {
    false
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
pub(crate) fn available() -> bool {
    false
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
pub(super) fn run(job: &super::Job<'_>) {
    super::portable::run(job)
}

#[cfg(all(test, not(all(target_arch = "x86_64", target_os = "linux"))))]
pub(super) fn run_chunked(job: &super::Job<'_>, _k_chunk: usize) {
    super::portable::run(job)
}

#[cfg(all(test, target_arch = "x86_64", target_os = "linux"))]
pub(super) use imp::run_chunked;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(super) use imp::{CTiles, run};
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) use imp::{available, hardware};

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod imp {
    use std::ops::Range;

    use super::super::amx_emu::Emulated;
    pub use super::super::amx_unit::ready as hardware;
    use super::super::amx_unit::{Hardware, TileUnit};
    use super::super::{Job, TILE_N};

    /// Whether the AMX paths run on the emulated tiles where the CPU has none.
    const EMULATION: bool = cfg!(any(test, feature = "amx-emu"));

    /// The AMX paths run here: on the CPU's tiles, or emulated.
    pub fn available() -> bool {
        hardware() || EMULATION
    }

    /// Bytes of B per block of column pairs (kept in L2, 2 MiB here, while the bands of A
    /// pass). With k chunks, 768 KiB – 1 MiB ran best on the bench shapes; 512 KiB was up to
    /// ~10% slower and 2.8 MiB ~40%.
    const B_BLOCK_BYTES: usize = 768 << 10;

    /// k tiles per chunk: A's slice of a band, 2 × 16 tiles = 32 KiB, stays in the 48 KiB L1
    /// while the pairs of a block pass.
    const K_CHUNK: usize = 16;

    /// Cache lines of one product's accumulator: C's 32 rows × 32 f32, contiguous.
    const ACC_LINES: usize = 32 * 32 / 16;

    pub fn run(job: &Job<'_>) {
        run_on(job, K_CHUNK);
    }

    /// [`run`] with chunks of `k_chunk` k tiles (tests: the bits do not depend on it).
    #[cfg(test)]
    pub fn run_chunked(job: &Job<'_>, k_chunk: usize) {
        run_on(job, k_chunk);
    }

    fn run_on(job: &Job<'_>, k_chunk: usize) {
        if hardware() {
            Hardware::with_tiles(|| run_tiles::<Hardware>(job, k_chunk));
        } else {
            assert!(available(), "AMX kernel called without AMX");
            Emulated::with_tiles(|| run_tiles::<Emulated>(job, k_chunk));
        }
    }

    fn run_tiles<U: TileUnit>(job: &Job<'_>, k_chunk: usize) {
        let groups = groups(job);
        let pairs_per_group = if job.fused() { 2 } else { 1 };
        let pair_bytes = job.w.k_tiles() * 2 * std::mem::size_of::<super::super::Tile>();
        let per_block = (B_BLOCK_BYTES / (pair_bytes * pairs_per_group)).max(1);
        let group_lines = pairs_per_group * ACC_LINES;
        let mut acc = vec![CLine([0.0; 16]); per_block.min(groups.len()) * group_lines];
        let kbs = job.w.k_tiles();
        for block in groups.chunks(per_block) {
            for band in 0..job.mp() / 32 {
                for k0 in (0..kbs).step_by(k_chunk) {
                    let ks = k0..(k0 + k_chunk).min(kbs);
                    let last = ks.end == kbs;
                    for (i, acc) in acc.chunks_exact_mut(group_lines).enumerate() {
                        let Some(&group) = block.get(i) else { break };
                        // The next group's output block, warmed while this one computes.
                        let next = block.get(i + 1).filter(|_| last);
                        let next = next.and_then(|g| g.direct_out(job, band * 32));
                        let acc: &mut [f32] = bytemuck::cast_slice_mut(acc);
                        band_group::<U>(job, (band * 32, next), group, ks.clone(), acc);
                    }
                }
            }
        }
    }

    /// k tiles `ks` of C's rows `r0..r0 + 32` × the columns of `group` (a pair, or a gate pair
    /// with its up pair), accumulated in `acc` (per pair 32 rows × 32 f32) between chunks;
    /// after the last chunk, C is stored into the output (or its epilogue run).
    fn band_group<U: TileUnit>(
        job: &Job<'_>,
        (r0, next): (usize, Option<CTiles>),
        group: Group,
        ks: Range<usize>,
        acc: &mut [f32],
    ) {
        let mt = r0 / 16;
        let last = ks.end == job.w.k_tiles();
        let (base, first) = (acc.as_mut_ptr(), ks.start == 0);
        let at = |pair: usize| CTiles::at(base.wrapping_add(pair * 32 * 32), 32 * 4);
        let from = |pair: usize| (!first).then(|| at(pair));
        match group {
            Group::Pair(p) => {
                if let Some(out) = job.direct_out(r0, p).filter(|_| last) {
                    // SAFETY: the tiles stay inside A, the packed weight, `acc` and C.
                    unsafe { product::<U>(job, (mt, 2 * p), ks, (from(0), out), next) };
                    return;
                }
                // SAFETY: as above, C's block in `acc`.
                unsafe { product::<U>(job, (mt, 2 * p), ks, (from(0), at(0)), next) };
                if last {
                    for (r, row) in (r0..(r0 + 32).min(job.m)).zip(acc.chunks_exact(32)) {
                        job.store_row(r, 2 * p * TILE_N, row);
                    }
                }
            }
            Group::GateUp(gate, up) => {
                // SAFETY: as above, the gate block then the up block in `acc`.
                unsafe {
                    product::<U>(job, (mt, 2 * gate), ks.clone(), (from(0), at(0)), None);
                    product::<U>(job, (mt, 2 * up), ks, (from(1), at(1)), None);
                }
                if last {
                    let (g, u) = acc.split_at(32 * 32);
                    let rows = g.chunks_exact(32).zip(u.chunks_exact(32));
                    for (r, (g, u)) in job.epilogue_rows(r0).zip(rows) {
                        job.store_silu_mul(r, 2 * gate * TILE_N, g, u);
                    }
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

    impl Group {
        /// Where this group's C block of rows `r0..r0 + 32` goes straight into the output.
        fn direct_out(self, job: &Job<'_>, r0: usize) -> Option<CTiles> {
            match self {
                Group::Pair(p) => job.direct_out(r0, p),
                Group::GateUp(..) => None,
            }
        }
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

        /// Where tmm0 (upper left), tmm1 (upper right), tmm2, tmm3 (lower) lie.
        fn corners(self) -> [*mut f32; 4] {
            let Self { top, stride } = self;
            let bot = top.wrapping_byte_add(16 * stride);
            [top, top.wrapping_add(16), bot, bot.wrapping_add(16)]
        }

        /// Asks for write ownership of cache lines `lines` of the 64 (32 rows × 2 lines) of
        /// this block: a tile store into lines not in the cache stalls the tile unit until they
        /// arrive (measured on an AMX Xeon: ~5–7% of the GEMM's time at the bench shapes).
        fn prefetch(self, lines: Range<usize>) {
            for q in lines {
                let p = self
                    .top
                    .wrapping_byte_add((q / 2) * self.stride + (q % 2) * 64);
                // SAFETY: a prefetch is a hint: it never faults, whatever the address.
                unsafe {
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_ET0 }>(
                        p.cast::<i8>(),
                    )
                };
            }
        }

        /// Loads C's four tiles.
        ///
        /// # Safety
        /// Inside `U::with_tiles`; `self` addresses 32 rows × 32 f32.
        unsafe fn load<U: TileUnit>(self) {
            let s = self.stride;
            for (c, p) in self.corners().into_iter().enumerate() {
                // SAFETY: (caller) the 32 × 32 block.
                unsafe { U::load_c(c, p, s) };
            }
        }

        /// Stores C's four tiles.
        ///
        /// # Safety
        /// As [`CTiles::load`].
        unsafe fn store<U: TileUnit>(self) {
            let s = self.stride;
            for (c, p) in self.corners().into_iter().enumerate() {
                // SAFETY: (caller) the 32 × 32 block.
                unsafe { U::store_c(c, p, s) };
            }
        }
    }

    /// C tiles of rows `16 mt..16 mt + 32` × columns of tiles `nb, nb + 1`: `load` (zero when
    /// `None`) plus the product over k tiles `ks`, stored to `store`; the lines of `warm` are
    /// prefetched for writing on the way.
    ///
    /// # Safety
    /// Inside `U::with_tiles`; `load` and `store` address 32 rows × 32 f32.
    unsafe fn product<U: TileUnit>(
        job: &Job<'_>,
        (mt, nb): (usize, usize),
        ks: Range<usize>,
        (load, store): (Option<CTiles>, CTiles),
        warm: Option<CTiles>,
    ) {
        let per_step = 64usize.div_ceil(ks.len().max(1));
        // SAFETY: (caller) the C tiles; the A / B tiles are 1 KiB each.
        unsafe {
            match load {
                Some(c) => c.load::<U>(),
                None => (0..4).for_each(|c| U::zero(c)),
            }
            for (j, kb) in ks.enumerate() {
                if let Some(w) = warm {
                    w.prefetch((j * per_step).min(64)..((j + 1) * per_step).min(64));
                }
                let a = [job.a_tile(mt, kb), job.a_tile(mt + 1, kb)];
                let b = [job.w.tile(nb, kb), job.w.tile(nb + 1, kb)];
                U::dp_2x2(a.map(<[u16]>::as_ptr), b.map(<[u16]>::as_ptr));
            }
            store.store::<U>();
        }
    }
}
