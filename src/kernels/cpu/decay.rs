//! The decay of a gated delta rule, `exp(neg_a · softplus(x))` with `neg_a = -exp(A_log) <= 0`,
//! on 1, 8 and 16 lanes with the same operations per lane (so every CPU path gives the same
//! bits). Kimi Delta Attention needs one per key channel, `nv · dk` per token (4,096 at Kimi
//! Linear's heads): through libm's `exp` / `ln_1p` / `exp` those cost more than the state sweep
//! they feed (Zen 5: the per-channel recurrence at 77 GFLOP/s against the per-head rule's 196).
//!
//! `softplus(x) = max(x, 0) + log1p(e)` with `e = exp(-|x|)` in (0, 1] ([`exp_neg`], no
//! overflow, no threshold: for x > 20 the log term is below half an ulp of x, torch's
//! threshold gives the same), and `log1p(e) = 2·atanh(s)`, `s = e / (2 + e)` in (0, 1/3]:
//! the odd series `s + s³/3 + … + s¹⁷/17` (truncated below 3e-10 relative; no cancellation as
//! e → 0). A NaN or infinite `x` gives NaN (bad data stays visible).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::exp::exp_neg;
#[cfg(target_arch = "x86_64")]
use super::exp::{Lanes, exp_neg_avx2, exp_neg_avx512, lane_runs};

/// `1/17, 1/15, …, 1/3`: atanh's series in `z = s²`, Horner from the highest term.
const ATANH: [f32; 8] = [
    1.0 / 17.0,
    1.0 / 15.0,
    1.0 / 13.0,
    1.0 / 11.0,
    1.0 / 9.0,
    1.0 / 7.0,
    1.0 / 5.0,
    1.0 / 3.0,
];

/// `exp(neg_a · softplus(x))` on one lane; every step a plain or fused f32 operation that the
/// 8- and 16-lane forms repeat.
#[inline(always)]
pub fn decay(neg_a: f32, x: f32) -> f32 {
    let e = exp_neg(-x.abs());
    let s = e / (2.0 + e);
    let z = s * s;
    let mut p = ATANH[0];
    for &c in &ATANH[1..] {
        p = p.mul_add(z, c);
    }
    let half_log = (s * z).mul_add(p, s);
    let softplus = x.max(0.0) + (half_log + half_log);
    exp_neg(neg_a * softplus) + x * 0.0
}

/// `out[i] = decay(neg_a, x[i] + bias[i])`, 16 lanes at a time on AVX-512, 8 on AVX2 + FMA:
/// the same bits on every path.
pub fn decays_into(neg_a: f32, x: &[f32], bias: &[f32], out: &mut [f32]) {
    let n = out.len().min(x.len()).min(bias.len());
    let (x, bias, out) = (&x[..n], &bias[..n], &mut out[..n]);
    // SAFETY: `lane_runs` asks for `lanes` floats at i < n of x, bias and out only where the
    // CPU has the unit of that width.
    #[cfg(target_arch = "x86_64")]
    let i = lane_runs(n, |i, lanes| unsafe {
        let (x, b, o) = (
            x.as_ptr().add(i),
            bias.as_ptr().add(i),
            out.as_mut_ptr().add(i),
        );
        match lanes {
            Lanes::Sixteen => decay16(neg_a, x, b, o),
            Lanes::Eight => decay8(neg_a, x, b, o),
        }
    });
    #[cfg(not(target_arch = "x86_64"))]
    let i = 0;
    for ((o, &xi), &bi) in out[i..].iter_mut().zip(&x[i..]).zip(&bias[i..]) {
        *o = decay(neg_a, xi + bi);
    }
}

/// [`decay`] of `x + bias` on 16 lanes.
///
/// # Safety
/// AVX-512F present; 16 floats at each pointer.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn decay16(neg_a: f32, x: *const f32, bias: *const f32, out: *mut f32) {
    // SAFETY: (caller).
    unsafe {
        let x = _mm512_add_ps(_mm512_loadu_ps(x), _mm512_loadu_ps(bias));
        let zero = _mm512_setzero_ps();
        let abs = _mm512_abs_ps(x);
        let e = exp_neg_avx512(_mm512_sub_ps(zero, abs));
        let s = _mm512_div_ps(e, _mm512_add_ps(_mm512_set1_ps(2.0), e));
        let z = _mm512_mul_ps(s, s);
        let mut p = _mm512_set1_ps(ATANH[0]);
        for &c in &ATANH[1..] {
            p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(c));
        }
        let half_log = _mm512_fmadd_ps(_mm512_mul_ps(s, z), p, s);
        let softplus = _mm512_add_ps(_mm512_max_ps(x, zero), _mm512_add_ps(half_log, half_log));
        let d = exp_neg_avx512(_mm512_mul_ps(_mm512_set1_ps(neg_a), softplus));
        _mm512_storeu_ps(out, _mm512_add_ps(d, _mm512_mul_ps(x, zero)));
    }
}

/// [`decay`] of `x + bias` on 8 lanes.
///
/// # Safety
/// AVX2 and FMA present; 8 floats at each pointer.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn decay8(neg_a: f32, x: *const f32, bias: *const f32, out: *mut f32) {
    // SAFETY: (caller).
    unsafe {
        let x = _mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(bias));
        let zero = _mm256_setzero_ps();
        let abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0), x);
        let e = exp_neg_avx2(_mm256_sub_ps(zero, abs));
        let s = _mm256_div_ps(e, _mm256_add_ps(_mm256_set1_ps(2.0), e));
        let z = _mm256_mul_ps(s, s);
        let mut p = _mm256_set1_ps(ATANH[0]);
        for &c in &ATANH[1..] {
            p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(c));
        }
        let half_log = _mm256_fmadd_ps(_mm256_mul_ps(s, z), p, s);
        let softplus = _mm256_add_ps(_mm256_max_ps(x, zero), _mm256_add_ps(half_log, half_log));
        let d = exp_neg_avx2(_mm256_mul_ps(_mm256_set1_ps(neg_a), softplus));
        _mm256_storeu_ps(out, _mm256_add_ps(d, _mm256_mul_ps(x, zero)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gates from -30 to 30 in steps of 0.001 (and the edges), decay rates from 1e-3 to 20.
    fn inputs() -> (Vec<f32>, Vec<f32>) {
        let x: Vec<f32> = (0..60_000)
            .map(|i| (i as f32 - 30_000.0) * 0.001)
            .chain([0.0, -0.0, 20.0, 20.000_002, -88.0, 88.0, 1e30, -1e30])
            .chain([f32::NAN, f32::INFINITY, f32::NEG_INFINITY])
            .collect();
        let bias: Vec<f32> = (0..x.len()).map(|i| [0.0, 0.25, -0.5][i % 3]).collect();
        (x, bias)
    }

    /// f64 `exp(neg_a · softplus(x))` with torch's threshold.
    fn reference(neg_a: f32, x: f32) -> f64 {
        let x = x as f64;
        let sp = if x > 20.0 { x } else { x.exp().ln_1p() };
        (neg_a as f64 * sp).exp()
    }

    /// The machine's lane paths give the scalar's bits; finite results are within a few ulps
    /// of f64 relative to the exponent `|neg_a · softplus|` they come from; NaN and infinite
    /// gates give NaN.
    #[test]
    fn lane_paths_agree_and_are_accurate() {
        let (x, bias) = inputs();
        for neg_a in [-1e-3f32, -0.1, -1.0, -7.5, -20.0, -0.0] {
            let mut out = vec![0.0; x.len()];
            decays_into(neg_a, &x, &bias, &mut out);
            for ((&xi, &bi), &o) in x.iter().zip(&bias).zip(&out) {
                let g = xi + bi;
                let s = decay(neg_a, g);
                assert!(
                    s.to_bits() == o.to_bits() || (s.is_nan() && o.is_nan()),
                    "{neg_a} {g}: {o} vs {s}"
                );
                if !g.is_finite() {
                    assert!(o.is_nan(), "{g}: {o}");
                    continue;
                }
                let want = reference(neg_a, g);
                let exponent = want.ln().abs();
                if exponent < 80.0 {
                    let tol = want * (6e-7 * exponent.max(1.0));
                    assert!((o as f64 - want).abs() <= tol, "{neg_a} {g}: {o} vs {want}");
                } else {
                    assert!(o < 1e-34, "{neg_a} {g}: {o}");
                }
            }
        }
    }

    /// The AVX2 form on its own (AVX-512 CPUs take it only for tails), lane for lane.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_lanes_give_the_scalar_bits() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            println!("skip: no AVX2 + FMA on this CPU");
            return;
        }
        let (x, bias) = inputs();
        for (xs, bs) in x.chunks_exact(8).zip(bias.chunks_exact(8)) {
            let mut got = [0.0f32; 8];
            // SAFETY: AVX2 + FMA present; 8 floats each.
            unsafe { decay8(-0.75, xs.as_ptr(), bs.as_ptr(), got.as_mut_ptr()) };
            for ((&xi, &bi), g) in xs.iter().zip(bs).zip(got) {
                let s = decay(-0.75, xi + bi);
                assert!(s.to_bits() == g.to_bits() || (s.is_nan() && g.is_nan()));
            }
        }
    }
}
