//! Element-wise and per-row f32 kernels: RoPE, SiLU·mul, residual add, argmax (the norms:
//! [`super::norm`]).
//! Every function treats each row on its own, in a fixed order, so a row's result never depends
//! on the other rows of the batch.

use rayon::prelude::*;

use super::norm::{layer_norm_row, rms_norm_row};
use crate::kernels::device::{QkNormForm, QkNormWeights};
use crate::kernels::rope::{Rope, rotate_half};

/// `x += y`, element-wise (the plain residual add, so a captured row is exactly
/// `residual + hidden`).
pub fn add_inplace(x: &mut [f32], y: &[f32]) {
    x.par_chunks_mut(4096)
        .zip(y.par_chunks(4096))
        .for_each(|(a, b)| {
            for (u, v) in a.iter_mut().zip(b) {
                *u += *v;
            }
        });
}

/// `x = clamp(x, -limit, limit)`; NaN stays NaN (as torch's `clamp`: a bad value is not
/// hidden as the limit).
pub fn clamp_inplace(x: &mut [f32], limit: f32) {
    x.par_chunks_mut(4096).for_each(|a| {
        for u in a {
            *u = u.clamp(-limit, limit);
        }
    });
}

/// `x *= factor`.
pub fn scale_inplace(x: &mut [f32], factor: f32) {
    x.par_chunks_mut(4096).for_each(|a| {
        for u in a {
            *u *= factor;
        }
    });
}

/// `out[t, i] = silu(gu[t, i]) * gu[t, I + i]` for `gu` of shape `[T, 2I]` (gate then up).
pub fn silu_mul(gu: &[f32], inter: usize, out: &mut Vec<f32>) {
    glu_rows(gu, inter, out, super::exp::silu_mul_into);
}

/// Gemma's GeGLU: `gelu_tanh(gu[t, i]) · gu[t, I + i]` (transformers `gelu_pytorch_tanh`).
pub fn gelu_tanh_mul(gu: &[f32], inter: usize, out: &mut Vec<f32>) {
    glu_rows(gu, inter, out, super::exp::gelu_tanh_mul_into);
}

/// gpt-oss's clamped SwiGLU (transformers `GptOssExperts._apply_gate`, in f32):
/// `(clamp(u, -limit, limit) + 1) · g · sigmoid(alpha · g)` with `g = min(gate, limit)`.
pub fn swiglu_clamped(gu: &[f32], inter: usize, (alpha, limit): (f32, f32), out: &mut Vec<f32>) {
    glu(gu, inter, out, |g, u| {
        let g = g.min(limit);
        let u = u.clamp(-limit, limit);
        (u + 1.0) * (g * (1.0 / (1.0 + (-(g * alpha)).exp())))
    });
}

/// `out[t, i] = f(gu[t, i], gu[t, I + i])` over rows of `[gate (I) | up (I)]`.
fn glu(gu: &[f32], inter: usize, out: &mut Vec<f32>, f: impl Fn(f32, f32) -> f32 + Sync) {
    glu_rows(gu, inter, out, |g, u, o| {
        for ((oi, &gi), &ui) in o.iter_mut().zip(g).zip(u) {
            *oi = f(gi, ui);
        }
    });
}

/// `row(gate, up, out)` over the rows of `gu` `[T, 2I]` into `out` `[T, I]`.
fn glu_rows(
    gu: &[f32],
    inter: usize,
    out: &mut Vec<f32>,
    row: impl Fn(&[f32], &[f32], &mut [f32]) + Sync,
) {
    let t = gu.len() / (2 * inter);
    out.clear();
    out.resize(t * inter, 0.0);
    out.par_chunks_mut(inter)
        .zip(gu.par_chunks(2 * inter))
        .for_each(|(o, r)| {
            let (g, u) = r.split_at(inter);
            row(g, u, o);
        });
}

// The C library's error functions (libm, which std links on Linux; `f32::erf` is unstable in
// Rust 1.95 and the libc crate does not bind them): pure functions of one number.
unsafe extern "C" {
    safe fn erff(x: f32) -> f32;
    #[cfg(test)]
    safe fn erf(x: f64) -> f64;
}

/// GPT-NeoX's exact GELU of one value in torch's order, `x · 0.5 · (1 + erf(x / √2))`.
pub fn gelu_erf(x: f32) -> f32 {
    x * 0.5 * (1.0 + erff(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// Index of the largest value (the first on ties; NaNs never win).
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in x.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best
}

/// Where q, k and v sit in each row of a fused projection, and what [`split_qkv`] does to q
/// and k on the way out.
pub struct QkvSplit<'a> {
    /// Row width of the projection.
    pub width: usize,
    /// q: columns `0..q_dim`; k: `k_col..k_col + kv_dim`; v: `v_col..v_col + kv_dim`.
    pub q_dim: usize,
    pub k_col: usize,
    pub v_col: usize,
    pub kv_dim: usize,
    pub head_dim: usize,
    /// Norm weights of q and k, and eps: RMSNorm of pieces as wide as the weights, or (with
    /// `norm_form` `HeadLayerNorm`) LayerNorm of each head with its own row of them.
    pub norm: Option<QkNormWeights<'a, [f32]>>,
    /// How `norm` applies (before or after RoPE, which norm).
    pub norm_form: QkNormForm,
    /// Per-head RMSNorm weights of v (Gemma 4's, all ones) and eps.
    pub v_norm: Option<(&'a [f32], f64)>,
    /// RoPE on the first `rotary_dim` dims of every head, at each row's position.
    pub rope: Option<(&'a Rope, usize)>,
    pub positions: &'a [usize],
}

/// q, k and v of every row of `qkv`, one pass per token: each piece of q and k (and, where
/// given, each head of v: Gemma 4) RMS-normed ([`rms_norm_row`], straight from the projection:
/// Qwen3's per-head q/k norm, or a whole-width one), then rotate-half RoPE (transformers
/// `apply_rotary_pos_emb`) on the first `rotary_dim` dims of every head at the row's position,
/// the rest passing through (partial rotary); one cos / sin per token serves q and k. The bits
/// of gathering the columns, then norming, then rotating in separate passes (test), without
/// those passes over q and k (copies, norm and RoPE had been ~4% of a bf16 run).
pub fn split_qkv(
    qkv: &[f32],
    s: &QkvSplit<'_>,
    (q, k, v): (&mut Vec<f32>, &mut Vec<f32>, &mut Vec<f32>),
) {
    let rows = qkv.len().checked_div(s.width).unwrap_or(0);
    // Every element is written below: resizing zeroes only growth.
    q.resize(rows * s.q_dim, 0.0);
    k.resize(rows * s.kv_dim, 0.0);
    v.resize(rows * s.kv_dim, 0.0);
    if rows == 0 || s.q_dim == 0 || s.kv_dim == 0 {
        return;
    }
    let half = s.rope.map_or(0, |(_, rot)| rot / 2);
    q.par_chunks_mut(s.q_dim)
        .zip(k.par_chunks_mut(s.kv_dim))
        .zip(v.par_chunks_mut(s.kv_dim))
        .zip(qkv.par_chunks(s.width))
        .zip(s.positions.par_iter())
        .for_each_init(
            || scratch(half),
            |cs, ((((qr, kr), vr), row), &pos)| {
                prepare_row(s, row, pos, (qr, Some((kr, vr))), cs);
            },
        );
}

/// [`split_qkv`]'s q alone, for a layer attending over an earlier layer's keys and values
/// (rows as wide as `s.width`, only their first `q_dim` columns read).
pub fn split_q(qkv: &[f32], s: &QkvSplit<'_>, q: &mut Vec<f32>) {
    let rows = qkv.len().checked_div(s.width).unwrap_or(0);
    // Every element is written below: resizing zeroes only growth.
    q.resize(rows * s.q_dim, 0.0);
    if rows == 0 || s.q_dim == 0 {
        return;
    }
    let half = s.rope.map_or(0, |(_, rot)| rot / 2);
    q.par_chunks_mut(s.q_dim)
        .zip(qkv.par_chunks(s.width))
        .zip(s.positions.par_iter())
        .for_each_init(
            || scratch(half),
            |cs, ((qr, row), &pos)| prepare_row(s, row, pos, (qr, None), cs),
        );
}

/// A row's k and v destinations.
type KvRow<'a> = Option<(&'a mut [f32], &'a mut [f32])>;

/// [`prepare_row`]'s scratch: cos and sin of `half` frequencies, and a norm piece's copy.
type RowScratch = (Vec<f32>, Vec<f32>, Vec<f32>);

fn scratch(half: usize) -> RowScratch {
    (vec![0.0; half], vec![0.0; half], Vec::new())
}

/// One row's q (and k, v): gathered from `row`, normed, rotated at `pos` (a norm form after
/// RoPE: rotated, then normed; `cs`: scratch of `rot / 2` cos and sin and a norm piece).
fn prepare_row(
    s: &QkvSplit<'_>,
    row: &[f32],
    pos: usize,
    (qr, kv): (&mut [f32], KvRow<'_>),
    (cos, sin, tmp): &mut RowScratch,
) {
    let hd = s.head_dim;
    let norm_form = s.norm_form;
    let piece = |form, dst: &mut [f32], src: &[f32], w: Option<&[f32]>, eps: f64| match w {
        Some(w) => norm_pieces(form, hd, (src, w, eps), dst),
        None => dst.copy_from_slice(src),
    };
    let eps = s.norm.map_or(0.0, |n| n.2);
    // Before RoPE the norms apply while gathering; after it, in place below.
    let (before, after) = match s.norm_form.after_rope() {
        false => (s.norm, None),
        true => (None, s.norm),
    };
    let mut kr = None;
    if let Some((k, v)) = kv {
        let (vn, v_eps) = s.v_norm.map_or((None, 0.0), |(w, eps)| (Some(w), eps));
        // Gemma 4's v norm is an RMSNorm of each head whatever q's and k's are.
        let v_cols = &row[s.v_col..s.v_col + s.kv_dim];
        piece(QkNormForm::Rms, v, v_cols, vn, v_eps);
        piece(
            norm_form,
            k,
            &row[s.k_col..s.k_col + s.kv_dim],
            before.and_then(|n| n.1),
            eps,
        );
        kr = Some(k);
    }
    piece(norm_form, qr, &row[..s.q_dim], before.map(|n| n.0), eps);
    if let Some((rope, rot)) = s.rope {
        rope.cos_sin(pos, cos, sin);
        let k_heads = kr.iter_mut().flat_map(|k| k.chunks_exact_mut(s.head_dim));
        for head in qr.chunks_exact_mut(s.head_dim).chain(k_heads) {
            rotate_half(&mut head[..rot], cos, sin);
        }
    }
    if let Some((qn, kn, eps)) = after {
        let mut in_place = |x: &mut [f32], w: &[f32]| {
            tmp.clear();
            tmp.extend_from_slice(x);
            norm_pieces(norm_form, hd, (tmp, w, eps), x);
        };
        in_place(qr, qn);
        if let (Some(k), Some(kn)) = (kr, kn) {
            in_place(k, kn);
        }
    }
}

/// `src`'s pieces normed into `dst`: RMSNorm of pieces as wide as `w`, or (`HeadLayerNorm`)
/// LayerNorm of each head of `hd` with its own `hd` values of `w`.
fn norm_pieces(form: QkNormForm, hd: usize, (src, w, eps): (&[f32], &[f32], f64), dst: &mut [f32]) {
    match form {
        QkNormForm::HeadLayerNorm => {
            let heads = dst.chunks_exact_mut(hd).zip(src.chunks_exact(hd));
            for ((d, x), w) in heads.zip(w.chunks_exact(hd)) {
                layer_norm_row(x, w, eps, d);
            }
        }
        QkNormForm::Rms | QkNormForm::RmsAfterRope => {
            for (d, x) in dst.chunks_exact_mut(w.len()).zip(src.chunks_exact(w.len())) {
                rms_norm_row(x, w, eps, d);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// The exact GELU against f64 (`erf` of libm in double): within 4 ulp of the result where it
    /// is not far below `x` (above -5), and 0 / `x` at the tails.
    #[test]
    fn gelu_erf_is_accurate() {
        for i in -8000..=8000 {
            let x = i as f32 / 1000.0;
            let want = x as f64 * 0.5 * (1.0 + super::erf(x as f64 / 2f64.sqrt()));
            let got = super::gelu_erf(x);
            let tol = 4.0 * f32::EPSILON as f64 * want.abs().max(1e-30) + 1e-12;
            if x > -5.0 {
                assert!(
                    (got as f64 - want).abs() <= tol.max(1e-7 * x.abs() as f64),
                    "{x}: {got} vs {want}"
                );
            }
        }
        assert_eq!(super::gelu_erf(100.0), 100.0);
        assert_eq!(super::gelu_erf(-100.0), 0.0);
        assert!(super::gelu_erf(f32::NAN).is_nan());
    }

    use super::super::exp::gelu_tanh_times;
    use super::super::norm::ROWS_PER_TASK;
    use super::*;
    use crate::kernels::dtype::RopeScaling;

    /// OLMo's clip_qkv as torch's `clamp_`: outside values to the limit, inside ones and NaN
    /// unchanged.
    #[test]
    fn clamp_keeps_nan_and_inside_values() {
        let mut x = vec![
            -9.5f32,
            -8.0,
            -7.25,
            0.0,
            3.5,
            8.0,
            8.5,
            f32::INFINITY,
            f32::NAN,
        ];
        clamp_inplace(&mut x, 8.0);
        assert_eq!(&x[..8], &[-8.0, -8.0, -7.25, 0.0, 3.5, 8.0, 8.0, 8.0]);
        assert!(x[8].is_nan());
    }

    /// torch 2.15's `gelu(x, approximate="tanh")` in f32 (printed from torch; a GELU of erf or
    /// another constant is off by ~1e-4 at 1): within a few ulps (torch's `1 + tanh` cancels
    /// where x < 0, which scales its error by |x|).
    #[test]
    fn gelu_tanh_matches_torch() {
        let torch = [
            (-20.0f32, -0.0f32),
            (-5.0, -2.980_232_2e-7),
            (-3.0, -0.003_637_433),
            (-1.5, -0.100_428_43),
            (-0.5, -0.154_286),
            (-1e-3, -0.000_499_601_07),
            (0.0, 0.0),
            (0.25, 0.149_675_35),
            (1.0, 0.841_192),
            (2.5, 2.484_915_7),
            (7.0, 7.0),
            (30.0, 30.0),
        ];
        for (x, want) in torch {
            let got = gelu_tanh_times(x, 1.0);
            assert!(
                (got - want).abs() <= 2e-7 * (1.0 + x.abs()),
                "{x}: {got} vs {want}"
            );
        }
        let mut out = Vec::new();
        gelu_tanh_mul(&[1.0, -0.5, 2.0, 4.0], 2, &mut out);
        let want = [gelu_tanh_times(1.0, 2.0), gelu_tanh_times(-0.5, 4.0)];
        assert_eq!(out, want);
    }

    // The separate passes `split_qkv` fuses, as they ran before it.
    /// In-place RMSNorm of every `w.len()`-wide row (Qwen3 per-head q/k norm).
    pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f64) {
        let d = w.len();
        x.par_chunks_mut(d * ROWS_PER_TASK).for_each(|xs| {
            let mut tmp = vec![0.0f32; d];
            for row in xs.chunks_exact_mut(d) {
                rms_norm_row(row, w, eps, &mut tmp);
                row.copy_from_slice(&tmp);
            }
        });
    }

    /// Rotate-half RoPE (transformers `apply_rotary_pos_emb`) on the first `rotary_dim` dims of
    /// every `head_dim`-wide head of each row of `q` and of `k` at `positions[t]`; the rest pass
    /// through (partial rotary when `rotary_dim < head_dim`). One cos / sin per token serves both.
    pub fn apply_rope(
        rope: &Rope,
        (q, k): (&mut [f32], &mut [f32]),
        positions: &[usize],
        head_dim: usize,
        rotary_dim: usize,
    ) {
        let half = rotary_dim / 2;
        if positions.is_empty() {
            return;
        }
        let (qrow, krow) = (q.len() / positions.len(), k.len() / positions.len());
        q.par_chunks_mut(qrow)
            .zip(k.par_chunks_mut(krow.max(1)))
            .zip(positions.par_iter())
            .for_each_init(
                || (vec![0.0f32; half], vec![0.0f32; half]),
                |(cos, sin), ((qr, kr), &pos)| {
                    rope.cos_sin(pos, cos, sin);
                    for head in qr
                        .chunks_exact_mut(head_dim)
                        .chain(kr.chunks_exact_mut(head_dim))
                    {
                        rotate_half(&mut head[..rotary_dim], cos, sin);
                    }
                },
            );
    }

    #[test]
    fn rope_position_zero_is_identity_and_norm_preserving() {
        let rope = Rope::new(8, 10000.0, RopeScaling::None);
        let orig: Vec<f32> = (0..16).map(|i| i as f32 - 3.0).collect();
        let (mut x, mut k) = (orig.clone(), orig[..8].to_vec());
        apply_rope(&rope, (&mut x, &mut k), &[0], 8, 8);
        assert_eq!((&x[..], &k[..]), (&orig[..], &orig[..8]));
        apply_rope(&rope, (&mut x, &mut k), &[5], 8, 8);
        let n0: f32 = orig.iter().map(|v| v * v).sum();
        let n1: f32 = x.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-3);
        // k's head got the same rotation as q's first head.
        assert_eq!(k, x[..8]);
    }

    /// One pass per token gives the bits of the columns gathered, `rms_norm_inplace`, then
    /// `apply_rope`: per-head and whole-width norms, partial rotary, none at all.
    #[test]
    fn split_qkv_is_gather_norm_rope() {
        let mut seed = 3u64;
        let mut rnd = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 6.0
        };
        let (hd, heads, kv_heads, rows) = (16, 4, 2, 37);
        let (qd, kvd) = (heads * hd, kv_heads * hd);
        let width = qd + 2 * kvd + 3;
        let qkv: Vec<f32> = (0..rows * width).map(|_| rnd()).collect();
        let positions: Vec<usize> = (0..rows).map(|t| t * 7 % 50).collect();
        let rope = Rope::new(hd, 10000.0, RopeScaling::None);
        let (per_head_q, per_head_k): (Vec<f32>, Vec<f32>) = (
            (0..hd).map(|_| rnd()).collect(),
            (0..hd).map(|_| rnd()).collect(),
        );
        let (whole_q, whole_k): (Vec<f32>, Vec<f32>) = (
            (0..qd).map(|_| rnd()).collect(),
            (0..kvd).map(|_| rnd()).collect(),
        );
        let norms = [
            None,
            Some((&per_head_q[..], &per_head_k[..], 1e-6)),
            Some((&whole_q[..], &whole_k[..], 1e-5)),
        ];
        let ropes = [None, Some((&rope, hd)), Some((&rope, hd / 2))];
        let ones = vec![1.0f32; hd];
        let v_norms = [None, Some((&ones[..], 1e-6))];
        let cols = |c: usize, w: usize| -> Vec<f32> {
            qkv.chunks_exact(width)
                .flat_map(|r| r[c..c + w].to_vec())
                .collect()
        };
        let b = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        let cases = norms.into_iter().zip(v_norms.into_iter().cycle());
        for ((norm, v_norm), after) in cases.flat_map(|c| [(c, false), (c, true)]) {
            for rope in ropes {
                let (mut q, mut k, mut v) = (cols(0, qd), cols(qd, kvd), cols(qd + kvd, kvd));
                let qk_norm = |q: &mut Vec<f32>, k: &mut Vec<f32>| {
                    if let Some((qn, kn, eps)) = norm {
                        rms_norm_inplace(q, qn, eps);
                        rms_norm_inplace(k, kn, eps);
                    }
                };
                if !after {
                    qk_norm(&mut q, &mut k);
                }
                if let Some((vn, eps)) = v_norm {
                    rms_norm_inplace(&mut v, vn, eps);
                }
                if let Some((r, rot)) = rope {
                    apply_rope(r, (&mut q, &mut k), &positions, hd, rot);
                }
                if after {
                    qk_norm(&mut q, &mut k);
                }
                let split = QkvSplit {
                    width,
                    norm: norm.map(|(qn, kn, eps)| (qn, Some(kn), eps)),
                    norm_form: match after {
                        true => QkNormForm::RmsAfterRope,
                        false => QkNormForm::Rms,
                    },
                    v_norm,
                    rope,
                    ..contiguous((qd, kvd, hd), &positions)
                };
                let (mut q2, mut k2, mut v2) = (vec![f32::NAN; 3], Vec::new(), Vec::new());
                split_qkv(&qkv, &split, (&mut q2, &mut k2, &mut v2));
                let what = format!(
                    "norm {} (after RoPE {after}) v norm {} rope {:?}",
                    norm.is_some(),
                    v_norm.is_some(),
                    rope.map(|r| r.1)
                );
                assert_eq!((b(&q2), b(&k2), b(&v2)), (b(&q), b(&k), b(&v)), "{what}");
            }
        }
    }

    /// The split of rows `[q | k | v]` (`qd`, `kvd`, `kvd` wide, heads of `hd`; nothing after
    /// them) without norms or RoPE.
    fn contiguous((qd, kvd, hd): (usize, usize, usize), positions: &[usize]) -> QkvSplit<'_> {
        QkvSplit {
            width: qd + 2 * kvd,
            q_dim: qd,
            k_col: qd,
            v_col: qd + kvd,
            kv_dim: kvd,
            head_dim: hd,
            norm: None,
            norm_form: QkNormForm::Rms,
            v_norm: None,
            rope: None,
            positions,
        }
    }

    /// Cohere's q / k norm: each head LayerNormed with its own row of the weights, then RoPE;
    /// v as it is (or RMS-normed where a v norm is given, whatever q's and k's norm is).
    #[test]
    fn split_qkv_head_layer_norm_is_a_layer_norm_per_head() {
        let (hd, heads, kv_heads, rows) = (8, 3, 1, 5);
        let (qd, kvd) = (heads * hd, kv_heads * hd);
        let width = qd + 2 * kvd;
        let value = |i: usize| ((i * 37 % 23) as f32 - 11.0) * 0.3;
        let qkv: Vec<f32> = (0..rows * width).map(value).collect();
        let (qw, kw): (Vec<f32>, Vec<f32>) = (
            (0..qd).map(|i| 0.5 + i as f32 * 0.1).collect(),
            (0..kvd).map(|i| 1.5 - i as f32 * 0.1).collect(),
        );
        let positions: Vec<usize> = (0..rows).collect();
        let rope = Rope::new(hd, 10000.0, RopeScaling::None);
        let ones = vec![1.0f32; hd];
        let split = QkvSplit {
            norm: Some((&qw[..], Some(&kw[..]), 1e-5)),
            norm_form: QkNormForm::HeadLayerNorm,
            v_norm: Some((&ones[..], 1e-6)),
            rope: Some((&rope, hd)),
            ..contiguous((qd, kvd, hd), &positions)
        };
        let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
        split_qkv(&qkv, &split, (&mut q, &mut k, &mut v));
        let normed = |x: &[f32], w: &[f32]| -> Vec<f32> {
            let mut out = vec![0.0; x.len()];
            for ((o, x), w) in out
                .chunks_exact_mut(hd)
                .zip(x.chunks_exact(hd))
                .zip(w.chunks_exact(hd))
            {
                layer_norm_row(x, w, 1e-5, o);
            }
            out
        };
        let (mut want_q, mut want_k, mut want_v) = (Vec::new(), Vec::new(), Vec::new());
        for r in qkv.chunks_exact(width) {
            want_q.extend(normed(&r[..qd], &qw));
            want_k.extend(normed(&r[qd..qd + kvd], &kw));
            want_v.extend(r[qd + kvd..].to_vec());
        }
        rms_norm_inplace(&mut want_v, &ones, 1e-6);
        apply_rope(&rope, (&mut want_q, &mut want_k), &positions, hd, hd);
        let b = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!((b(&q), b(&k), b(&v)), (b(&want_q), b(&want_k), b(&want_v)));
        // Not an RMSNorm: the heads' means are not zero.
        let rms = QkvSplit {
            norm_form: QkNormForm::Rms,
            ..split
        };
        let (mut q_rms, mut k_rms) = (Vec::new(), Vec::new());
        split_qkv(&qkv, &rms, (&mut q_rms, &mut k_rms, &mut v));
        assert_ne!(b(&q_rms), b(&q));
    }

    #[test]
    fn argmax_first_on_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, f32::NAN]), 1);
    }
}
