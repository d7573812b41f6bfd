//! bf16 weights kept as bf16, and `C = A · Wᵀ` at the CPU's bf16 rate; f16 weights kept as
//! f16 in the same tiles ([`Half::F16`]: their own order within a tile row), multiplied
//! widened in registers (`avx512`, `avx2`) or panel by panel (`f32`) — f32 compute, half the
//! memory of widening them at load ([`Bf16Kernel::for_f16`] maps the other paths onto those).
//!
//! # Layout
//! A bf16 weight `W [n, k]` (torch Linear layout) is repacked once at load into tiles of 16
//! output columns × 32 inputs ([`PackedHalf`]): tile row `kk` holds, for each of the 16 columns
//! `j`, the pair `W[j][2kk], W[j][2kk + 1]` — the "VNNI" layout both `tdpbf16ps` (AMX, one tile
//! = one B operand) and `vdpbf16ps` (AVX512-BF16, one tile row = one zmm) read. n is padded to
//! 32 columns and k to 32 inputs with zeros, so every tile is whole.
//!
//! # Paths ([`Bf16Kernel`], chosen at run time)
//! - `amx`: AMX-BF16 tiles (`amx.rs`); activations rounded to bf16, f32 accumulation.
//! - `avx512bf16`: `vdpbf16ps` (`avx512.rs`); activations rounded to bf16, f32 accumulation.
//! - `avx512`: f32 activations times the tiles widened in registers, AVX-512F FMA
//!   (`avx512f.rs`): the numerics of f32 compute, without a widened copy of the weights;
//!   AVX-512F CPUs without a bf16 unit. The bits of `avx2`.
//! - `avx2`: the same on AVX2 FMA (`avx2.rs`). AVX2 CPUs without AVX-512F.
//! - `f32`: the weights widened panel by panel and multiplied in f32 by the `gemm` crate
//!   (`widen.rs`): the numerics of f32 compute, bf16 in memory. Any x86-64 (AVX2 / AVX-512F);
//!   never chosen by `auto` where AVX2 is present.
//!
//! # Row invariance (DESIGN.md §7 a)
//! On the bf16 paths every output element is accumulated over the same sequence of k pairs
//! (tile after tile, row after row) whatever M, the row's position or the thread count: rows
//! only pick which A tile row is loaded, threads split the columns, never k. The `avx2` and
//! `avx512` paths keep one FMA chain per output over k in order. The `f32` path inherits [`matmul_wt`](super::matmul::matmul_wt)'s invariance.

mod amx;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod amx_emu;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod amx_unit;
mod avx2;
mod avx512;
mod avx512f;

pub(crate) use amx::hardware as amx_hardware;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) use amx_unit::TileUnit;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) use {amx_emu::Emulated as AmxEmulated, amx_unit::Hardware as AmxHardware};
mod portable;
mod round;
mod swiglu;
mod widen;

pub(crate) use round::{pairs_cvt, pairs_native, round_into, round_native, round32_native};
use round::{round_row, round32_avx512, round32_native_into};
pub use swiglu::{matmul_bf16_silu_mul, matmul_bf16_silu_mul_into, matmul_bf16_swiglu_down};

use std::fmt;

use half::bf16;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// Output columns per tile.
pub const TILE_N: usize = 16;
/// Inputs (bf16) per tile row... and rows of bf16 pairs per tile: 16 rows × 32 bf16.
pub const TILE_K: usize = 32;
/// u16 elements of one tile (1 KiB).
const TILE_ELEMS: usize = TILE_N * TILE_K;
/// Columns are padded to whole pairs of tiles (the AMX kernel computes 2 column tiles at once).
const PAD_N: usize = 2 * TILE_N;
/// Rows of A are padded to whole pairs of tiles.
pub const PAD_M: usize = 32;

/// One 1 KiB tile on a cache-line boundary: AMX tile loads whose 64-byte rows straddle two
/// lines run at a third of the aligned rate (measured on Sapphire Rapids: 1,000 vs 3,100
/// GFLOP/s with every operand in L1), and a large `Vec<u16>` from malloc is only 16-byte
/// aligned.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy)]
pub struct Tile([u16; TILE_ELEMS]);

// SAFETY: a plain array of u16, 1 KiB (a multiple of its 64-byte alignment): no padding.
unsafe impl bytemuck::Zeroable for Tile {}
// SAFETY: as above; every bit pattern is a valid u16 array.
unsafe impl bytemuck::Pod for Tile {}

/// `tiles` zeroed tiles.
fn zeroed_tiles(tiles: usize) -> Vec<Tile> {
    vec![Tile([0; TILE_ELEMS]); tiles]
}

/// Which kernel multiplies bf16 weights (`[model] cpu_bf16_kernel`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Bf16Kernel {
    /// The fastest this CPU has: amx, else avx512bf16, else avx512, else avx2, else f32.
    #[default]
    Auto,
    Amx,
    Avx512bf16,
    /// f32 activations times the weights widened in registers, AVX-512F FMA: `avx2`'s bits.
    Avx512,
    /// f32 activations times the weights widened in registers, AVX2 FMA.
    Avx2,
    /// The rounding of `amx` / `avx512bf16` in scalar code, on any CPU: slow, never chosen by
    /// `auto`; the numerics of a GPU's bf16 GEMMs where neither unit exists (checks, tests).
    Portable,
    /// Widened to f32 panel by panel (f32 compute, bf16 in memory).
    F32,
}

impl fmt::Display for Bf16Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Amx => "amx",
            Self::Avx512bf16 => "avx512bf16",
            Self::Avx512 => "avx512",
            Self::Avx2 => "avx2",
            Self::Portable => "portable",
            Self::F32 => "f32",
        })
    }
}

impl Bf16Kernel {
    /// Whether this CPU (and OS) can run the path: `amx` also on the emulated tiles, where
    /// they are built in (tests, feature `amx-emu`; see [`Bf16Kernel::native`]).
    pub fn available(self) -> bool {
        match self {
            Self::Auto | Self::F32 | Self::Portable => true,
            Self::Amx => amx::available(),
            Self::Avx512bf16 => avx512::available(),
            Self::Avx512 => avx512f::available(),
            Self::Avx2 => avx2::available(),
        }
    }

    /// Whether the CPU itself runs the path (`amx` on its tiles, not emulated).
    pub fn native(self) -> bool {
        match self {
            Self::Amx => amx::hardware(),
            k => k.available(),
        }
    }

    /// `Auto` resolved to the fastest path the CPU runs natively; an explicit path this CPU
    /// lacks is an error.
    pub fn resolve(self) -> Result<Self, String> {
        match self {
            Self::Auto => Ok([Self::Amx, Self::Avx512bf16, Self::Avx512, Self::Avx2]
                .into_iter()
                .find(|k| k.native())
                .unwrap_or(Self::F32)),
            k if k.available() => Ok(k),
            k => Err(format!(
                "cpu_bf16_kernel = \"{k}\": this CPU does not have it (has: {})",
                Self::all_available().join(", ")
            )),
        }
    }

    /// The path f16 weights take where bf16 weights take `self`: no unit multiplies f16
    /// pairs into f32, so the paths that round to bf16 (and `auto`) become the widest one that
    /// widens in registers this CPU has, else `f32` (f32 compute on every path).
    pub fn for_f16(self) -> Self {
        let (wide, narrow) = (avx512f::available(), avx2::available());
        match self {
            Self::Avx2 if narrow => Self::Avx2,
            Self::Auto | Self::Amx | Self::Avx512bf16 | Self::Avx512 if wide => Self::Avx512,
            Self::Auto | Self::Amx | Self::Avx512bf16 | Self::Avx512 if narrow => Self::Avx2,
            _ => Self::F32,
        }
    }

    /// Whether the path multiplies f32 activations by the weights widened in registers
    /// (`avx2`, `avx512`: f32 compute, one FMA chain per output, the same bits on both).
    pub fn widens_in_registers(self) -> bool {
        matches!(self, Self::Avx2 | Self::Avx512)
    }

    /// Whether the path's kernel has the fused SwiGLU epilogue (`swiglu.rs`).
    pub fn fuses_swiglu(self) -> bool {
        matches!(self, Self::Amx | Self::Avx512bf16)
    }

    /// The concrete paths this CPU runs.
    pub fn all_available() -> Vec<String> {
        [
            Self::Amx,
            Self::Avx512bf16,
            Self::Avx512,
            Self::Avx2,
            Self::F32,
            Self::Portable,
        ]
        .into_iter()
        .filter(|k| k.available())
        .map(|k| match k.native() {
            true => k.to_string(),
            false => format!("{k} (emulated)"),
        })
        .collect()
    }
}

/// The 16-bit float format of packed weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Half {
    /// bfloat16: every path; tile rows in VNNI pairs (module docs).
    Bf16,
    /// IEEE half (f16 checkpoints): the paths that widen in registers (`avx2`, `avx512`) and
    /// `f32`, f32 compute. A tile row `kk` holds the 16 columns' `W[j][2kk]`, then their
    /// `W[j][2kk + 1]`: 8 or 16 of one input are one `vcvtph2ps` from memory.
    F16,
}

/// `W [n, k]` in 16-bit tiles (module docs): tile `(nb, kb)` at `(nb * kbs + kb) * TILE_ELEMS`.
#[derive(Debug, Clone)]
pub struct PackedHalf {
    pub n: usize,
    pub k: usize,
    pub half: Half,
    /// Tiles along k (`k` padded to `kbs * 32`).
    kbs: usize,
    /// Tiles along n (`n` padded to `nbs * 16`, `nbs` even).
    nbs: usize,
    data: Vec<Tile>,
}

impl PackedHalf {
    /// Packs `w` (`[n, k]` row-major bits of `half`).
    pub fn pack(w: &[u16], n: usize, k: usize, half: Half) -> Self {
        assert_eq!(w.len(), n * k, "PackedHalf::pack: weight is not [n, k]");
        let kbs = k.div_ceil(TILE_K);
        let nbs = n.div_ceil(PAD_N) * (PAD_N / TILE_N);
        let mut data = zeroed_tiles(nbs * kbs);
        bytemuck::cast_slice_mut::<Tile, u16>(&mut data)
            .par_chunks_mut(kbs * TILE_ELEMS)
            .enumerate()
            .for_each(|(nb, panel)| {
                for j in 0..TILE_N {
                    let col = nb * TILE_N + j;
                    if col >= n {
                        break;
                    }
                    for (i, &v) in w[col * k..(col + 1) * k].iter().enumerate() {
                        panel[Self::offset_in_panel(i, j, half)] = v;
                    }
                }
            });
        Self {
            n,
            k,
            half,
            kbs,
            nbs,
            data,
        }
    }

    /// Offset of `W[nb * 16 + j][i]` inside column block `nb`'s panel.
    fn offset_in_panel(i: usize, j: usize, half: Half) -> usize {
        let (kb, r) = (i / TILE_K, i % TILE_K);
        let in_row = match half {
            Half::Bf16 => j * 2 + (r % 2),
            Half::F16 => (r % 2) * TILE_N + j,
        };
        kb * TILE_ELEMS + (r / 2) * TILE_K + in_row
    }

    /// Tile `(nb, kb)`.
    pub fn tile(&self, nb: usize, kb: usize) -> &[u16] {
        &self.data[nb * self.kbs + kb].0
    }

    /// Row `row` of `W` (one output column's weights), widened into `out[..k]`.
    pub fn row_into(&self, row: usize, out: &mut [f32]) {
        // `W[row][2kk], W[row][2kk + 1]` lie in tile row `kk` at `2j, 2j + 1` (bf16) or
        // `j, 16 + j` (f16).
        let j = row % TILE_N;
        match self.half {
            Half::Bf16 => self.widen_row(row, (2 * j, 1), out, |b| bf16::from_bits(b).to_f32()),
            Half::F16 => {
                self.widen_row(row, (j, TILE_N), out, |b| half::f16::from_bits(b).to_f32())
            }
        }
    }

    /// [`Self::row_into`] for one format (the match is out of the loop: the `f32` path widens
    /// every weight per call): the row's pair of tile row `kk` at `at`, `at + step`.
    fn widen_row(
        &self,
        row: usize,
        (at, step): (usize, usize),
        out: &mut [f32],
        widen: impl Fn(u16) -> f32,
    ) {
        let nb = row / TILE_N;
        let panel = &self.data[nb * self.kbs..(nb + 1) * self.kbs];
        // Tile by tile, pair row by pair row: no division per element (embedding lookups).
        for (tile, o) in panel.iter().zip(out[..self.k].chunks_mut(TILE_K)) {
            for (line, o) in tile.0.chunks_exact(TILE_K).zip(o.chunks_mut(2)) {
                for (h, d) in o.iter_mut().enumerate() {
                    *d = widen(line[at + h * step]);
                }
            }
        }
    }

    pub fn k_padded(&self) -> usize {
        self.kbs * TILE_K
    }

    pub fn column_tiles(&self) -> usize {
        self.nbs
    }

    pub fn k_tiles(&self) -> usize {
        self.kbs
    }
}

/// `a [m, k]` (f32) rounded to bf16 (nearest even, as torch) into tiles of 16 rows × 32
/// inputs, `[m padded to 32 / 16][kbs][16][32]`, zero padding: one A tile is 1 KiB contiguous
/// (no cache-set conflicts from a power-of-two row stride) and cache-line aligned ([`Tile`]).
/// Every element is written (the padding with zeros) and `out` only grows: it is reused
/// without clearing (a GEMM of k = 1024 after one of k = 2816 would otherwise zero the
/// difference again on every call). Returns the tiles of this call, the front of `out`.
pub fn round_tiles<'a>(
    a: &[f32],
    m: usize,
    k: usize,
    kbs: usize,
    out: &'a mut Vec<Tile>,
) -> &'a [Tile] {
    let tiles = m.div_ceil(PAD_M) * PAD_M / 16 * kbs;
    if out.len() < tiles {
        out.resize(tiles, Tile([0; TILE_ELEMS]));
    }
    let out = &mut out[..tiles];
    bytemuck::cast_slice_mut::<Tile, u16>(out)
        .par_chunks_mut(kbs * TILE_ELEMS)
        .enumerate()
        .for_each(|(mt, band)| {
            for r in 0..16 {
                let row = mt * 16 + r;
                let src = if row < m {
                    &a[row * k..(row + 1) * k]
                } else {
                    &[]
                };
                round_row(src, r, band);
            }
        });
    out
}

/// The output, written by workers at disjoint columns.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: each worker writes only the columns of its own tile range (see `matmul_bf16` and
// `avx2::matmul`).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The pointer (a method, so closures capture the `Send` wrapper, not its field).
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// What a worker computes: C's columns of tile pairs `pairs` for rows `0..m`.
pub(crate) struct Job<'a> {
    /// A rounded to bf16 in tiles ([`round_tiles`]).
    pub a: &'a [u16],
    pub m: usize,
    pub w: &'a PackedHalf,
    pub pairs: std::ops::Range<usize>,
    out: Out,
}

/// Where a job writes C.
#[derive(Clone, Copy)]
enum Out {
    /// C itself, f32 `[m, n]`.
    Plain(OutPtr),
    /// The fused SwiGLU epilogue (`swiglu.rs`): `pairs` are pairs of the gate half of a
    /// `[gate | up]` weight; C is `silu(gate) · up`, f32 `[m, n / 2]`.
    SiluMul(OutPtr),
    /// As `SiluMul`, rounded to bf16 into the A tiles of a GEMM with k = n / 2.
    SiluMulTiles(TilesPtr),
}

/// A tiles ([`round_tiles`]' layout), written by workers at disjoint k tiles.
#[derive(Clone, Copy)]
struct TilesPtr(*mut Tile);
// SAFETY: each worker writes only the k tiles of its own gate pairs (see `swiglu.rs`).
unsafe impl Send for TilesPtr {}
unsafe impl Sync for TilesPtr {}

impl Job<'_> {
    /// Rows padded to [`PAD_M`].
    pub fn mp(&self) -> usize {
        self.a.len() / self.w.k_padded()
    }

    /// A tile of rows `16 mt..16 mt + 16`, inputs `32 kb..32 kb + 32` (row stride 32).
    pub fn a_tile(&self, mt: usize, kb: usize) -> &[u16] {
        let at = (mt * self.w.k_tiles() + kb) * TILE_ELEMS;
        &self.a[at..at + TILE_ELEMS]
    }

    /// A's bf16 inputs `2 kk, 2 kk + 1` of tile `kb`, row `r`, as one u32 (low half first).
    pub fn a_pair(&self, r: usize, kb: usize, kk: usize) -> u32 {
        let t = self.a_tile(r / 16, kb);
        let i = (r % 16) * TILE_K + 2 * kk;
        u32::from(t[i]) | (u32::from(t[i + 1]) << 16)
    }

    /// C's 32 × 32 block at rows `r0..r0 + 32`, columns of pair `p`, as a tile target (row
    /// stride `4 n` bytes), when it lies wholly inside `C [m, n]` and C holds this GEMM's
    /// columns (not the fused epilogue's); `None` otherwise.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    pub(crate) fn direct_out(&self, r0: usize, p: usize) -> Option<amx::CTiles> {
        let n = self.w.n;
        let Out::Plain(out) = self.out else {
            return None;
        };
        if r0 + 32 > self.m || (p + 1) * PAD_N > n {
            return None;
        }
        // SAFETY: rows r0..r0 + 32 <= m and columns 32 p..32 p + 32 <= n lie inside C [m, n];
        // only this job writes the columns of pair p.
        Some(amx::CTiles::at(
            unsafe { out.0.add(r0 * n + p * PAD_N) },
            n * 4,
        ))
    }

    /// Writes `vals` at row `r`, columns `c0..`, clipped to `[m, n]`.
    pub fn store_row(&self, r: usize, c0: usize, vals: &[f32]) {
        let n = self.w.n;
        let cols = n.saturating_sub(c0).min(vals.len());
        let Out::Plain(out) = self.out else {
            unreachable!("store_row on a fused epilogue's job");
        };
        if r >= self.m || cols == 0 {
            return;
        }
        // SAFETY: row r < m and columns c0..c0 + cols <= n lie inside C [m, n]; only this
        // job writes the columns of its tile pairs.
        unsafe {
            let dst = out.0.add(r * n + c0);
            if cols == 32 {
                // A whole column pair, as a fixed-size copy (inlined moves, not a memmove call
                // per 128 bytes).
                let v = vals.as_ptr().cast::<[f32; 32]>().read_unaligned();
                dst.cast::<[f32; 32]>().write_unaligned(v);
            } else {
                std::ptr::copy_nonoverlapping(vals.as_ptr(), dst, cols);
            }
        }
    }

    /// Writes the `16 × 16` tile `vals` (row stride 16) at rows `r0..`, columns `c0..`,
    /// clipped to `[m, n]`.
    pub fn store_tile(&self, r0: usize, c0: usize, vals: &[f32; 256]) {
        for r in 0..16 {
            self.store_row(r0 + r, c0, &vals[r * 16..(r + 1) * 16]);
        }
    }
}

/// `c [m, n] = a [m, k] · Wᵀ` on `kernel` (a resolved path), `threads` workers (call from
/// inside the pool that should run it). `scratch` keeps A's bf16 copy between calls.
pub fn matmul_bf16(
    a: &[f32],
    m: usize,
    w: &PackedHalf,
    c: &mut Vec<f32>,
    threads: usize,
    kernel: Bf16Kernel,
    scratch: &mut Vec<Tile>,
) {
    // Every element is written: resizing zeroes only growth, not the reused part.
    c.resize(m * w.n, 0.0);
    matmul_bf16_into(a, m, w, c, threads, kernel, scratch);
}

/// [`matmul_bf16`] into `c` (`m * n` values, every one written).
pub fn matmul_bf16_into(
    a: &[f32],
    m: usize,
    w: &PackedHalf,
    c: &mut [f32],
    threads: usize,
    kernel: Bf16Kernel,
    scratch: &mut Vec<Tile>,
) {
    let (n, k) = (w.n, w.k);
    assert_eq!(a.len(), m * k, "matmul_bf16: lhs is not [m, k]");
    assert_eq!(c.len(), m * n, "matmul_bf16: output is not [m, n]");
    if m == 0 || n == 0 {
        return;
    }
    // (f16 weights on a path that rounds to bf16 — a caller that did not map its path with
    // `for_f16` — are multiplied in f32 as well.)
    let f16_rounding = w.half == Half::F16 && !kernel.widens_in_registers();
    if kernel == Bf16Kernel::F32 || k == 0 || f16_rounding {
        widen::matmul(a, m, w, c, threads);
        return;
    }
    if kernel.widens_in_registers() {
        let wide = kernel == Bf16Kernel::Avx512;
        avx2::matmul(a, m, w, c, (threads, wide), scratch);
        return;
    }
    let tiles = round_tiles(a, m, k, w.k_tiles(), scratch);
    let out = Out::Plain(OutPtr(c.as_mut_ptr()));
    run_jobs(tiles, m, w, out, w.column_tiles() / 2, (threads, kernel));
}

/// Splits column pairs `0..pairs` among `threads` workers running `kernel` on the rounded
/// `scratch`, writing to `out`.
fn run_jobs(
    scratch: &[Tile],
    m: usize,
    w: &PackedHalf,
    out: Out,
    pairs: usize,
    (threads, kernel): (usize, Bf16Kernel),
) {
    let workers = threads.clamp(1, pairs.max(1));
    let run = |i: usize| {
        let job = Job {
            a: bytemuck::cast_slice(scratch),
            m,
            w,
            pairs: pairs * i / workers..pairs * (i + 1) / workers,
            out,
        };
        match kernel {
            Bf16Kernel::Amx => amx::run(&job),
            Bf16Kernel::Avx512bf16 => avx512::run(&job),
            _ => portable::run(&job),
        }
    };
    if workers == 1 {
        run(0);
    } else {
        (0..workers).into_par_iter().for_each(run);
    }
}

/// The reference of the bf16 paths (tests): same rounding, same pair order, scalar.
pub fn matmul_portable(a: &[f32], m: usize, w: &PackedHalf, c: &mut Vec<f32>) {
    let mut scratch = Vec::new();
    let tiles = round_tiles(a, m, w.k, w.k_tiles(), &mut scratch);
    c.clear();
    c.resize(m * w.n, 0.0);
    let job = Job {
        a: bytemuck::cast_slice(tiles),
        m,
        w,
        pairs: 0..w.column_tiles() / 2,
        out: Out::Plain(OutPtr(c.as_mut_ptr())),
    };
    portable::run(&job);
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_f16;
