//! The gated delta rule of Gated DeltaNet (Qwen3.5 / Qwen3-Next, OLMo Hybrid) and of Kimi Delta
//! Attention (Kimi Linear), token by token in f32.
//!
//! Per value head the state `S` (`[dk, dv]`) goes, for each token t,
//! `S ← diag(decay_t) · S`, `m = Sᵀ k_t`, `δ = (v_t − m) · β_t`, `S ← S + k_t δᵀ`,
//! `o_t = Sᵀ q_t` (chunk invariance: [`recurrent`](super::recurrent)'s module docs). Gated
//! DeltaNet's decay is one per head (every row of the state the same); Kimi Delta Attention's
//! one per key channel (row).
//!
//! # One sweep over the state per token
//! The state is read and written once per token: the sweep that applies token t's update and
//! reads `o_t` also applies token t+1's decay and sums `m_{t+1}` ([`sweep`]). It walks the
//! state one strip of [`STRIP`] value columns at a time, so the strip's sums (`o`, `m`) stay in
//! registers over the dk rows. Each element still sees the operations of the four-pass form in
//! their order (decay, `m +=`, update, `o +=`; sums over rows in row order), so the bits are
//! those of the plain loops on every vector unit (tests below).

use super::decay::decays_into;
use super::recurrent::{HeadRows, per_head, sigmoid, softplus};
use crate::kernels::device::GdnDims;
use crate::kernels::plan::SeqState;

/// Value columns per strip of a sweep: two AVX-512 registers of f32. Each row adds into every
/// column's `o` and `m` sums, a chain of dependent adds; two registers per sum give two
/// independent chains (Qwen3.5-like bf16, dv 64, 2 threads, alternating runs: 3,450–3,770
/// tok/s with strips of 16, 3,770–3,860 with 32; 64 ran ~3% faster again on AVX-512 but would
/// need 24 of AVX2's 16 registers for the sums).
const STRIP: usize = 32;

/// Gated DeltaNet geometry and per-head parameters.
pub struct GdnParams<'a> {
    pub dims: GdnDims,
    /// `-exp(A_log)` per value head.
    pub neg_a: &'a [f32],
    pub dt_bias: &'a [f32],
    /// `beta = beta_scale · sigmoid(b)` (1, or 2 with negative eigenvalues allowed).
    pub beta_scale: f32,
    /// Kimi Delta Attention's decay per key channel: `a` has `nv · dk` columns and `dt_bias`
    /// `nv · dk` values (channel `h · dk + i` gates row i of head h's state).
    pub per_channel: bool,
}

/// The gated delta rule. `qkv` is the conv output `[T, 2·nk·dk + nv·dv]` (q | k | v), `b` is
/// `[T, nv]`, `a` `[T, nv]` (or `[T, nv·dk]`, [`GdnParams::per_channel`]); `state` is
/// `[slots, nv, dk, dv]`. Writes the core output `[T, nv·dv]`.
/// q and k are L2-normalised (eps 1e-6) and q is scaled by `dk^-0.5`;
/// `g = -exp(A_log)·softplus(a + dt_bias)`, `beta = beta_scale·sigmoid(b)`; q/k head
/// `h / (nv/nk)` serves value head h (transformers `repeat_interleave`).
pub fn gated_delta_rule(
    qkv: &[f32],
    b: &[f32],
    a: &[f32],
    p: &GdnParams<'_>,
    seqs: &[SeqState],
    state: &mut [f32],
    out: &mut Vec<f32>,
) {
    let io = GdnIo { qkv, b, a };
    let GdnDims { nk, nv, dk, dv } = p.dims;
    let t = qkv.len() / (2 * nk * dk + nv * dv);
    let dims = (nv, dk * dv, dv);
    per_head(
        state,
        dims,
        seqs,
        t,
        out,
        #[inline(always)]
        |h, rows, st, o| head(&io, p, (h, rows, st), o),
    );
}

/// The inputs of [`gated_delta_rule`].
struct GdnIo<'a> {
    qkv: &'a [f32],
    b: &'a [f32],
    a: &'a [f32],
}

/// One token's per-head inputs: normalised q (scaled) and k, v, the decay of each state row
/// and beta.
struct Token {
    q: Vec<f32>,
    k: Vec<f32>,
    decay: Vec<f32>,
    beta: f32,
}

impl Token {
    fn new(dk: usize) -> Self {
        Self {
            q: vec![0.0; dk],
            k: vec![0.0; dk],
            decay: vec![0.0; dk],
            beta: 0.0,
        }
    }

    /// Loads row `r` for value head `h`; returns v.
    #[inline(always)]
    fn load<'a>(&mut self, io: &GdnIo<'a>, p: &GdnParams<'_>, h: usize, r: usize) -> &'a [f32] {
        let GdnDims { nk, nv, dk, dv } = p.dims;
        let key_dim = nk * dk;
        let x = &io.qkv[r * (2 * key_dim + nv * dv)..][..2 * key_dim + nv * dv];
        let kh = h / (nv / nk);
        l2norm(&x[kh * dk..(kh + 1) * dk], &mut self.q);
        l2norm(&x[key_dim + kh * dk..key_dim + (kh + 1) * dk], &mut self.k);
        let scale = 1.0 / (dk as f32).sqrt();
        for v in self.q.iter_mut() {
            *v *= scale;
        }
        let width = p.dims.gate_width(p.per_channel);
        let a = &io.a[r * width..][..width];
        match p.per_channel {
            // dk channels: the lane form (libm's three calls per channel outweighed the sweep).
            true => decays_into(
                p.neg_a[h],
                &a[h * dk..],
                &p.dt_bias[h * dk..],
                &mut self.decay,
            ),
            false => self
                .decay
                .fill((p.neg_a[h] * softplus(a[h] + p.dt_bias[h])).exp()),
        }
        self.beta = sigmoid(io.b[r * nv + h]) * p.beta_scale;
        &x[2 * key_dim + h * dv..2 * key_dim + (h + 1) * dv]
    }
}

/// Value head `h` over `rows` (one request's chunk), from and into its state `st`
/// (`[dk, dv]`); the head's output rows (`dv` each) into `out`.
#[inline(always)]
fn head(
    io: &GdnIo<'_>,
    p: &GdnParams<'_>,
    (h, rows, st): (usize, std::ops::Range<usize>, &mut [f32]),
    mut out: HeadRows<'_>,
) {
    let dv = p.dims.dv;
    let (mut cur, mut next) = (Token::new(p.dims.dk), Token::new(p.dims.dk));
    let (mut m, mut delta) = (vec![0.0f32; dv], vec![0.0f32; dv]);
    let Some(first) = rows.clone().next() else {
        return;
    };
    let mut v = cur.load(io, p, h, first);
    sweep_any(st, dv, None, Some((&cur.decay, &cur.k, &mut m)));
    for (i, r) in rows.clone().enumerate() {
        for ((d, &mj), &vj) in delta.iter_mut().zip(&m).zip(v) {
            *d = (vj - mj) * cur.beta;
        }
        let update = Some((&cur.k[..], &delta[..], &cur.q[..], out.row(i)));
        if r + 1 < rows.end {
            v = next.load(io, p, h, r + 1);
            sweep_any(st, dv, update, Some((&next.decay, &next.k, &mut m)));
            std::mem::swap(&mut cur, &mut next);
        } else {
            sweep_any(st, dv, update, None);
        }
    }
}

/// Token t's update: its k, δ, q, and where `o_t` goes.
type Update<'a> = (&'a [f32], &'a [f32], &'a [f32], &'a mut [f32]);
/// Token t+1's decay of each state row, its k, and where `m_{t+1}` goes.
type Decay<'a> = (&'a [f32], &'a [f32], &'a mut [f32]);

/// [`sweep`] in strips of [`STRIP`] columns where dv allows (every real model), else of 16,
/// else of one.
#[inline(always)]
fn sweep_any(st: &mut [f32], dv: usize, update: Option<Update<'_>>, decay: Option<Decay<'_>>) {
    if dv.is_multiple_of(STRIP) {
        sweep::<STRIP>(st, dv, update, decay)
    } else if dv.is_multiple_of(16) {
        sweep::<16>(st, dv, update, decay)
    } else {
        sweep::<1>(st, dv, update, decay)
    }
}

/// One pass over the state `st` (`[dk, dv]`): first token t's update
/// (`S += k δᵀ`, `o = Sᵀ q`), then token t+1's decay (`S *= decay`, `m = Sᵀ k'`), each element
/// doing these in that order; strip by strip of `W` columns with the strip's sums in
/// registers.
#[inline(always)]
fn sweep<const W: usize>(
    st: &mut [f32],
    dv: usize,
    mut update: Option<Update<'_>>,
    mut decay: Option<Decay<'_>>,
) {
    for c in (0..dv).step_by(W) {
        let (mut o, mut m) = ([0.0f32; W], [0.0f32; W]);
        let mut d = [0.0f32; W];
        if let Some((_, delta, _, _)) = &update {
            d.copy_from_slice(&delta[c..c + W]);
        }
        let rows = st.chunks_exact_mut(dv).map(|row| &mut row[c..c + W]);
        match (&update, &decay) {
            (Some((k, _, q, _)), Some((g, k2, _))) => {
                for ((((s, &ki), &qi), &k2i), &g) in rows.zip(*k).zip(*q).zip(*k2).zip(*g) {
                    for (((s, &dj), oj), mj) in s.iter_mut().zip(&d).zip(&mut o).zip(&mut m) {
                        *s += ki * dj;
                        *oj += *s * qi;
                        *s *= g;
                        *mj += *s * k2i;
                    }
                }
            }
            (Some((k, _, q, _)), None) => {
                for ((s, &ki), &qi) in rows.zip(*k).zip(*q) {
                    for ((s, &dj), oj) in s.iter_mut().zip(&d).zip(&mut o) {
                        *s += ki * dj;
                        *oj += *s * qi;
                    }
                }
            }
            (None, Some((g, k2, _))) => {
                for ((s, &k2i), &g) in rows.zip(*k2).zip(*g) {
                    for (s, mj) in s.iter_mut().zip(&mut m) {
                        *s *= g;
                        *mj += *s * k2i;
                    }
                }
            }
            (None, None) => {}
        }
        if let Some((_, _, _, out)) = &mut update {
            out[c..c + W].copy_from_slice(&o);
        }
        if let Some((_, _, m_out)) = &mut decay {
            m_out[c..c + W].copy_from_slice(&m);
        }
    }
}

/// `x / sqrt(sum(x²) + 1e-6)` (transformers / FLA `l2norm`).
#[inline(always)]
fn l2norm(x: &[f32], out: &mut [f32]) {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    let inv = 1.0 / (ss + 1e-6).sqrt();
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v * inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::recurrent::collect_rows;
    use crate::kernels::cpu::vector::{self, Unit};

    /// The plain form: per token, the decay and `m = Sᵀ k` pass, then the update and
    /// `o = Sᵀ q` pass, each element's operations in the four-pass order.
    fn reference(
        io: &GdnIo<'_>,
        p: &GdnParams<'_>,
        h: usize,
        t: usize,
        st: &mut [f32],
    ) -> Vec<f32> {
        let dv = p.dims.dv;
        let mut res = vec![0.0f32; t * dv];
        let mut tok = Token::new(p.dims.dk);
        let mut m = vec![0.0f32; dv];
        for r in 0..t {
            let v = tok.load(io, p, h, r);
            m.fill(0.0);
            for ((ki, g), srow) in tok.k.iter().zip(&tok.decay).zip(st.chunks_exact_mut(dv)) {
                for (mj, s) in m.iter_mut().zip(srow.iter_mut()) {
                    *s *= g;
                    *mj += *s * ki;
                }
            }
            for (mj, &vj) in m.iter_mut().zip(v) {
                *mj = (vj - *mj) * tok.beta;
            }
            let o = &mut res[r * dv..(r + 1) * dv];
            for ((ki, qi), srow) in tok.k.iter().zip(&tok.q).zip(st.chunks_exact_mut(dv)) {
                for ((s, &d), oj) in srow.iter_mut().zip(m.iter()).zip(o.iter_mut()) {
                    *s += ki * d;
                    *oj += *s * qi;
                }
            }
        }
        res
    }

    fn noise(n: usize, seed: &mut u64, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
            })
            .collect()
    }

    /// One sweep per token (strips of 32 columns, 16 or 1 where dv is not a multiple of 32)
    /// gives the output and state bits of the plain two passes, on every vector unit this CPU
    /// has; and a chunk split in two (state carried) gives the bits of the whole.
    #[test]
    fn sweeps_give_the_bits_of_the_plain_passes_on_every_vector_unit() {
        for dv in [64, 48, 24] {
            let (nk, nv, dk, t) = (2, 4, 16, 23);
            let mut seed = dv as u64;
            let qkv = noise(t * (2 * nk * dk + nv * dv), &mut seed, 2.0);
            // Kimi Delta Attention's decay per key channel on one geometry.
            let per_channel = dv == 24;
            let gates = if per_channel { nv * dk } else { nv };
            let (b, a) = (
                noise(t * nv, &mut seed, 4.0),
                noise(t * gates, &mut seed, 4.0),
            );
            let (neg_a, dt_bias) = (noise(nv, &mut seed, 1.0), noise(gates, &mut seed, 1.0));
            let neg_a: Vec<f32> = neg_a.iter().map(|x| -x.abs() - 0.1).collect();
            let p = GdnParams {
                dims: GdnDims { nk, nv, dk, dv },
                neg_a: &neg_a,
                dt_bias: &dt_bias,
                // OLMo Hybrid's beta in (0, 2) on one geometry.
                beta_scale: if dv == 48 { 2.0 } else { 1.0 },
                per_channel,
            };
            let io = GdnIo {
                qkv: &qkv,
                b: &b,
                a: &a,
            };
            let start = noise(dk * dv, &mut seed, 0.5);
            for h in 0..nv {
                let mut want_st = start.clone();
                let want = reference(&io, &p, h, t, &mut want_st);
                for unit in [Unit::Avx512, Unit::Avx2, Unit::Baseline] {
                    if !unit.available() {
                        println!("skip: gated delta rule on {unit:?} (this CPU lacks it)");
                        continue;
                    }
                    let mut st = start.clone();
                    let run = |rows: std::ops::Range<usize>, st: &mut Vec<f32>| {
                        vector::on(unit, || {
                            collect_rows(rows.len(), dv, |o| head(&io, &p, (h, rows, st), o))
                        })
                    };
                    let got = run(0..t, &mut st);
                    assert!(
                        got.iter()
                            .zip(&want)
                            .all(|(x, y)| x.to_bits() == y.to_bits())
                    );
                    assert!(
                        st.iter()
                            .zip(&want_st)
                            .all(|(x, y)| x.to_bits() == y.to_bits())
                    );
                    let mut st = start.clone();
                    let mut split = run(0..9, &mut st);
                    split.extend(run(9..t, &mut st));
                    assert!(
                        split
                            .iter()
                            .zip(&want)
                            .all(|(x, y)| x.to_bits() == y.to_bits())
                    );
                }
            }
        }
    }
}
