//! A software model of the AMX tiles ([`Emulated`]): the AMX kernels run their own code on it
//! where the CPU has no AMX — in the library's tests on every machine, and for a whole model
//! under the feature `amx-emu` (`cpu_bf16_kernel = "amx"`; the models matrix in CI). Slow
//! (scalar), never chosen by `auto`.
//!
//! It models what the kernels rely on: eight tiles of 16 rows × 64 bytes per thread,
//! configured by `with_tiles` (zeroed, as `ldtilecfg` leaves them) and gone after it (a tile
//! instruction outside panics: the CPU would fault); loads and stores of 16 rows at a byte
//! stride from raw addresses (A and B operands on cache lines, which the CPU needs for its
//! rate: a misaligned one panics); and `tdpbf16ps` as Intel's SDM writes it — per C element, over
//! the dword pairs of A's row and B's column in order, the even product then the odd one added
//! in f32 (round to nearest even), bf16 inputs that are denormal read as zero and denormal
//! sums flushed to zero. On normal values that is the pair order of the bf16 paths' scalar
//! reference (`portable.rs`), so an emulated AMX product has its bits. (The SDM does not
//! promise that real AMX rounds each product's sum separately: on hardware the tests hold AMX
//! to the f64 product's tolerance instead.)

use std::cell::RefCell;

use super::amx_unit::TileUnit;

/// A tile: 16 rows of 16 dwords (f32 C elements, or A / B bf16 pairs).
type TileRegs = [[u32; 16]; 16];

thread_local! {
    /// This thread's tiles while configured.
    static TILES: RefCell<Option<[TileRegs; 8]>> = const { RefCell::new(None) };
}

/// The AMX tiles in software.
pub struct Emulated;

/// Runs `f` on this thread's configured tiles.
fn on_tiles<R>(f: impl FnOnce(&mut [TileRegs; 8]) -> R) -> R {
    TILES.with_borrow_mut(|t| {
        f(t.as_mut()
            .expect("tile instruction outside with_tiles (the CPU would fault)"))
    })
}

/// `tileloadd`: tile `t` from 16 rows of 64 bytes at `p`, `stride` bytes apart.
///
/// # Safety
/// The 16 rows readable.
unsafe fn load(t: usize, p: *const u8, stride: usize) {
    let mut regs = [[0u32; 16]; 16];
    for (r, row) in regs.iter_mut().enumerate() {
        // SAFETY: (caller) row r's 64 bytes.
        *row = unsafe { p.add(r * stride).cast::<[u32; 16]>().read_unaligned() };
    }
    on_tiles(|tiles| tiles[t] = regs);
}

/// `tileloadd` of an A or B operand: as [`load`], and its rows must start on cache lines. The
/// CPU loads rows that straddle two lines at a third of the rate (`bf16::Tile`), so the kernels
/// keep their operands line-aligned by construction; the emulator holds them to it, which no
/// test could see otherwise without AMX.
///
/// # Safety
/// As [`load`].
unsafe fn load_operand(t: usize, p: *const u8, stride: usize) {
    assert!(
        (p as usize).is_multiple_of(64) && stride.is_multiple_of(64),
        "AMX operand tile at {p:?}, row stride {stride}: rows straddle cache lines"
    );
    // SAFETY: (caller).
    unsafe { load(t, p, stride) }
}

/// `tilestored`: tile `t` to 16 rows of 64 bytes at `p`, `stride` bytes apart.
///
/// # Safety
/// The 16 rows writable.
unsafe fn store(t: usize, p: *mut u8, stride: usize) {
    let regs = on_tiles(|tiles| tiles[t]);
    for (r, row) in regs.iter().enumerate() {
        // SAFETY: (caller) row r's 64 bytes.
        unsafe { p.add(r * stride).cast::<[u32; 16]>().write_unaligned(*row) };
    }
}

/// A bf16 as f32, denormals read as zero (DAZ).
fn bf16_daz(bits: u32) -> f32 {
    let x = f32::from_bits((bits & 0xffff) << 16);
    if x.is_subnormal() {
        0.0f32.copysign(x)
    } else {
        x
    }
}

/// `a + b` with a denormal result flushed to zero (FTZ).
fn add_ftz(a: f32, b: f32) -> f32 {
    let s = a + b;
    if s.is_subnormal() {
        0.0f32.copysign(s)
    } else {
        s
    }
}

/// `tdpbf16ps c, a, b` (SDM pseudo-code): `C[m][n] += Σ_k A[m].pair[k] · B[k].pair[n]`, per
/// pair the even product then the odd one, k in order.
fn tdpbf16ps(c: usize, a: usize, b: usize) {
    on_tiles(|tiles| {
        let (ta, tb) = (tiles[a], tiles[b]);
        for (m, row) in tiles[c].iter_mut().enumerate() {
            for (n, out) in row.iter_mut().enumerate() {
                let mut acc = f32::from_bits(*out);
                for k in 0..16 {
                    let (x, y) = (ta[m][k], tb[k][n]);
                    acc = add_ftz(acc, bf16_daz(x) * bf16_daz(y));
                    acc = add_ftz(acc, bf16_daz(x >> 16) * bf16_daz(y >> 16));
                }
                *out = acc.to_bits();
            }
        }
    });
}

impl TileUnit for Emulated {
    fn with_tiles<R>(f: impl FnOnce() -> R) -> R {
        /// Puts the tiles of before back, also when `f` panics.
        struct Restore(Option<[TileRegs; 8]>);
        impl Drop for Restore {
            fn drop(&mut self) {
                TILES.set(self.0.take());
            }
        }
        let _restore = Restore(TILES.replace(Some([[[0; 16]; 16]; 8])));
        f()
    }

    unsafe fn zero(c: usize) {
        on_tiles(|tiles| tiles[c] = [[0; 16]; 16]);
    }

    unsafe fn load_c(c: usize, p: *const f32, stride: usize) {
        // SAFETY: (caller).
        unsafe { load(c, p.cast(), stride) }
    }

    unsafe fn store_c(c: usize, p: *mut f32, stride: usize) {
        // SAFETY: (caller).
        unsafe { store(c, p.cast(), stride) }
    }

    /// The instructions of the hardware's step, in its order and registers.
    unsafe fn dp_2x2([a0, a1]: [*const u16; 2], [b0, b1]: [*const u16; 2]) {
        // SAFETY: (caller) four 1 KiB tiles.
        unsafe {
            load_operand(4, a0.cast(), 64);
            load_operand(6, b0.cast(), 64);
            tdpbf16ps(0, 4, 6);
            load_operand(7, b1.cast(), 64);
            tdpbf16ps(1, 4, 7);
            load_operand(5, a1.cast(), 64);
            tdpbf16ps(2, 5, 6);
            tdpbf16ps(3, 5, 7);
        }
    }

    unsafe fn load_a(p: *const u8, stride: usize) {
        // SAFETY: (caller).
        unsafe { load_operand(4, p, stride) }
    }

    unsafe fn dp_into(c: usize, p: *const u8) {
        let b = [5, 6, 7, 5][c.min(3)];
        // SAFETY: (caller) a 1 KiB tile.
        unsafe { load_operand(b, p, 64) };
        tdpbf16ps(c.min(3), 4, b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bf(x: f32) -> u32 {
        u32::from(half::bf16::from_f32(x).to_bits())
    }

    /// One `tdpbf16ps` on known tiles: sums in pair order, DAZ on inputs, FTZ on sums, C's
    /// previous value the start of each sum; outside `with_tiles` an instruction panics, and
    /// so does an operand load off cache lines.
    #[test]
    fn tdpbf16ps_follows_the_sdm() {
        let mut a = [[0u32; 16]; 16];
        let mut b = [[0u32; 16]; 16];
        // Row 0 of A: pair 0 = (1, 2), pair 1 = (3, a denormal); column 0 of B: (4, 5), (6, 7).
        a[0][0] = bf(1.0) | bf(2.0) << 16;
        a[0][1] = bf(3.0) | 0x0001 << 16;
        b[0][0] = bf(4.0) | bf(5.0) << 16;
        b[1][0] = bf(6.0) | bf(7.0) << 16;
        // Row 1: 1e-30 · 1e-10 = 1e-40, a denormal sum, flushed (pair 2, which row 0 lacks).
        a[1][2] = bf(1e-30);
        b[2][1] = bf(1e-10);
        let mut c = [[0f32; 16]; 16];
        c[0][0] = 0.5;
        let got = Emulated::with_tiles(|| unsafe {
            Emulated::load_c(0, c.as_ptr().cast(), 64);
            load(4, a.as_ptr().cast(), 64);
            load(6, b.as_ptr().cast(), 64);
            tdpbf16ps(0, 4, 6);
            let mut out = [[0f32; 16]; 16];
            Emulated::store_c(0, out.as_mut_ptr().cast(), 64);
            out
        });
        // 0.5 + 1·4 + 2·5 + 3·6 + denormal·7 (read as 0).
        assert_eq!(got[0][0], 32.5);
        assert_eq!(got[1][1].to_bits(), 0, "1e-40 flushed");
        assert!(got.iter().flatten().skip(1).all(|&v| v == 0.0));
        let outside = std::panic::catch_unwind(|| unsafe { Emulated::zero(0) });
        assert!(outside.is_err(), "a tile instruction outside with_tiles");
        // An operand whose rows straddle cache lines (a third of the rate on the CPU).
        #[repr(C, align(64))]
        struct Lines([u8; 2048]);
        let lines = Lines([0; 2048]);
        let misaligned = std::panic::catch_unwind(|| {
            let p = lines.0.as_ptr().wrapping_add(4);
            Emulated::with_tiles(|| unsafe { Emulated::load_a(p, 64) })
        });
        // The same rows on their lines load.
        Emulated::with_tiles(|| unsafe { Emulated::load_a(lines.0.as_ptr(), 64) });
        assert!(misaligned.is_err(), "a misaligned operand load");
    }
}
