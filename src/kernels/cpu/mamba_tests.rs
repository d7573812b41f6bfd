use super::*;
use crate::kernels::cpu::recurrent::collect_rows;
use crate::kernels::cpu::vector::{self, Unit};

fn vals(n: usize, m: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * m % 101) as f32 - 50.0) * 0.037)
        .collect()
}

/// The scan's documented order spelled out for head `h`: per token, each state row updated,
/// then its dot with C in 8 lanes (element i in lane i mod 8), the tail serially, a fixed
/// tree; returns the outputs `[t, hd]` and the final state.
fn spelled_out(
    xbc: &[f32],
    dt: &[f32],
    p: &MambaParams<'_>,
    h: usize,
    t: usize,
) -> (Vec<f32>, Vec<f32>) {
    let (nh, hd, n, groups) = (p.heads, p.head_dim, p.d_state, p.groups);
    let mut st = vals(hd * n, 23);
    let (row, inter, g) = (nh * hd + 2 * groups * n, nh * hd, h / (nh / groups));
    let mut y = vec![0.0f32; t * hd];
    for r in 0..t {
        let xr = &xbc[r * row..(r + 1) * row];
        let (bm, cm) = (
            &xr[inter + g * n..][..n],
            &xr[inter + (groups + g) * n..][..n],
        );
        let dd = softplus(dt[r * nh + h] + p.dt_bias[h]).max(p.dt_min);
        let da = (dd * p.neg_a[h]).exp();
        for j in 0..hd {
            let (xj, srow) = (xr[h * hd + j], &mut st[j * n..(j + 1) * n]);
            let (mut acc, mut tail) = ([0.0f32; 8], 0.0f32);
            for i in 0..n {
                srow[i] = srow[i] * da + (xj * dd) * bm[i];
                if i < n / 8 * 8 {
                    acc[i % 8] += cm[i] * srow[i];
                } else {
                    tail += cm[i] * srow[i];
                }
            }
            let dot = ((acc[0] + acc[1]) + (acc[2] + acc[3]))
                + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
                + tail;
            y[r * hd + j] = dot + p.d[h] * xj;
        }
    }
    (y, st)
}

/// The head gives the spelled-out order's bits on every vector unit this CPU has (in pairs of
/// state rows on AVX2 / AVX-512, one at a time on the baseline), with an odd head dim (a row
/// left after the pairs), a d_state with a tail past its lanes and one without; and a chunk
/// split in two (state carried) gives the bits of the whole.
#[test]
fn scan_same_bits_on_every_vector_unit() {
    // (head_dim, d_state): four lanes of 8 and a tail of 4; an odd head dim; no tail.
    for (hd, n) in [(8, 36), (7, 16), (5, 8)] {
        let (nh, groups, t, h) = (4, 2, 5, 3);
        let xbc = vals(t * (nh * hd + 2 * groups * n), 17);
        let (dt, neg_a) = (vals(t * nh, 5), vec![-0.5, -1.0, -0.25, -2.0]);
        let (d, dt_bias) = (vals(nh, 11), vals(nh, 19));
        let p = MambaParams {
            heads: nh,
            head_dim: hd,
            d_state: n,
            groups,
            neg_a: &neg_a,
            d: &d,
            dt_bias: &dt_bias,
            dt_min: 0.0,
        };
        let want = spelled_out(&xbc, &dt, &p, h, t);
        for unit in [Unit::Avx512, Unit::Avx2, Unit::Baseline] {
            if !unit.available() {
                println!("skip: Mamba-2 scan on {unit:?} (this CPU lacks it)");
                continue;
            }
            let run = |rows: Range<usize>, st: &mut Vec<f32>| {
                vector::on(unit, || {
                    collect_rows(rows.len(), hd, |o| {
                        mamba_head(unit, &xbc, &dt, &p, (h, rows, st), o)
                    })
                })
            };
            let same =
                |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            let mut st = vals(hd * n, 23);
            let y = run(0..t, &mut st);
            assert!(
                same(&y, &want.0),
                "outputs: {unit:?}, head dim {hd}, d_state {n}"
            );
            assert!(
                same(&st, &want.1),
                "state: {unit:?}, head dim {hd}, d_state {n}"
            );
            let mut st = vals(hd * n, 23);
            let mut split = run(0..2, &mut st);
            split.extend(run(2..t, &mut st));
            assert!(
                same(&split, &want.0),
                "split: {unit:?}, head dim {hd}, d_state {n}"
            );
        }
    }
}
