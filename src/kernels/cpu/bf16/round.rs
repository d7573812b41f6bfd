//! f32 → bf16, round to nearest even (NaN stays NaN, quiet), as `half::bf16::from_f32` and
//! torch, on three paths with the same bits:
//! - `native`: AVX512-BF16's `vcvtne2ps2bf16`, 32 values in one instruction. It flushes
//!   denormal inputs to zero, so a vector holding one takes the integer form instead (rare:
//!   activations and probabilities are normal or zero).
//! - AVX-512F: the integer form `(x + 0x7fff + lsb) >> 16`, 16 lanes at a time.
//! - any CPU: `half`.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use half::bf16;

use super::{TILE_ELEMS, TILE_K};

/// Whether this CPU has the native path (AVX512-BF16, and AVX512-BW for the word permute of
/// [`pairs_native`]).
pub(crate) fn round_native() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static NATIVE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *NATIVE.get_or_init(|| {
            is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512bf16")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `src` (one row of A; empty for a padding row) rounded into row `r` of each k tile of
/// `band` (`kbs` tiles), zeros past its end.
pub(super) fn round_row(src: &[f32], r: usize, band: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    if round_native() {
        // SAFETY: AVX-512F, AVX512-BW and AVX512-BF16 are present.
        unsafe { round_row_native(src, r, band) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F is present.
        unsafe { round_row_avx512(src, r, band) };
        return;
    }
    row_tiles(src, r, band, round_part);
}

/// The tile rows of `band` that row `r` of A fills: whole 32-value chunks of `src` go to
/// `whole`, the rest (a partial chunk, or none for padding) through [`round_part`]. Inlined
/// into each path, so `whole` is too (one feature check per row, not per 32 values: a call
/// per 32 values had made rounding ~4% of a bf16 run).
#[inline(always)]
fn row_tiles(src: &[f32], r: usize, band: &mut [u16], mut whole: impl FnMut(&[f32], &mut [u16])) {
    let full = src.len() / TILE_K;
    for (kb, tile) in band.chunks_exact_mut(TILE_ELEMS).enumerate() {
        let row = &mut tile[r * TILE_K..(r + 1) * TILE_K];
        if kb < full {
            whole(&src[kb * TILE_K..(kb + 1) * TILE_K], row);
        } else {
            round_part(&src[(kb * TILE_K).min(src.len())..], row);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn round_row_avx512(src: &[f32], r: usize, band: &mut [u16]) {
    row_tiles(src, r, band, |s, o| round32_avx512(s, o));
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
fn round_row_native(src: &[f32], r: usize, band: &mut [u16]) {
    // SAFETY: 32 values in `s` and `o` (row_tiles); the features are enabled here.
    row_tiles(src, r, band, |s, o| unsafe { round32_native_into(s, o) });
}

/// 32 values by [`round32_native`].
///
/// # Safety
/// The native features present; `src` and `out` hold 32 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
pub(super) unsafe fn round32_native_into(src: &[f32], out: &mut [u16]) {
    // SAFETY: (caller).
    unsafe {
        let (lo, hi) = (
            _mm512_loadu_ps(src.as_ptr()),
            _mm512_loadu_ps(src.as_ptr().add(16)),
        );
        _mm512_storeu_si512(out.as_mut_ptr().cast(), round32_native(lo, hi));
    }
}

/// `chunk` (at most 32 values) rounded into the front of `row`, zeros after it.
fn round_part(chunk: &[f32], row: &mut [u16]) {
    let (vals, pad) = row.split_at_mut(chunk.len());
    round_into(chunk, vals);
    pad.fill(0);
}

/// `out[i] = bf16(src[i])`.
pub(crate) fn round_into(src: &[f32], out: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    let whole = src.len() == TILE_K && out.len() == TILE_K;
    #[cfg(target_arch = "x86_64")]
    if whole && round_native() {
        // SAFETY: the native features are present; both slices hold 32 elements.
        unsafe { round32_native_into(src, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if whole && is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F is present; both slices hold 32 elements.
        unsafe { round32_avx512(src, out) };
        return;
    }
    for (d, &v) in out.iter_mut().zip(src) {
        *d = bf16::from_f32(v).to_bits();
    }
}

/// 32 values on AVX-512F ([`round16_int`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) fn round32_avx512(src: &[f32], out: &mut [u16]) {
    for h in 0..2 {
        // SAFETY: 16 f32 in, 16 u16 out, at h * 16 inside the 32-element slices.
        unsafe {
            let x = _mm512_loadu_si512(src.as_ptr().add(h * 16).cast());
            _mm256_storeu_si256(
                out.as_mut_ptr().add(h * 16).cast(),
                _mm512_cvtepi32_epi16(round16_int(x)),
            );
        }
    }
}

/// 16 f32 (as bits) → their bf16 in the low halves of the lanes: the integer form of
/// round-to-nearest-even, `(x + 0x7fff + lsb) >> 16`; NaN keeps its sign and top mantissa
/// bits with the quiet bit set (as `half`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn round16_int(x: __m512i) -> __m512i {
    let lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
    let rounded = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb),
        16,
    );
    let abs = _mm512_and_si512(x, _mm512_set1_epi32(0x7fff_ffff));
    let nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7f80_0000));
    let quiet = _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
    _mm512_mask_blend_epi32(nan, rounded, quiet)
}

/// `lo` then `hi` rounded: 32 bf16 in order (words 0..16 from `lo`).
///
/// # Safety
/// AVX-512F, AVX512-BW and AVX512-BF16 present ([`round_native`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
pub(crate) fn round32_native(lo: __m512, hi: __m512) -> __m512i {
    let (l, h) = (_mm512_castps_si512(lo), _mm512_castps_si512(hi));
    // Denormal: exponent bits all zero, mantissa not.
    let (exp, man) = (
        _mm512_set1_epi32(0x7f80_0000),
        _mm512_set1_epi32(0x007f_ffff),
    );
    let denormal = |x| _mm512_mask_test_epi32_mask(!_mm512_test_epi32_mask(x, exp), x, man);
    if denormal(l) | denormal(h) != 0 {
        let half = |x| _mm512_cvtepi32_epi16(round16_int(x));
        return _mm512_inserti64x4::<1>(_mm512_castsi256_si512(half(l)), half(h));
    }
    round32_cvt(lo, hi)
}

/// [`round32_native`] without the denormal check: the same bits only where no lane of `lo`
/// or `hi` is denormal (the instruction flushes those to zero).
///
/// # Safety
/// As [`round32_native`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
pub(crate) fn round32_cvt(lo: __m512, hi: __m512) -> __m512i {
    // SAFETY: __m512bh and __m512i are both 64 bytes of plain bits.
    unsafe { std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo)) }
}

/// 16 VNNI words: bf16(`lo`) in the low half, bf16(`hi`) in the high half of each lane.
///
/// # Safety
/// As [`round32_native`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
pub(crate) fn pairs_native(lo: __m512, hi: __m512) -> __m512i {
    interleave(round32_native(lo, hi))
}

/// [`pairs_native`] without the denormal check (see [`round32_cvt`]).
///
/// # Safety
/// As [`round32_native`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
pub(crate) fn pairs_cvt(lo: __m512, hi: __m512) -> __m512i {
    interleave(round32_cvt(lo, hi))
}

/// Words `0..16` and `16..32` interleaved: word 2r <- word r, word 2r + 1 <- word 16 + r.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn interleave(w: __m512i) -> __m512i {
    let idx = _mm512_set_epi16(
        31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4,
        19, 3, 18, 2, 17, 1, 16, 0,
    );
    _mm512_permutexvar_epi16(idx, w)
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// Edge values: zeros, denormals (low, high, the largest), ties to even either way,
    /// the largest finite (rounds to infinity), infinities, quiet and signalling NaNs with
    /// payloads, then pseudo-random bits.
    fn values() -> Vec<f32> {
        let denormals = [
            1,
            0x8000_0001,
            0x0000_8000,
            0x0000_8001,
            0x007f_ffff,
            0x807f_8000,
        ];
        // No denormal among these 32: the instruction itself rounds them.
        let specials = [
            0,
            0x8000_0000,
            0x0080_0000,
            0x3f80_8000,
            0x3f81_8000,
            0x3f80_7fff,
            0x7f7f_ffff,
            0xff7f_ffff,
            0x7f80_0000,
            0xff80_0000,
            0x7fc0_0001,
            0x7f80_0001,
            0xffa0_1234,
            0x7fff_ffff,
        ];
        let pad = |v: &[u32]| -> Vec<u32> {
            (0..32)
                .map(|i| v.get(i).copied().unwrap_or(0x3f80_0000 + i as u32 * 0x9111))
                .collect()
        };
        let mut bits: Vec<u32> = [pad(&denormals), pad(&specials)].concat();
        let mut x = 0x1234_5678u32;
        while bits.len() < 4096 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            bits.push(x);
        }
        bits.into_iter().map(f32::from_bits).collect()
    }

    fn want(v: &[f32]) -> Vec<u16> {
        v.iter().map(|&x| bf16::from_f32(x).to_bits()).collect()
    }

    #[test]
    fn every_path_rounds_as_half() {
        let v = values();
        let mut band = vec![0u16; v.len() / TILE_K * TILE_ELEMS];
        // Row 3 of each tile, through whichever path this CPU takes.
        round_row(&v, 3, &mut band);
        let got: Vec<u16> = band
            .chunks_exact(TILE_ELEMS)
            .flat_map(|t| t[3 * TILE_K..4 * TILE_K].to_vec())
            .collect();
        assert_eq!(got, want(&v), "round_row");
        let mut portable = vec![0u16; band.len()];
        row_tiles(&v, 3, &mut portable, round_part);
        assert_eq!(portable, band, "portable row");
        if !is_x86_feature_detected!("avx512f") {
            println!("skip: no AVX-512F: the AVX-512 and native roundings did not run");
            return;
        }
        for (c, w) in v.chunks_exact(32).zip(want(&v).chunks_exact(32)) {
            let mut o = [0u16; 32];
            // SAFETY: AVX-512F present.
            unsafe { round32_avx512(c, &mut o) };
            assert_eq!(&o[..], w, "avx512");
        }
        if !round_native() {
            println!("skip: no AVX512-BF16: the native rounding did not run");
            return;
        }
        for (c, w) in v.chunks_exact(32).zip(want(&v).chunks_exact(32)) {
            // SAFETY: the native features are present; 32 values.
            let (words, pairs) = unsafe {
                let (lo, hi) = (
                    _mm512_loadu_ps(c.as_ptr()),
                    _mm512_loadu_ps(c.as_ptr().add(16)),
                );
                (round32_native(lo, hi), pairs_native(lo, hi))
            };
            // SAFETY: plain bits.
            let words: [u16; 32] = unsafe { std::mem::transmute(words) };
            let pairs: [u32; 16] = unsafe { std::mem::transmute(pairs) };
            assert_eq!(&words[..], w, "native");
            let expect: Vec<u32> = (0..16)
                .map(|r| u32::from(w[r]) | u32::from(w[16 + r]) << 16)
                .collect();
            assert_eq!(&pairs[..], &expect[..], "native pairs");
            let denormal = c.iter().any(|x| x.is_subnormal());
            // SAFETY: as above.
            let cvt: [u32; 16] = unsafe {
                std::mem::transmute(pairs_cvt(
                    _mm512_loadu_ps(c.as_ptr()),
                    _mm512_loadu_ps(c.as_ptr().add(16)),
                ))
            };
            assert_eq!(
                cvt == pairs,
                !denormal,
                "unchecked pairs: same bits exactly without denormals"
            );
        }
        // A vector of normal values alone takes the instruction itself.
        let normal: Vec<f32> = (0..32).map(|i| 1.0 + i as f32 / 3.0).collect();
        // SAFETY: as above.
        let words: [u16; 32] = unsafe {
            std::mem::transmute(round32_native(
                _mm512_loadu_ps(normal.as_ptr()),
                _mm512_loadu_ps(normal.as_ptr().add(16)),
            ))
        };
        assert_eq!(&words[..], &want(&normal)[..], "native, no denormal");
    }
}
