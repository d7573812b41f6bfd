//! The tile instructions the AMX kernels issue (the GEMM, `amx.rs`; the attention,
//! `attention_amx.rs`), as a unit they are generic over: [`Hardware`] issues them to the
//! CPU's tiles through `asm!` (the AMX intrinsics are unstable in Rust 1.95; the instructions
//! assemble fine); [`Emulated`](super::amx_emu::Emulated) runs them on a software model of
//! the tiles, so the kernels' own code — blocking, addresses, strides, edges, epilogues — runs
//! and is checked bit for bit on CPUs without AMX (tests, feature `amx-emu`), as `cuda-emu`
//! proves the CUDA kernels without a GPU.
//!
//! The tiles, as both kernels use them (palette 1, every tile 16 rows × 64 bytes): tmm0–3 hold
//! C (16 × 16 f32); the GEMM's A tiles are tmm4 (upper rows) and tmm5 (lower), its B tiles tmm6
//! (left columns) and tmm7 (right); the attention's A is tmm4 and its B rotates over tmm5–7.
//!
//! Linux refuses tile instructions until the process asks for the tile state
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`); [`ready`] asks once.

use std::arch::asm;
use std::sync::OnceLock;

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

/// The tile instructions of the AMX kernels. Tile state is per thread: every method but
/// [`TileUnit::with_tiles`] runs inside a `with_tiles` on the same thread.
pub trait TileUnit {
    /// Runs `f` with the 8 tiles configured as 16 rows × 64 bytes (all zero) on this thread,
    /// then releases the tile state.
    fn with_tiles<R>(f: impl FnOnce() -> R) -> R;

    /// C tile `c` (tmm0–3) zeroed.
    ///
    /// # Safety
    /// Inside [`TileUnit::with_tiles`].
    unsafe fn zero(c: usize);

    /// C tile `c` (tmm0–3) loaded from 16 rows of 16 f32 at `p`, `stride` bytes apart.
    ///
    /// # Safety
    /// Inside [`TileUnit::with_tiles`]; the 16 rows readable.
    unsafe fn load_c(c: usize, p: *const f32, stride: usize);

    /// C tile `c` (tmm0–3) stored as 16 rows of 16 f32 at `p`, `stride` bytes apart.
    ///
    /// # Safety
    /// Inside [`TileUnit::with_tiles`]; the 16 rows writable.
    unsafe fn store_c(c: usize, p: *mut f32, stride: usize);

    /// The GEMM's step over one k tile: `tmm0..3 += [a0; a1] · [b0 b1]` — C's upper left,
    /// upper right, lower left, lower right — each operand a 1 KiB tile of 64-byte rows (B
    /// loaded with the T1 hint: used once per band, kept out of L1).
    ///
    /// # Safety
    /// Inside [`TileUnit::with_tiles`]; the four tiles readable.
    unsafe fn dp_2x2(a: [*const u16; 2], b: [*const u16; 2]);

    /// The attention's A tile (tmm4) loaded from 16 rows of 64 bytes at `p`, `stride` apart.
    ///
    /// # Safety
    /// Inside [`TileUnit::with_tiles`]; the 16 rows readable.
    unsafe fn load_a(p: *const u8, stride: usize);

    /// C tile `c` (tmm0–3) += tmm4 · the B tile at `p` (64-byte rows), loaded into a rotating
    /// register (tmm5, 6, 7, 5 for C 0..3) so that the next load need not wait for this product.
    ///
    /// # Safety
    /// Inside [`TileUnit::with_tiles`]; the 1 KiB tile readable.
    unsafe fn dp_into(c: usize, p: *const u8);
}

/// The CPU's AMX tiles.
pub struct Hardware;

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

/// C tile `$c` (0..4: tmm0–3) loaded from / stored at `$base` (row stride `$stride` bytes).
macro_rules! c_tile {
    ($op:ident, $c:expr, $base:expr, $stride:expr) => {
        match $c {
            0 => c_tile!(@ $op "tmm0", $base, $stride),
            1 => c_tile!(@ $op "tmm1", $base, $stride),
            2 => c_tile!(@ $op "tmm2", $base, $stride),
            _ => c_tile!(@ $op "tmm3", $base, $stride),
        }
    };
    (@ store $tmm:literal, $base:expr, $stride:expr) => {
        asm!(concat!("tilestored [{p} + {s}*1], ", $tmm), p = in(reg) $base,
             s = in(reg) $stride, options(nostack))
    };
    (@ load $tmm:literal, $base:expr, $stride:expr) => {
        asm!(concat!("tileloadd ", $tmm, ", [{p} + {s}*1]"), p = in(reg) $base,
             s = in(reg) $stride, options(nostack, readonly))
    };
}

/// Tile `$c` (C) += tmm4 (A) · tile `$b` (B loaded from `$p`).
macro_rules! dp {
    ($c:literal, $b:literal, $p:expr) => {
        asm!(
            concat!("tileloadd ", $b, ", [{p} + {s}*1]"),
            concat!("tdpbf16ps ", $c, ", tmm4, ", $b),
            p = in(reg) $p, s = in(reg) 64usize, options(nostack, readonly)
        )
    };
}

impl TileUnit for Hardware {
    fn with_tiles<R>(f: impl FnOnce() -> R) -> R {
        assert!(ready(), "AMX kernel called without AMX");
        let cfg = TileConfig::full();
        // SAFETY: AMX is present and permitted (ready); the config is 64 aligned bytes.
        unsafe { asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly)) };
        let r = f();
        // SAFETY: releases this thread's tile state.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
        r
    }

    #[inline(always)]
    unsafe fn zero(c: usize) {
        // SAFETY: tiles configured (caller).
        unsafe {
            match c {
                0 => asm!("tilezero tmm0", options(nostack, nomem)),
                1 => asm!("tilezero tmm1", options(nostack, nomem)),
                2 => asm!("tilezero tmm2", options(nostack, nomem)),
                _ => asm!("tilezero tmm3", options(nostack, nomem)),
            }
        }
    }

    #[inline(always)]
    unsafe fn load_c(c: usize, p: *const f32, stride: usize) {
        // SAFETY: (caller) 16 rows of 64 bytes at `stride` from `p`.
        unsafe { c_tile!(load, c, p, stride) }
    }

    #[inline(always)]
    unsafe fn store_c(c: usize, p: *mut f32, stride: usize) {
        // SAFETY: (caller) 16 rows of 64 bytes at `stride` from `p`.
        unsafe { c_tile!(store, c, p, stride) }
    }

    #[inline(always)]
    unsafe fn dp_2x2([a0, a1]: [*const u16; 2], [b0, b1]: [*const u16; 2]) {
        // SAFETY: (caller) four 1 KiB tiles.
        unsafe {
            asm!(
                "tileloadd tmm4, [{a0} + {s}*1]",
                "tileloaddt1 tmm6, [{b0} + {s}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tileloaddt1 tmm7, [{b1} + {s}*1]",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tileloadd tmm5, [{a1} + {s}*1]",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                a0 = in(reg) a0,
                a1 = in(reg) a1,
                b0 = in(reg) b0,
                b1 = in(reg) b1,
                s = in(reg) 64usize,
                options(nostack, readonly)
            )
        }
    }

    #[inline(always)]
    unsafe fn load_a(p: *const u8, stride: usize) {
        // SAFETY: (caller) 16 rows of 64 bytes at `stride` from `p`.
        unsafe {
            asm!("tileloadd tmm4, [{p} + {s}*1]", p = in(reg) p, s = in(reg) stride,
                 options(nostack, readonly))
        };
    }

    #[inline(always)]
    unsafe fn dp_into(c: usize, p: *const u8) {
        // SAFETY: (caller) a 1 KiB tile at `p`.
        unsafe {
            match c {
                0 => dp!("tmm0", "tmm5", p),
                1 => dp!("tmm1", "tmm6", p),
                2 => dp!("tmm2", "tmm7", p),
                _ => dp!("tmm3", "tmm5", p),
            }
        }
    }
}
