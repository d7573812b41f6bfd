//! A fixed `exp` polynomial for `x <= 0` ([`exp_neg`]) on 1, 8 and 16 lanes with the same
//! operations per lane (so every CPU path gives the same bits), and the gated activations built
//! on it as `x · sigmoid(s) · u`: `silu(g) · u` ([`silu_mul_into`]: the SwiGLU of the MLPs and
//! of the AMX GEMM's fused epilogue; `s = x = g`) and Gemma's tanh GELU ([`gelu_tanh_mul_into`]:
//! `0.5 · x · (1 + tanh(z))` is `x · sigmoid(2z)`).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Cephes-style `exp(x)` for `x <= 0` (clamped below at -87.3), ~1 ulp; every step is a
/// plain or fused f32 operation that [`exp_neg_avx2`] repeats lane by lane.
#[inline(always)]
pub fn exp_neg(x: f32) -> f32 {
    let x = if x > EXP_LO { x } else { EXP_LO };
    let n = x.mul_add(std::f32::consts::LOG2_E, 0.5).floor();
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    let mut p = EXP_P[0];
    for &c in &EXP_P[1..] {
        p = p.mul_add(r, c);
    }
    let y = p.mul_add(r * r, r) + 1.0;
    y * f32::from_bits(((n as i32 + 127) << 23) as u32)
}

const EXP_LO: f32 = -87.3;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
const EXP_P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// [`exp_neg`] on 8 lanes.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
pub fn exp_neg_avx2(x: __m256) -> __m256 {
    let x = _mm256_max_ps(x, _mm256_set1_ps(EXP_LO));
    let n = _mm256_floor_ps(_mm256_fmadd_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
        _mm256_set1_ps(0.5),
    ));
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), x);
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
    let mut p = _mm256_set1_ps(EXP_P[0]);
    for &c in &EXP_P[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let y = _mm256_add_ps(
        _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
        _mm256_set1_ps(1.0),
    );
    let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    _mm256_mul_ps(y, _mm256_castsi256_ps(e))
}

/// [`exp_neg`] on 16 lanes (the operations of [`exp_neg_avx2`]).
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub fn exp_neg_avx512(x: __m512) -> __m512 {
    let x = _mm512_max_ps(x, _mm512_set1_ps(EXP_LO));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(_mm512_fmadd_ps(
        x,
        _mm512_set1_ps(std::f32::consts::LOG2_E),
        _mm512_set1_ps(0.5),
    ));
    let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HI), x);
    let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_LO), r);
    let mut p = _mm512_set1_ps(EXP_P[0]);
    for &c in &EXP_P[1..] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let y = _mm512_add_ps(
        _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r),
        _mm512_set1_ps(1.0),
    );
    // `y · 2^n` in one instruction instead of building 2^n's bits and multiplying: the same
    // exact product (n >= -126 and y > 1 when n = -126, so the result is normal).
    _mm512_scalef_ps(y, n)
}

/// `x · sigmoid(s) · u` on one lane, `sigmoid` from `e = exp(-|s|)` (`1 / (1 + e)` for
/// `s >= 0`, else `e / (1 + e)`: no overflow).
#[inline(always)]
fn sigmoid_gate(x: f32, s: f32, u: f32) -> f32 {
    let e = exp_neg(-s.abs());
    let num = if s >= 0.0 { 1.0 } else { e };
    (x * (num / (1.0 + e))) * u
}

/// `silu(g) · u` on one lane: `g · sigmoid(g) · u`.
#[inline(always)]
pub fn silu_times(g: f32, u: f32) -> f32 {
    sigmoid_gate(g, g, u)
}

/// `2 · √(2/π)` and `0.044715` of the tanh GELU.
const GELU_2BETA: f32 = (std::f64::consts::SQRT_2 * std::f64::consts::FRAC_2_SQRT_PI) as f32;
const GELU_KAPPA: f32 = 0.044715;

/// torch's tanh-approximated GELU times `u` on one lane: `0.5 · x · (1 + tanh(z))` with
/// `z = √(2/π) · (x + 0.044715 · x³)`, computed as the same function `x · sigmoid(2z)` (no
/// cancellation in `1 + tanh(z)` where `x < 0`).
#[inline(always)]
pub fn gelu_tanh_times(x: f32, u: f32) -> f32 {
    let s = GELU_2BETA * (x + GELU_KAPPA * (x * x * x));
    sigmoid_gate(x, s, u)
}

/// `out[i] = silu_times(g[i], u[i])`, 16 lanes at a time on AVX-512, 8 on AVX2 + FMA: the
/// same bits on every path.
pub fn silu_mul_into(g: &[f32], u: &[f32], out: &mut [f32]) {
    gate_into::<false>(g, u, out);
}

/// `out[i] = gelu_tanh_times(g[i], u[i])`, on the lanes of [`silu_mul_into`]: the same bits on
/// every path.
pub fn gelu_tanh_mul_into(g: &[f32], u: &[f32], out: &mut [f32]) {
    gate_into::<true>(g, u, out);
}

/// The widths [`lane_runs`] hands out.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(super) enum Lanes {
    /// 16 floats, on AVX-512F.
    Sixteen,
    /// 8 floats, on AVX2 + FMA.
    Eight,
}

/// The lane forms' share of `n` elements: `step(i, Sixteen)` at i = 0, 16, … while 16 remain,
/// where the CPU has AVX-512F, then `step(i, Eight)` while 8 remain, where it has AVX2 + FMA;
/// returns where the scalar tail starts. `step` may rely on both (its unsafe calls do).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn lane_runs(n: usize, mut step: impl FnMut(usize, Lanes)) -> usize {
    let mut i = 0;
    if is_x86_feature_detected!("avx512f") {
        while i + 16 <= n {
            step(i, Lanes::Sixteen);
            i += 16;
        }
    }
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        while i + 8 <= n {
            step(i, Lanes::Eight);
            i += 8;
        }
    }
    i
}

/// [`silu_times`] (or, `GELU`, [`gelu_tanh_times`]) of every lane.
fn gate_into<const GELU: bool>(g: &[f32], u: &[f32], out: &mut [f32]) {
    let n = out.len().min(g.len()).min(u.len());
    // SAFETY: `lane_runs` asks for `lanes` floats at i < n of g, u and out only where the
    // CPU has the unit of that width.
    #[cfg(target_arch = "x86_64")]
    let i = lane_runs(n, |i, lanes| unsafe {
        let (g, u, o) = (
            g.as_ptr().add(i),
            u.as_ptr().add(i),
            out.as_mut_ptr().add(i),
        );
        match lanes {
            Lanes::Sixteen => gate16::<GELU>(g, u, o),
            Lanes::Eight => gate8::<GELU>(g, u, o),
        }
    });
    #[cfg(not(target_arch = "x86_64"))]
    let i = 0;
    for j in i..n {
        out[j] = match GELU {
            true => gelu_tanh_times(g[j], u[j]),
            false => silu_times(g[j], u[j]),
        };
    }
}

/// `x[i] = silu(x[i])` (exactly [`silu_times`]`(x, 1)`), on the lanes of [`silu_mul_into`].
pub fn silu_inplace(x: &mut [f32]) {
    const ONES: [f32; 16] = [1.0; 16];
    let n = x.len();
    // SAFETY: as in `gate_into`, on x (each lane read before written) and 16 ones.
    #[cfg(target_arch = "x86_64")]
    let i = lane_runs(n, |i, lanes| unsafe {
        let p = x.as_mut_ptr().add(i);
        match lanes {
            Lanes::Sixteen => silu16(p, ONES.as_ptr(), p),
            Lanes::Eight => silu8(p, ONES.as_ptr(), p),
        }
    });
    #[cfg(not(target_arch = "x86_64"))]
    let i = 0;
    for v in &mut x[i..] {
        *v = silu_times(*v, 1.0);
    }
}

/// [`silu_times`] on 16 lanes.
///
/// # Safety
/// AVX-512F present; 16 floats at each pointer.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn silu16(g: *const f32, u: *const f32, out: *mut f32) {
    // SAFETY: (caller).
    unsafe { gate16::<false>(g, u, out) }
}

/// [`silu_times`] (or, `GELU`, [`gelu_tanh_times`]) on 16 lanes: the scalar's operations.
///
/// # Safety
/// AVX-512F present; 16 floats at each pointer.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn gate16<const GELU: bool>(g: *const f32, u: *const f32, out: *mut f32) {
    // SAFETY: (caller).
    unsafe {
        let (x, u) = (_mm512_loadu_ps(g), _mm512_loadu_ps(u));
        let s = match GELU {
            true => {
                let cube = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
                let inner = _mm512_add_ps(x, _mm512_mul_ps(_mm512_set1_ps(GELU_KAPPA), cube));
                _mm512_mul_ps(_mm512_set1_ps(GELU_2BETA), inner)
            }
            false => x,
        };
        let abs = _mm512_castsi512_ps(_mm512_and_si512(
            _mm512_castps_si512(s),
            _mm512_set1_epi32(0x7fff_ffff),
        ));
        let e = exp_neg_avx512(_mm512_sub_ps(_mm512_setzero_ps(), abs));
        let pos = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(s, _mm512_setzero_ps());
        let num = _mm512_mask_blend_ps(pos, e, _mm512_set1_ps(1.0));
        let sig = _mm512_div_ps(num, _mm512_add_ps(_mm512_set1_ps(1.0), e));
        _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_mul_ps(x, sig), u));
    }
}

/// [`silu_times`] on 8 lanes.
///
/// # Safety
/// AVX2 and FMA present; 8 floats at each pointer.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu8(g: *const f32, u: *const f32, out: *mut f32) {
    // SAFETY: (caller).
    unsafe { gate8::<false>(g, u, out) }
}

/// [`silu_times`] (or, `GELU`, [`gelu_tanh_times`]) on 8 lanes: the scalar's operations.
///
/// # Safety
/// AVX2 and FMA present; 8 floats at each pointer.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gate8<const GELU: bool>(g: *const f32, u: *const f32, out: *mut f32) {
    // SAFETY: (caller).
    unsafe {
        let (x, u) = (_mm256_loadu_ps(g), _mm256_loadu_ps(u));
        let s = match GELU {
            true => {
                let cube = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
                let inner = _mm256_add_ps(x, _mm256_mul_ps(_mm256_set1_ps(GELU_KAPPA), cube));
                _mm256_mul_ps(_mm256_set1_ps(GELU_2BETA), inner)
            }
            false => x,
        };
        let abs = _mm256_and_ps(s, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff)));
        let e = exp_neg_avx2(_mm256_sub_ps(_mm256_setzero_ps(), abs));
        let pos = _mm256_cmp_ps::<_CMP_GE_OQ>(s, _mm256_setzero_ps());
        let num = _mm256_blendv_ps(e, _mm256_set1_ps(1.0), pos);
        let sig = _mm256_div_ps(num, _mm256_add_ps(_mm256_set1_ps(1.0), e));
        _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_mul_ps(x, sig), u));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 16-lane `exp_neg` gives the scalar's bits over its domain, [-100, 0] (every 97th
    /// f32 bit pattern, both sides of the clamp) and at -0, -inf and the clamp itself.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn exp_neg_avx512_is_the_scalar() {
        if !is_x86_feature_detected!("avx512f") {
            println!("skip: no AVX-512F: the 16-lane exp did not run");
            return;
        }
        // Negative floats in bit order: -0 up to -100.
        let xs: Vec<f32> = (0x8000_0000u32..=(-100f32).to_bits())
            .step_by(97)
            .map(f32::from_bits)
            .chain([-0.0, f32::NEG_INFINITY, EXP_LO, -87.299_99, -87.300_01])
            .collect();
        for c in xs.chunks(16) {
            let mut x = [0f32; 16];
            x[..c.len()].copy_from_slice(c);
            let mut got = [0f32; 16];
            // SAFETY: AVX-512F present; 16 floats each.
            unsafe {
                _mm512_storeu_ps(
                    got.as_mut_ptr(),
                    exp_neg_avx512(_mm512_loadu_ps(x.as_ptr())),
                )
            };
            for (xi, g) in x.iter().zip(got) {
                assert_eq!(g.to_bits(), exp_neg(*xi).to_bits(), "exp_neg({xi})");
            }
        }
    }

    /// Every lane path gives the scalar's bits, and gelu_tanh · u is within a few ulps of f64
    /// (relative to |x| · |u|: the sigmoid form has no cancellation below zero).
    #[test]
    fn gelu_tanh_mul_paths_agree_and_are_accurate() {
        let g: Vec<f32> = (0..1000)
            .map(|i| (i as f32 - 500.0) * 0.0517)
            .chain([0.0, -0.0, 30.0, -30.0, 1e4, -1e4, f32::NAN])
            .collect();
        let u: Vec<f32> = g.iter().map(|x| 1.0 - x * 0.01).collect();
        let mut out = vec![0.0; g.len()];
        gelu_tanh_mul_into(&g, &u, &mut out);
        for ((&x, &ui), &o) in g.iter().zip(&u).zip(&out) {
            let s = gelu_tanh_times(x, ui);
            assert!(
                s.to_bits() == o.to_bits() || (s.is_nan() && o.is_nan()),
                "{x}: {o} vs {s}"
            );
            if x.is_finite() {
                let xd = x as f64;
                let z = (2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd.powi(3));
                let want = 0.5 * xd * (1.0 + z.tanh()) * ui as f64;
                let tol = 6e-7 * (xd.abs() * (ui as f64).abs()).max(1e-30);
                assert!((o as f64 - want).abs() <= tol, "{x}: {o} vs {want}");
            }
        }
    }

    /// Every lane path gives the scalar's bits, and silu · u is within 2e-7 (relative) of f64.
    #[test]
    fn silu_mul_paths_agree_and_are_accurate() {
        let g: Vec<f32> = (0..1000)
            .map(|i| (i as f32 - 500.0) * 0.173)
            .chain([0.0, -0.0, 88.0, -88.0, -100.0, f32::NAN])
            .collect();
        let u: Vec<f32> = g.iter().map(|x| 1.0 + x * 0.01).collect();
        let mut out = vec![0.0; g.len()];
        silu_mul_into(&g, &u, &mut out);
        for ((&gi, &ui), &o) in g.iter().zip(&u).zip(&out) {
            let s = silu_times(gi, ui);
            assert!(
                s.to_bits() == o.to_bits() || (s.is_nan() && o.is_nan()),
                "{gi}: {o} vs {s}"
            );
            if gi.is_finite() && gi > -80.0 {
                let want = gi as f64 / (1.0 + (-gi as f64).exp()) * ui as f64;
                let tol = 2e-7 * want.abs().max(1e-30) + 1e-37;
                assert!((o as f64 - want).abs() <= tol * 4.0, "{gi}: {o} vs {want}");
            }
        }
    }
}
