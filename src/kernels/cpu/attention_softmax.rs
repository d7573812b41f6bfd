//! The attention's softmax, on the fixed `exp` polynomial of `exp.rs`: the vector softmax over
//! a task's scores, the same operations per lane on every CPU path (module docs of
//! `attention.rs`).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
use super::{LANES, Scratch};
#[cfg(target_arch = "x86_64")]
use crate::kernels::cpu::exp::{exp_neg_avx2, exp_neg_avx512};

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
            if wide && rp - c >= 4 * LANES {
                softmax16::<2>(st, rp, len, s, sinks, c);
                c += 4 * LANES;
                continue;
            }
            if wide && rp - c >= 2 * LANES {
                softmax16::<1>(st, rp, len, s, sinks, c);
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

/// Rows `c..c + 16 G` of [`softmax_avx2`] on AVX-512, the same operations per lane; `G`
/// independent vectors per loop, so the max and sum chains (one add per key, in key order)
/// overlap instead of waiting on each other's latency.
///
/// # Safety
/// AVX-512F present; as [`softmax_avx2`], with `c + 16 G <= rp`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn softmax16<const G: usize>(
    st: *mut f32,
    rp: usize,
    len: usize,
    s: &mut Scratch,
    sinks: bool,
    c: usize,
) {
    // SAFETY: (caller) every index below is < len * rp in st, < rp in the row arrays.
    unsafe {
        let at = |g: usize| c + 16 * g;
        let lens: [__m512i; G] =
            std::array::from_fn(|g| _mm512_loadu_si512(s.lens.as_ptr().add(at(g)).cast()));
        let starts: [__m512i; G] =
            std::array::from_fn(|g| _mm512_loadu_si512(s.starts.as_ptr().add(at(g)).cast()));
        // start <= j < len.
        let live = |g: usize, j: __m512i| {
            _mm512_cmpgt_epi32_mask(lens[g], j) & !_mm512_cmpgt_epi32_mask(starts[g], j)
        };
        let sink: [__m512; G] =
            std::array::from_fn(|g| _mm512_loadu_ps(s.sinks.as_ptr().add(at(g))));
        let mut m: [__m512; G] = std::array::from_fn(|g| match sinks {
            true => sink[g],
            false => _mm512_set1_ps(f32::NEG_INFINITY),
        });
        for j in 0..len {
            let jv = _mm512_set1_epi32(j as i32);
            for (g, mg) in m.iter_mut().enumerate() {
                let v = _mm512_loadu_ps(st.add(j * rp + at(g)));
                *mg = _mm512_mask_blend_ps(live(g, jv), *mg, _mm512_max_ps(*mg, v));
            }
        }
        let mut sum = [_mm512_setzero_ps(); G];
        for j in 0..len {
            let jv = _mm512_set1_epi32(j as i32);
            for (g, sg) in sum.iter_mut().enumerate() {
                let p = st.add(j * rp + at(g));
                let e = exp_neg_avx512(_mm512_sub_ps(_mm512_loadu_ps(p), m[g]));
                let e = _mm512_maskz_mov_ps(live(g, jv), e);
                _mm512_storeu_ps(p, e);
                *sg = _mm512_add_ps(*sg, e);
            }
        }
        for (g, sg) in sum.iter_mut().enumerate() {
            if sinks {
                *sg = _mm512_add_ps(*sg, exp_neg_avx512(_mm512_sub_ps(sink[g], m[g])));
            }
            _mm512_storeu_ps(
                s.inv.as_mut_ptr().add(at(g)),
                _mm512_div_ps(_mm512_set1_ps(1.0), *sg),
            );
        }
    }
}
