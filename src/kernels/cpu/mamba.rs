//! The Mamba-2 selective scan (Mamba-2 / Nemotron-H / Bamba / Granite-4 hybrids), token by
//! token in f32 (chunk invariance: [`recurrent`](super::recurrent)'s module docs).
//!
//! # Two state rows at a time
//! Each state row's output is a dot product with C summed in 8 lanes: one chain of dependent
//! adds per row, `d_state / 8` long, so a row at a time ran at the adder's latency (~3.2
//! cycles per 8 elements on a Zen 5: 52 GFLOP/s a thread, 20% of its FMA peak). Two rows
//! side by side ([`avx2::update_dot_pair`]) give two independent chains: ~1.8 cycles per 8
//! elements in a lab loop, near what the multiplier ports allow without FMA contraction (3
//! products per element); 75 GFLOP/s a thread in `gemm_peak --recurrence-only` (the rest:
//! each token's softplus and exp, the sums' trees). In the lab loop four rows ran as fast as
//! two, eight a little slower, and the zmm forms (16 elements of a row, or two rows in one
//! zmm) 3–5× slower. Each lane does [`update_dot`]'s operations in its order: the same bits
//! on every unit.

use std::ops::Range;

use super::recurrent::{HeadRows, per_head, softplus};
use super::vector::Unit;
use crate::kernels::plan::SeqState;

/// Mamba-2 geometry and per-head parameters.
pub struct MambaParams<'a> {
    pub heads: usize,
    pub head_dim: usize,
    pub d_state: usize,
    pub groups: usize,
    /// `-exp(A_log)` per head.
    pub neg_a: &'a [f32],
    pub d: &'a [f32],
    pub dt_bias: &'a [f32],
    /// Lower clamp of `dt` (transformers' prefill path: `time_step_min`).
    pub dt_min: f32,
}

/// The Mamba-2 selective scan, token by token. `xbc` is the conv output
/// `[T, heads·head_dim + 2·groups·d_state]` (x | B | C), `dt` the raw `[T, heads]`; `state` is
/// `[slots, heads, head_dim, d_state]`. Writes `y = C·h + D·x`, `[T, heads·head_dim]`.
/// `dt = max(softplus(dt + dt_bias), dt_min)`, `h = exp(dt·A)·h + (dt·x) ⊗ B`.
pub fn mamba2_scan(
    xbc: &[f32],
    dt: &[f32],
    p: &MambaParams<'_>,
    seqs: &[SeqState],
    state: &mut [f32],
    out: &mut Vec<f32>,
) {
    let t = xbc.len() / (p.heads * p.head_dim + 2 * p.groups * p.d_state);
    let dims = (p.heads, p.head_dim * p.d_state, p.head_dim);
    // `per_head` runs the tasks compiled for this unit.
    let unit = Unit::detect();
    per_head(
        state,
        dims,
        seqs,
        t,
        out,
        #[inline(always)]
        |h, rows, st, o| mamba_head(unit, xbc, dt, p, (h, rows, st), o),
    );
}

/// Head `h` of the scan over `rows` (one request's chunk), from and into its state `st`
/// (`[head_dim, d_state]`); the head's output rows (`head_dim` each) into `out`. State rows go
/// in pairs through [`avx2::update_dot_pair`] where `unit` has AVX2, else one at a time.
#[inline(always)]
fn mamba_head(
    unit: Unit,
    xbc: &[f32],
    dt: &[f32],
    p: &MambaParams<'_>,
    (h, rows, st): (usize, Range<usize>, &mut [f32]),
    mut out: HeadRows<'_>,
) {
    let (nh, hd, n) = (p.heads, p.head_dim, p.d_state);
    let inter = nh * hd;
    let row = inter + 2 * p.groups * n;
    let g = h / (nh / p.groups);
    let pairs = unit != Unit::Baseline && avx2::available();
    for (i, r) in rows.enumerate() {
        let xr = &xbc[r * row..(r + 1) * row];
        let x = &xr[h * hd..(h + 1) * hd];
        let bm = &xr[inter + g * n..inter + (g + 1) * n];
        let cm = &xr[inter + (p.groups + g) * n..inter + (p.groups + g + 1) * n];
        let d = softplus(dt[r * nh + h] + p.dt_bias[h]).max(p.dt_min);
        let da = (d * p.neg_a[h]).exp();
        let o = out.row(i);
        let mut done = 0;
        if pairs {
            for ((op, xp), sp) in o
                .chunks_exact_mut(2)
                .zip(x.chunks_exact(2))
                .zip(st.chunks_exact_mut(2 * n))
            {
                let dots = avx2::update_dot_pair(sp, bm, cm, da, [xp[0] * d, xp[1] * d]);
                op[0] = dots[0] + p.d[h] * xp[0];
                op[1] = dots[1] + p.d[h] * xp[1];
            }
            done = hd / 2 * 2;
        }
        for ((oj, &xj), srow) in o[done..]
            .iter_mut()
            .zip(&x[done..])
            .zip(st[done * n..].chunks_exact_mut(n))
        {
            *oj = update_dot(srow, bm, cm, da, xj * d) + p.d[h] * xj;
        }
    }
}

/// One row of the scan's state in one pass: `s = s·da + xd·b` element by element, and the
/// new row's dot product with `c` in 8 lanes (element i in lane i mod 8, the tail serially)
/// added in a fixed tree. No FMA contraction and a fixed order: the same bits on every run,
/// CPU and vector unit. Fixed-size lanes so LLVM keeps the sums in one register.
#[inline(always)]
fn update_dot(s: &mut [f32], b: &[f32], c: &[f32], da: f32, xd: f32) -> f32 {
    let mut acc = [0.0f32; 8];
    let full = s.len() / 8 * 8;
    let s8 = s[..full].chunks_exact_mut(8);
    for ((sv, bv), cv) in s8.zip(b.chunks_exact(8)).zip(c.chunks_exact(8)) {
        // Copies in registers: the stores then cannot alias the loads, and the lanes vectorise.
        let mut sl: [f32; 8] = (&*sv).try_into().expect("chunks of 8");
        let bl: [f32; 8] = bv.try_into().expect("chunks of 8");
        let cl: [f32; 8] = cv.try_into().expect("chunks of 8");
        for l in 0..8 {
            sl[l] = sl[l] * da + xd * bl[l];
            acc[l] += cl[l] * sl[l];
        }
        sv.copy_from_slice(&sl);
    }
    finish_dot(&mut s[full..], (&b[full..], &c[full..]), (da, xd), acc)
}

/// The end of [`update_dot`] after its whole lanes: the tail elements (`s`, `b`, `c` past the
/// last multiple of 8) updated and summed serially, then the lanes `acc` in a fixed tree.
#[inline(always)]
fn finish_dot(s: &mut [f32], (b, c): (&[f32], &[f32]), (da, xd): (f32, f32), acc: [f32; 8]) -> f32 {
    let mut tail = 0.0f32;
    for ((sv, &bv), &cv) in s.iter_mut().zip(b).zip(c) {
        *sv = *sv * da + xd * bv;
        tail += cv * *sv;
    }
    ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::finish_dot;

    pub fn available() -> bool {
        is_x86_feature_detected!("avx2")
    }

    /// [`update_dot`](super::update_dot) of two state rows (`s`, `[2, n]`; row r's `xd` is
    /// `xd[r]`), their 8 lanes in one ymm each, side by side: the same operations per lane in
    /// the same order (`(s·da) + (xd·b)`, then `acc + c·s`; no FMA), so the same bits.
    /// Inlined with [`pair`] into the caller's vector-unit copy ([`vector`](super::super::vector)),
    /// which has AVX2: a `#[target_feature]` function of its own is not reliably inlined
    /// there, and called per row pair it ran at the one-row rate.
    #[inline(always)]
    pub fn update_dot_pair(s: &mut [f32], b: &[f32], c: &[f32], da: f32, xd: [f32; 2]) -> [f32; 2] {
        assert!(available(), "AVX2 scan called without AVX2");
        let n = b.len();
        assert!(s.len() == 2 * n && c.len() == n, "update_dot_pair: shapes");
        // SAFETY: the CPU has AVX2 (asserted) and the shapes match (asserted).
        unsafe { pair(s, (b, c), da, xd) }
    }

    /// # Safety
    /// The CPU has AVX2; `s` holds two rows of `b.len()` values and `c` as many as `b`.
    #[inline(always)]
    unsafe fn pair(s: &mut [f32], (b, c): (&[f32], &[f32]), da: f32, xd: [f32; 2]) -> [f32; 2] {
        let n = b.len();
        let full = n / 8 * 8;
        let (s0, s1) = s.split_at_mut(n);
        // SAFETY (the intrinsics): the caller guarantees AVX2.
        let (vda, x0, x1) = unsafe {
            (
                _mm256_set1_ps(da),
                _mm256_set1_ps(xd[0]),
                _mm256_set1_ps(xd[1]),
            )
        };
        let (mut a0, mut a1) = unsafe { (_mm256_setzero_ps(), _mm256_setzero_ps()) };
        for k in (0..full).step_by(8) {
            // SAFETY: AVX2 (the caller's guarantee); k + 8 <= full <= n, the length of b, c, s0
            // and s1.
            unsafe {
                let bv = _mm256_loadu_ps(b.as_ptr().add(k));
                let cv = _mm256_loadu_ps(c.as_ptr().add(k));
                let (p0, p1) = (s0.as_mut_ptr().add(k), s1.as_mut_ptr().add(k));
                let h0 = _mm256_add_ps(
                    _mm256_mul_ps(_mm256_loadu_ps(p0), vda),
                    _mm256_mul_ps(x0, bv),
                );
                let h1 = _mm256_add_ps(
                    _mm256_mul_ps(_mm256_loadu_ps(p1), vda),
                    _mm256_mul_ps(x1, bv),
                );
                a0 = _mm256_add_ps(a0, _mm256_mul_ps(cv, h0));
                a1 = _mm256_add_ps(a1, _mm256_mul_ps(cv, h1));
                _mm256_storeu_ps(p0, h0);
                _mm256_storeu_ps(p1, h1);
            }
        }
        // SAFETY: a __m256 is 8 f32.
        let lanes = |v: __m256| unsafe { std::mem::transmute::<__m256, [f32; 8]>(v) };
        let tails = (&b[full..], &c[full..]);
        [
            finish_dot(&mut s0[full..], tails, (da, xd[0]), lanes(a0)),
            finish_dot(&mut s1[full..], tails, (da, xd[1]), lanes(a1)),
        ]
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod avx2 {
    pub fn available() -> bool {
        false
    }

    pub fn update_dot_pair(_: &mut [f32], _: &[f32], _: &[f32], _: f32, _: [f32; 2]) -> [f32; 2] {
        unreachable!("no AVX2 off x86_64")
    }
}

#[cfg(test)]
#[path = "mamba_tests.rs"]
mod tests;
