//! The attention's softmax: a fixed `exp` polynomial ([`exp_neg`]) and the vector softmax over
//! a task's scores, the same operations per lane on every CPU path (module docs of
//! `attention.rs`).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
use super::{LANES, Scratch};

/// Cephes-style `exp(x)` for `x <= 0` (clamped below at -87.3), ~1 ulp; every step is a
/// plain or fused f32 operation that [`exp_neg_avx2`] repeats lane by lane.
#[inline(always)]
pub(super) fn exp_neg(x: f32) -> f32 {
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
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn exp_neg_avx2(x: __m256) -> __m256 {
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

/// Softmax of the scores `st` (`[len][rp]`, scaled), 8 rows per vector: `st` becomes the
/// unnormalised probabilities (0 outside each row's keys) and `s.inv` holds `1 / sum`.
///
/// # Safety
/// AVX2 and FMA present; `st` holds `len * rp` floats; `prepare` ran (lens, starts, sinks, inv
/// have `rp` entries, `rp % 8 == 0`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn softmax_avx2(
    st: *mut f32,
    rp: usize,
    len: usize,
    s: &mut Scratch,
    sinks: bool,
) {
    // SAFETY: (caller) every index below is < len * rp in st, < rp in the row arrays.
    unsafe {
        // Softmax over keys, 16 rows per vector where the CPU has AVX-512 (the same operations
        // per lane), else 8.
        let wide = avx512();
        let mut c = 0;
        while c < rp {
            if wide && rp - c >= 2 * LANES {
                softmax16(st, rp, len, s, sinks, c);
                c += 2 * LANES;
                continue;
            }
            let lens = _mm256_loadu_si256(s.lens.as_ptr().add(c) as *const __m256i);
            let starts = _mm256_loadu_si256(s.starts.as_ptr().add(c) as *const __m256i);
            // start <= j < len.
            let live = |j: usize| {
                let j = _mm256_set1_epi32(j as i32);
                let before = _mm256_cmpgt_epi32(starts, j);
                _mm256_castsi256_ps(_mm256_andnot_si256(before, _mm256_cmpgt_epi32(lens, j)))
            };
            let sink = _mm256_loadu_ps(s.sinks.as_ptr().add(c));
            let mut m = match sinks {
                true => sink,
                false => _mm256_set1_ps(f32::NEG_INFINITY),
            };
            for j in 0..len {
                let v = _mm256_loadu_ps(st.add(j * rp + c));
                let mx = _mm256_max_ps(m, v);
                m = _mm256_blendv_ps(m, mx, live(j));
            }
            let mut sum = _mm256_setzero_ps();
            for j in 0..len {
                let p = st.add(j * rp + c);
                let e = exp_neg_avx2(_mm256_sub_ps(_mm256_loadu_ps(p), m));
                let e = _mm256_and_ps(e, live(j));
                _mm256_storeu_ps(p, e);
                sum = _mm256_add_ps(sum, e);
            }
            if sinks {
                sum = _mm256_add_ps(sum, exp_neg_avx2(_mm256_sub_ps(sink, m)));
            }
            _mm256_storeu_ps(
                s.inv.as_mut_ptr().add(c),
                _mm256_div_ps(_mm256_set1_ps(1.0), sum),
            );
            c += LANES;
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn avx512() -> bool {
    static WIDE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WIDE.get_or_init(|| is_x86_feature_detected!("avx512f"))
}

/// [`exp_neg`] on 16 lanes (the operations of [`exp_neg_avx2`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn exp_neg_avx512(x: __m512) -> __m512 {
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
    let e = _mm512_slli_epi32::<23>(_mm512_add_epi32(
        _mm512_cvtps_epi32(n),
        _mm512_set1_epi32(127),
    ));
    _mm512_mul_ps(y, _mm512_castsi512_ps(e))
}

/// Rows `c..c + 16` of [`softmax_avx2`] on AVX-512, the same operations per lane.
///
/// # Safety
/// AVX-512F present; as [`softmax_avx2`], with `c + 16 <= rp`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn softmax16(st: *mut f32, rp: usize, len: usize, s: &mut Scratch, sinks: bool, c: usize) {
    // SAFETY: (caller) every index below is < len * rp in st, < rp in the row arrays.
    unsafe {
        let lens = _mm512_loadu_si512(s.lens.as_ptr().add(c).cast());
        let starts = _mm512_loadu_si512(s.starts.as_ptr().add(c).cast());
        // start <= j < len.
        let live = |j: usize| {
            let j = _mm512_set1_epi32(j as i32);
            _mm512_cmpgt_epi32_mask(lens, j) & !_mm512_cmpgt_epi32_mask(starts, j)
        };
        let sink = _mm512_loadu_ps(s.sinks.as_ptr().add(c));
        let mut m = match sinks {
            true => sink,
            false => _mm512_set1_ps(f32::NEG_INFINITY),
        };
        for j in 0..len {
            let v = _mm512_loadu_ps(st.add(j * rp + c));
            m = _mm512_mask_blend_ps(live(j), m, _mm512_max_ps(m, v));
        }
        let mut sum = _mm512_setzero_ps();
        for j in 0..len {
            let p = st.add(j * rp + c);
            let e = exp_neg_avx512(_mm512_sub_ps(_mm512_loadu_ps(p), m));
            let e = _mm512_maskz_mov_ps(live(j), e);
            _mm512_storeu_ps(p, e);
            sum = _mm512_add_ps(sum, e);
        }
        if sinks {
            sum = _mm512_add_ps(sum, exp_neg_avx512(_mm512_sub_ps(sink, m)));
        }
        _mm512_storeu_ps(
            s.inv.as_mut_ptr().add(c),
            _mm512_div_ps(_mm512_set1_ps(1.0), sum),
        );
    }
}
