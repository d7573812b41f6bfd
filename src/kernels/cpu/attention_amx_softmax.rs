//! The AMX task's softmax, fused: scores scaled on load, the max, then per 32 keys the
//! probabilities, their sum and their bf16 pairs transposed straight into P's A tiles. It has
//! the operations, per lane and in order, of scaling the scores in place, `softmax_avx2`,
//! zeroing the keys past `len` and packing P from the probabilities (the unfused task, which
//! made three more passes over `[keys][rp]` f32: ~14% of the AMX task at 4k-token prompts), so
//! the same bits (test: `fused_softmax_is_scale_softmax_then_pack`).

use std::arch::x86_64::*;

use super::{Line, Scratch, T, transpose16};
use crate::kernels::cpu::bf16::pairs_cvt;
use crate::kernels::cpu::exp::exp_neg_avx512;

/// Keys per P tile (16 pairs).
const KEYS: usize = 2 * T;

/// Softmax of the raw scores `st` (`[keys][rp]` f32, `keys % 32 == 0`, `len <= keys`) times
/// `scale`, over each row's keys `starts[r]..lens[r]` (and its sink): P tiles `(rt, kb)` at
/// `p + (rt * keys / 32 + kb) * 16` (row r = the bf16 pairs of keys `32 kb + 2 w, + 1`; 0
/// outside the row's keys) and `s.inv[r] = 1 / sum`. `st` is only read.
///
/// # Safety
/// AVX-512F, AVX512-BW and AVX512-BF16 present; `st` holds `keys * rp` floats, `p` `rp / 16 * keys / 32 * 16` lines;
/// `prepare` ran (`lens`, `starts`, `sinks`, `inv` have `rp` entries, `rp % 16 == 0`).
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn softmax_into_tiles(
    st: *const f32,
    (rp, len, keys): (usize, usize, usize),
    scale: f32,
    s: &mut Scratch,
    sinks: bool,
    p: *mut Line,
) {
    let mut rt = 0;
    // SAFETY: (caller) as documented; rt + G <= rp / 16.
    unsafe {
        while rt < rp / T {
            if rp / T - rt >= 2 {
                row_tiles::<2>(st, (rp, len, keys), scale, s, sinks, p, rt);
                rt += 2;
            } else {
                row_tiles::<1>(st, (rp, len, keys), scale, s, sinks, p, rt);
                rt += 1;
            }
        }
    }
}

/// Row tiles `rt..rt + G`: the max of each with `G` independent chains (one `max` per key, in
/// key order), then each tile's probabilities.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn row_tiles<const G: usize>(
    st: *const f32,
    (rp, len, keys): (usize, usize, usize),
    scale: f32,
    s: &mut Scratch,
    sinks: bool,
    p: *mut Line,
    rt: usize,
) {
    let at = |g: usize| (rt + g) * T;
    let scale = _mm512_set1_ps(scale);
    // SAFETY: (caller) every index below is < keys * rp in st, < rp in the row arrays.
    unsafe {
        let lens: [__m512i; G] =
            std::array::from_fn(|g| _mm512_loadu_si512(s.lens.as_ptr().add(at(g)).cast()));
        let starts: [__m512i; G] =
            std::array::from_fn(|g| _mm512_loadu_si512(s.starts.as_ptr().add(at(g)).cast()));
        // start <= j < len.
        let live = |g: usize, j: usize| {
            let j = _mm512_set1_epi32(j as i32);
            _mm512_cmpgt_epi32_mask(lens[g], j) & !_mm512_cmpgt_epi32_mask(starts[g], j)
        };
        // Keys live in every row of the tiles: no mask to compute there (most keys).
        let everywhere = |gs: std::ops::Range<usize>| {
            let rows = at(gs.start)..at(gs.end);
            let lo = s.starts[rows.clone()]
                .iter()
                .max()
                .map_or(0, |&v| v as usize);
            let hi = s.lens[rows].iter().min().map_or(0, |&v| v as usize);
            lo..hi
        };
        let score =
            |g: usize, j: usize| _mm512_mul_ps(_mm512_loadu_ps(st.add(j * rp + at(g))), scale);
        let sink: [__m512; G] =
            std::array::from_fn(|g| _mm512_loadu_ps(s.sinks.as_ptr().add(at(g))));
        let mut m: [__m512; G] = std::array::from_fn(|g| match sinks {
            true => sink[g],
            false => _mm512_set1_ps(f32::NEG_INFINITY),
        });
        let all = everywhere(0..G);
        for j in 0..len {
            for (g, mg) in m.iter_mut().enumerate() {
                let max = _mm512_max_ps(*mg, score(g, j));
                *mg = match all.contains(&j) {
                    true => max,
                    false => _mm512_mask_blend_ps(live(g, j), *mg, max),
                };
            }
        }
        let kbs = keys / KEYS;
        for g in 0..G {
            // Keys past `len` are never live: probability 0, adding +0 to the (non-negative)
            // sum changes no bit.
            let all = everywhere(g..g + 1);
            let prob = |j: usize| {
                let e = exp_neg_avx512(_mm512_sub_ps(score(g, j), m[g]));
                match all.contains(&j) {
                    true => e,
                    false => _mm512_maskz_mov_ps(live(g, j), e),
                }
            };
            let mut sum = _mm512_setzero_ps();
            for kb in 0..kbs {
                let mut words = [_mm512_setzero_si512(); T];
                for (w, word) in words.iter_mut().enumerate() {
                    let j = kb * KEYS + 2 * w;
                    let (lo, hi) = (prob(j), prob(j + 1));
                    sum = _mm512_add_ps(_mm512_add_ps(sum, lo), hi);
                    // No probability is denormal (0 or exp_neg(x >= -87.3) > 2^-126), so the
                    // unchecked instruction rounds as `half` does.
                    *word = pairs_cvt(lo, hi);
                }
                // Word w of every row (lane r), then rows as lines: a 16 × 16 transpose.
                transpose16(&mut words);
                let tile = p.add(((rt + g) * kbs + kb) * T);
                for (r, line) in words.iter().enumerate() {
                    _mm512_store_si512(tile.add(r).cast(), *line);
                }
            }
            if sinks {
                sum = _mm512_add_ps(sum, exp_neg_avx512(_mm512_sub_ps(sink[g], m[g])));
            }
            _mm512_storeu_ps(
                s.inv.as_mut_ptr().add(at(g)),
                _mm512_div_ps(_mm512_set1_ps(1.0), sum),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use half::bf16;

    use super::super::super::softmax::softmax_avx2;
    use super::*;

    /// The unfused task's steps: scores `× scale` in place, `softmax_avx2`, keys past `len`
    /// zeroed, each probability rounded to bf16 into P's layout.
    fn unfused(
        st: &[f32],
        (rp, len, keys): (usize, usize, usize),
        scale: f32,
        s: &mut Scratch,
        sinks: bool,
    ) -> Vec<u32> {
        let mut st: Vec<f32> = st.iter().map(|v| v * scale).collect();
        // SAFETY: the test runs only where AVX-512F (hence AVX2 and FMA) is present.
        unsafe { softmax_avx2(st.as_mut_ptr(), rp, len, s, sinks) };
        st[len * rp..].fill(0.0);
        let kbs = keys / KEYS;
        let mut p = vec![0u32; rp / T * kbs * T * T];
        for r in 0..rp {
            for j in (0..keys).step_by(2) {
                let (lo, hi) = (st[j * rp + r], st[(j + 1) * rp + r]);
                let word = u32::from(bf16::from_f32(lo).to_bits())
                    | u32::from(bf16::from_f32(hi).to_bits()) << 16;
                let (rt, kb, w) = (r / T, j / KEYS, j % KEYS / 2);
                p[((rt * kbs + kb) * T + r % T) * T + w] = word;
            }
        }
        p
    }

    #[test]
    fn fused_softmax_is_scale_softmax_then_pack() {
        if !crate::kernels::cpu::bf16::round_native() {
            println!("skip: no AVX512-BF16: the fused AMX softmax did not run");
            return;
        }
        let mut seed = 5u64;
        let mut rnd = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        };
        // (rows, len, window, sinks): odd and even row tiles, keys past len, windows.
        for (rows, len, window, sinks) in [
            (64, 70, None, false),
            (48, 33, Some(9), true),
            (16, 200, None, true),
            (30, 1, None, false),
        ] {
            let rp = usize::div_ceil(rows, T) * T;
            let keys = usize::div_ceil(len, KEYS) * KEYS;
            let st: Vec<f32> = (0..keys * rp).map(|_| rnd() * 40.0).collect();
            let mut s = Scratch::default();
            s.lens = (0..rp)
                .map(|r| {
                    if r < rows {
                        (len - (rows - 1 - r) % len.max(1)) as u32
                    } else {
                        0
                    }
                })
                .collect();
            s.starts = (0..rp)
                .map(|r| window.map_or(0, |w: usize| s.lens[r].saturating_sub(w as u32)))
                .collect();
            s.sinks = (0..rp).map(|_| rnd() * 3.0).collect();
            s.inv = vec![0.0; rp];
            let scale = 0.125 + rnd().abs();
            let want = unfused(&st, (rp, len, keys), scale, &mut s, sinks);
            let want_inv = s.inv.clone();
            let mut p = vec![Line([0; 16]); rp / T * keys / KEYS * T];
            // SAFETY: the features are present; buffers sized as documented.
            unsafe {
                softmax_into_tiles(
                    st.as_ptr(),
                    (rp, len, keys),
                    scale,
                    &mut s,
                    sinks,
                    p.as_mut_ptr(),
                )
            };
            let got: Vec<u32> = p.iter().flat_map(|l| l.0).collect();
            assert_eq!(got, want, "rows {rows} len {len}");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&s.inv), bits(&want_inv), "rows {rows} len {len}");
        }
    }
}
