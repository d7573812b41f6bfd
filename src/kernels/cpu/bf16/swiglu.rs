//! The SwiGLU MLP fused into the epilogue of the bf16 kernels (`amx`, `avx512bf16`):
//! `silu(gate) · up` is computed from the C blocks of a stacked `[gate | up]` weight, so the
//! `[m, 2I]` projection is never written; and for the whole MLP ([`matmul_bf16_swiglu_down`])
//! the epilogue rounds `silu(gate) · up` to bf16 straight into the down projection's A tiles,
//! so the `[m, I]` f32 intermediate is never written, read back and rounded either. Both give
//! the bits of the unfused ops: the epilogue computes `silu_mul` in f32 as `ops::silu_mul` does
//! and rounds as [`round_tiles`].

use super::{Bf16Kernel, Job, Out, OutPtr, PAD_M, PAD_N, PackedHalf, TILE_ELEMS, TILE_K};
use super::{Tile, TilesPtr, round_into, round_tiles, run_jobs};
use crate::kernels::cpu::exp::silu_mul_into;
#[cfg(target_arch = "x86_64")]
use {
    super::{round_native, round32_avx512, round32_native_into},
    crate::kernels::cpu::exp::silu16,
};

impl Job<'_> {
    /// The job computes the SwiGLU epilogue (its pairs are gate pairs).
    pub fn fused(&self) -> bool {
        !matches!(self.out, Out::Plain(_))
    }

    /// Rows of the band at `r0` the epilogue writes: the real rows for an f32 output; every
    /// row of the padded band for A tiles, the padding rows as zeros (as [`round_tiles`]: a
    /// padding row only feeds C rows that are never stored, but a reused buffer then holds
    /// no stale bits at all).
    pub fn epilogue_rows(&self, r0: usize) -> std::ops::Range<usize> {
        match self.out {
            Out::SiluMulTiles(_) => r0..r0 + PAD_M,
            _ => r0..(r0 + PAD_M).min(self.m),
        }
    }

    /// End of the rows the epilogue writes: every row of the padded A tiles, or the real rows
    /// of an f32 output.
    pub fn epilogue_end(&self) -> usize {
        match self.out {
            Out::SiluMulTiles(_) => self.mp(),
            _ => self.m,
        }
    }

    /// Writes `silu(g[i]) · u[i]` (32 values) at row `r`, columns `c0..c0 + 32` of the
    /// `[m, n / 2]` output of the fused epilogue: f32, or bf16 in the next GEMM's A tiles
    /// (zeros for a padding row).
    pub fn store_silu_mul(&self, r: usize, c0: usize, g: &[f32], u: &[f32]) {
        let width = self.w.n / 2;
        debug_assert!(c0 + 32 <= width && c0.is_multiple_of(TILE_K));
        match self.out {
            Out::Plain(_) => unreachable!("store_silu_mul on a plain GEMM's job"),
            Out::SiluMul(out) => {
                if r >= self.m {
                    return;
                }
                let mut vals = [0f32; 32];
                silu_mul_into(g, u, &mut vals);
                // SAFETY: row r < m and columns c0..c0 + 32 <= n / 2 lie inside C [m, n / 2];
                // only this job writes the columns of its gate pairs.
                unsafe {
                    out.0
                        .add(r * width + c0)
                        .cast::<[f32; 32]>()
                        .write_unaligned(vals)
                };
            }
            Out::SiluMulTiles(tiles) => {
                let kbs = width / TILE_K;
                let at = ((r / 16) * kbs + c0 / TILE_K) * TILE_ELEMS + (r % 16) * TILE_K;
                // SAFETY: r < m padded to 32 and c0 / 32 < kbs address one row of a tile
                // inside the buffer of `matmul_bf16_swiglu_down`; only this job writes the k
                // tiles of its gate pairs.
                let row = unsafe {
                    std::slice::from_raw_parts_mut(tiles.0.cast::<u16>().add(at), TILE_K)
                };
                if r >= self.m {
                    row.fill(0);
                } else {
                    silu_mul_round(g, u, row);
                }
            }
        }
    }
}

/// `silu(g) · u` of 32 values rounded to bf16 into `row` ([`silu_mul_into`] then
/// [`round_into`]).
fn silu_mul_round(g: &[f32], u: &[f32], row: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    if round_native() {
        // SAFETY: AVX-512F, AVX512-BW and AVX512-BF16 are present; 32 values each.
        unsafe { silu_mul_round32_native(g, u, row) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F is present; g, u and row hold 32 values.
        unsafe { silu_mul_round32(g, u, row) };
        return;
    }
    let mut vals = [0f32; 32];
    silu_mul_into(g, u, &mut vals);
    round_into(&vals, row);
}

/// `silu(g) · u` of 32 values on AVX-512: the operations of [`silu_mul_into`] (the same bits),
/// without the f32 round trip and the two calls per tile row.
///
/// # Safety
/// AVX-512F present; `g` and `u` hold 32 values.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn silu32(g: &[f32], u: &[f32]) -> [f32; 32] {
    let mut vals = [0f32; 32];
    // SAFETY: (caller) 32 values each.
    unsafe {
        silu16(g.as_ptr(), u.as_ptr(), vals.as_mut_ptr());
        silu16(
            g.as_ptr().add(16),
            u.as_ptr().add(16),
            vals.as_mut_ptr().add(16),
        );
    }
    vals
}

/// [`silu32`] rounded into `out` by [`round32_avx512`].
///
/// # Safety
/// AVX-512F present; `g`, `u` and `out` hold 32 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn silu_mul_round32(g: &[f32], u: &[f32], out: &mut [u16]) {
    // SAFETY: (caller).
    round32_avx512(&unsafe { silu32(g, u) }, out);
}

/// [`silu32`] rounded into `out` by [`round32_native_into`].
///
/// # Safety
/// AVX-512F, AVX512-BW and AVX512-BF16 present; `g`, `u` and `out` hold 32 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn silu_mul_round32_native(g: &[f32], u: &[f32], out: &mut [u16]) {
    // SAFETY: (caller).
    unsafe { round32_native_into(&silu32(g, u), out) };
}

/// `c [m, n / 2] = silu(gate) · up` of `a [m, k] · Wᵀ` for a stacked `[gate | up]` weight,
/// in the epilogue of `kernel` (`amx` or `avx512bf16`, on `threads` workers): the `[m, n]`
/// projection is never written. The same bits as [`matmul_bf16`](super::matmul_bf16) on that
/// path then [`silu_mul`](crate::kernels::cpu::ops::silu_mul). Needs `n / 2` a multiple of 32.
pub fn matmul_bf16_silu_mul(
    a: &[f32],
    m: usize,
    w: &PackedHalf,
    c: &mut Vec<f32>,
    (threads, kernel): (usize, Bf16Kernel),
    scratch: &mut Vec<Tile>,
) {
    // Every element is written below: resizing zeroes only growth, not the reused part.
    c.resize(m * (w.n / 2), 0.0);
    matmul_bf16_silu_mul_into(a, m, w, c, (threads, kernel), scratch);
}

/// [`matmul_bf16_silu_mul`] into `c` (`m * n / 2` values, every one written): a MoE expert's
/// rows of the shared activation.
pub fn matmul_bf16_silu_mul_into(
    a: &[f32],
    m: usize,
    w: &PackedHalf,
    c: &mut [f32],
    (threads, kernel): (usize, Bf16Kernel),
    scratch: &mut Vec<Tile>,
) {
    let inter = check_gate_up(a, m, w, kernel);
    assert_eq!(c.len(), m * inter, "fused SwiGLU: output is not [m, n / 2]");
    if m == 0 || w.k == 0 {
        c.fill(0.0);
        return;
    }
    let tiles = round_tiles(a, m, w.k, w.k_tiles(), scratch);
    let out = Out::SiluMul(OutPtr(c.as_mut_ptr()));
    run_jobs(tiles, m, w, out, inter / PAD_N, (threads, kernel));
}

/// The SwiGLU MLP `c [m, n'] = down(silu(gate) · up)` of `a [m, k]`, `gate_up` a stacked
/// `[gate | up]` weight `[2I, k]` and `down` `[n', I]`: the epilogue of the first GEMM writes
/// `silu(gate) · up` as bf16 A tiles (`act`, reused between calls) that the second reads.
/// The same bits as [`matmul_bf16_silu_mul`] then [`matmul_bf16`](super::matmul_bf16) on
/// `kernel` (`amx` or `avx512bf16`). Needs `I` a multiple of 32 and `down.k == I`.
pub fn matmul_bf16_swiglu_down(
    a: &[f32],
    m: usize,
    (gate_up, down): (&PackedHalf, &PackedHalf),
    c: &mut Vec<f32>,
    (threads, kernel): (usize, Bf16Kernel),
    (scratch, act): (&mut Vec<Tile>, &mut Vec<Tile>),
) {
    let inter = check_gate_up(a, m, gate_up, kernel);
    assert_eq!(down.k, inter, "matmul_bf16_swiglu_down: down is not [n, I]");
    let k = gate_up.k;
    if m == 0 || k == 0 {
        // silu(0) · 0 = 0 in every column: C = 0.
        c.clear();
        c.resize(m * down.n, 0.0);
        return;
    }
    let tiles = round_tiles(a, m, k, gate_up.k_tiles(), scratch);
    // Every tile of the first `mp / 16 * kbs` is written by the epilogue (padding rows too).
    let act_len = m.div_ceil(PAD_M) * PAD_M / 16 * down.k_tiles();
    if act.len() < act_len {
        act.resize(act_len, Tile([0; TILE_ELEMS]));
    }
    let out = Out::SiluMulTiles(TilesPtr(act.as_mut_ptr()));
    let pairs = inter / PAD_N;
    run_jobs(tiles, m, gate_up, out, pairs, (threads, kernel));
    // Every element of C is written by the second GEMM: resizing zeroes only growth.
    c.resize(m * down.n, 0.0);
    let out = Out::Plain(OutPtr(c.as_mut_ptr()));
    let pairs = down.column_tiles() / 2;
    run_jobs(&act[..act_len], m, down, out, pairs, (threads, kernel));
}

/// `I`, after checking that `w` is a `[gate | up]` weight the fused epilogue of `kernel`
/// takes.
fn check_gate_up(a: &[f32], m: usize, w: &PackedHalf, kernel: Bf16Kernel) -> usize {
    assert!(
        kernel.fuses_swiglu() && kernel.available() && w.n.is_multiple_of(2 * PAD_N),
        "fused SwiGLU: needs the amx or avx512bf16 path (has {kernel}) and n / 2 a multiple of 32"
    );
    assert_eq!(a.len(), m * w.k, "fused SwiGLU: lhs is not [m, k]");
    w.n / 2
}
