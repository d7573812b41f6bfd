//! Gemma 2's attention soft cap, `cap · tanh(s · scale / cap)` over a score buffer, with a
//! fixed `tanh` on 1, 8 and 16 lanes (the same operations per lane, so every CPU path and
//! every position in the buffer gives the same bits: a score's value does not depend on how
//! many share its row or its batch).
//!
//! Why not `f32::tanh`: libm's scalar call per score made the soft-capped attention 4× (f32)
//! to 9× (AMX) slower than the plain one at the bench shapes (session 51, `gemm_peak
//! --attention-only`: 97 → 23 GFLOP/s f32, 251 → 28 on AMX, 1,024 tokens, 2 threads).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::exp::exp_neg;
#[cfg(target_arch = "x86_64")]
use super::exp::{Lanes, exp_neg_avx2, exp_neg_avx512, lane_runs};

/// Below it (in magnitude) the odd polynomial, above it `(1 - e) / (1 + e)`, `e = exp(-2|y|)`
/// (no cancellation there: `e <= 0.29`).
const SMALL: f32 = 0.625;

/// Cephes' `tanhf` polynomial: `tanh(y) = y · (1 + z · P(z))`, `z = y²`, for `|y| < 0.625`
/// (Cephes adds `y · z · P(z)` to `y`, which turns -0 into +0).
const P: [f32; 5] = [
    -5.704_988_7e-3,
    2.063_909e-2,
    -5.373_971_6e-2,
    1.333_144_2e-1,
    -3.333_328e-1,
];

/// `tanh(y)` within 3 ulp (the test's bound); NaN stays NaN (a bad score is not capped into a finite one).
#[inline(always)]
pub fn tanh(y: f32) -> f32 {
    let a = y.abs();
    let z = y * y;
    let mut p = P[0];
    for &c in &P[1..] {
        p = p.mul_add(z, c);
    }
    let small = y * p.mul_add(z, 1.0);
    let e = exp_neg(-2.0 * a);
    let big = f32::from_bits(((1.0 - e) / (1.0 + e)).to_bits() | (y.to_bits() & SIGN));
    if a >= SMALL { big } else { small }
}

const SIGN: u32 = 0x8000_0000;

/// Every score `s` becomes `cap · tanh(s · scale / cap)` ([`tanh`] on every lane).
pub fn soft_cap(scores: &mut [f32], scale: f32, cap: f32) {
    let n = scores.len();
    // SAFETY: `lane_runs` hands out `lanes` floats at i < n only where the CPU has the unit
    // of that width; each lane is read before it is written.
    #[cfg(target_arch = "x86_64")]
    let i = lane_runs(n, |i, lanes| unsafe {
        let p = scores.as_mut_ptr().add(i);
        match lanes {
            Lanes::Sixteen => cap16(p, scale, cap),
            Lanes::Eight => cap8(p, scale, cap),
        }
    });
    #[cfg(not(target_arch = "x86_64"))]
    let i = 0;
    for s in &mut scores[i..] {
        *s = tanh(*s * scale / cap) * cap;
    }
}

/// [`soft_cap`] of 16 floats at `p`: [`tanh`]'s operations.
///
/// # Safety
/// AVX-512F present; 16 floats at `p`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn cap16(p: *mut f32, scale: f32, cap: f32) {
    let splat = _mm512_set1_ps;
    // SAFETY: (caller) 16 floats.
    let x = unsafe { _mm512_loadu_ps(p) };
    let y = _mm512_div_ps(_mm512_mul_ps(x, splat(scale)), splat(cap));
    let bits = _mm512_castps_si512(y);
    let a = _mm512_castsi512_ps(_mm512_and_si512(bits, _mm512_set1_epi32(!SIGN as i32)));
    let z = _mm512_mul_ps(y, y);
    let mut q = splat(P[0]);
    for &c in &P[1..] {
        q = _mm512_fmadd_ps(q, z, splat(c));
    }
    let small = _mm512_mul_ps(y, _mm512_fmadd_ps(q, z, splat(1.0)));
    let e = exp_neg_avx512(_mm512_mul_ps(splat(-2.0), a));
    let big = _mm512_div_ps(_mm512_sub_ps(splat(1.0), e), _mm512_add_ps(splat(1.0), e));
    let sign = _mm512_and_si512(bits, _mm512_set1_epi32(SIGN as i32));
    let big = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(big), sign));
    let use_small = _mm512_cmp_ps_mask::<_CMP_NGE_UQ>(a, splat(SMALL));
    let t = _mm512_mask_blend_ps(use_small, big, small);
    // SAFETY: (caller) 16 floats.
    unsafe { _mm512_storeu_ps(p, _mm512_mul_ps(t, splat(cap))) };
}

/// [`soft_cap`] of 8 floats at `p`: [`tanh`]'s operations.
///
/// # Safety
/// AVX2 and FMA present; 8 floats at `p`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn cap8(p: *mut f32, scale: f32, cap: f32) {
    let splat = _mm256_set1_ps;
    // SAFETY: (caller) 8 floats.
    let x = unsafe { _mm256_loadu_ps(p) };
    let y = _mm256_div_ps(_mm256_mul_ps(x, splat(scale)), splat(cap));
    let sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32(SIGN as i32));
    let a = _mm256_andnot_ps(sign_mask, y);
    let z = _mm256_mul_ps(y, y);
    let mut q = splat(P[0]);
    for &c in &P[1..] {
        q = _mm256_fmadd_ps(q, z, splat(c));
    }
    let small = _mm256_mul_ps(y, _mm256_fmadd_ps(q, z, splat(1.0)));
    let e = exp_neg_avx2(_mm256_mul_ps(splat(-2.0), a));
    let big = _mm256_div_ps(_mm256_sub_ps(splat(1.0), e), _mm256_add_ps(splat(1.0), e));
    let big = _mm256_or_ps(big, _mm256_and_ps(y, sign_mask));
    let use_small = _mm256_cmp_ps::<_CMP_NGE_UQ>(a, splat(SMALL));
    let t = _mm256_blendv_ps(big, small, use_small);
    // SAFETY: (caller) 8 floats.
    unsafe { _mm256_storeu_ps(p, _mm256_mul_ps(t, splat(cap))) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Within 3 ulp of f64's tanh over [-12, 12] (both branches, the switch at 0.625, the
    /// flat tails), odd, and NaN kept.
    #[test]
    fn tanh_is_within_3_ulp() {
        let mut worst = 0.0f64;
        for i in -120_000..=120_000 {
            let y = i as f32 * 1e-4;
            let (got, want) = (tanh(y) as f64, (y as f64).tanh());
            let ulp = (want.abs() as f32).max(f32::MIN_POSITIVE);
            let ulp = (f32::from_bits(ulp.to_bits() + 1) - ulp) as f64;
            worst = worst.max((got - want).abs() / ulp);
            assert_eq!(tanh(-y).to_bits(), (-tanh(y)).to_bits(), "odd at {y}");
        }
        assert!(worst <= 3.0, "worst {worst} ulp");
        assert!(tanh(f32::NAN).is_nan());
        assert_eq!((tanh(f32::INFINITY), tanh(-1e30)), (1.0, -1.0));
    }

    /// Every lane path gives the scalar's bits, wherever a score lies in the buffer.
    #[test]
    fn soft_cap_lanes_match_the_scalar() {
        let x: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919 % 2001) as f32 - 1000.0) * 0.173)
            .chain([f32::NAN, 0.0, -0.0])
            .collect();
        for (scale, cap) in [(1.0, 50.0), (0.125, 30.0), (1.0, 0.5)] {
            let want: Vec<u32> = (x.iter())
                .map(|&s| (tanh(s * scale / cap) * cap).to_bits())
                .collect();
            for start in [0, 3, 11] {
                let mut got = x[start..].to_vec();
                soft_cap(&mut got, scale, cap);
                let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want[start..], "scale {scale} cap {cap} start {start}");
            }
        }
    }
}
