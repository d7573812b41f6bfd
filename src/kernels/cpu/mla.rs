//! Multi-head latent attention's heads laid out for the attention kernels on the CPU
//! ([`crate::kernels::Device::mla_heads`]).

use rayon::prelude::*;

use crate::kernels::device::MlaDims;

/// `out` `[T, 3 · heads · D]` from `q` `[T, heads · D]`, `kv` `[T, heads · (nope + v)]`,
/// `k_rope` `[T, rope]` (see [`crate::kernels::Device::mla_heads`]); rows in parallel.
pub fn mla_heads(q: &[f32], kv: &[f32], k_rope: &[f32], d: &MlaDims, out: &mut Vec<f32>) {
    let Some([qw, kvw, rope]) = d.input_widths() else {
        return out.clear();
    };
    let width = d.out_width();
    let rows = q.len().checked_div(qw).unwrap_or(0);
    out.clear();
    out.resize(rows * width, 0.0);
    out.par_chunks_mut(width)
        .zip(q.par_chunks(qw))
        .zip(kv.par_chunks(kvw).zip(k_rope.par_chunks(rope)))
        .for_each(|((o, q), (kv, kr))| row(q, kv, kr, d, o));
}

/// One token's heads: q heads, then k heads, then v heads (zeros past `v`, already in `o`).
fn row(q: &[f32], kv: &[f32], k_rope: &[f32], d: &MlaDims, o: &mut [f32]) {
    let hd = d.head_dim();
    let (qs, rest) = o.split_at_mut(d.heads * hd);
    let (ks, vs) = rest.split_at_mut(d.heads * hd);
    for h in 0..d.heads {
        let (qh, kvh) = (
            &q[h * hd..][..hd],
            &kv[h * (d.nope + d.v)..][..d.nope + d.v],
        );
        let (qo, ko) = (&mut qs[h * hd..][..hd], &mut ks[h * hd..][..hd]);
        for c in 0..d.rope {
            let r = d.rope_source(c);
            qo[c] = qh[d.nope + r];
            ko[c] = k_rope[r];
        }
        qo[d.rope..].copy_from_slice(&qh[..d.nope]);
        ko[d.rope..].copy_from_slice(&kvh[..d.nope]);
        vs[h * hd..][..d.v].copy_from_slice(&kvh[d.nope..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two tokens, two heads: every output value traced to its source by value.
    #[test]
    fn heads_are_rope_then_nope_and_v_is_zero_padded() {
        let d = MlaDims {
            heads: 2,
            nope: 3,
            rope: 4,
            v: 2,
            interleave: true,
        };
        // Values name their place: q 100·t + 10·h + c, kv 1000 + ..., k_rope 2000 + ...
        let q: Vec<f32> = (0..2)
            .flat_map(|t| {
                (0..2).flat_map(move |h| (0..7).map(move |c| (100 * t + 10 * h + c) as f32))
            })
            .collect();
        let kv: Vec<f32> = (0..2)
            .flat_map(|t| {
                (0..2).flat_map(move |h| (0..5).map(move |c| (1000 + 100 * t + 10 * h + c) as f32))
            })
            .collect();
        let kr: Vec<f32> = (0..2)
            .flat_map(|t| (0..4).map(move |c| (2000 + 100 * t + c) as f32))
            .collect();
        let mut out = Vec::new();
        mla_heads(&q, &kv, &kr, &d, &mut out);
        assert_eq!(out.len(), 2 * 3 * 2 * 7);
        let row1 = &out[42..];
        // q head 1 of token 1: rope dims 3..7 de-interleaved (3, 5, 4, 6), then nope 0..3.
        assert_eq!(&row1[7..14], &[113., 115., 114., 116., 110., 111., 112.]);
        // k head 0 of token 1: the shared k_rope de-interleaved, then kv's nope dims.
        assert_eq!(
            &row1[14..21],
            &[2100., 2102., 2101., 2103., 1100., 1101., 1102.]
        );
        // v head 1 of token 1: kv's dims 3..5, then zeros.
        assert_eq!(&row1[35..42], &[1113., 1114., 0., 0., 0., 0., 0.]);
        let plain = MlaDims {
            interleave: false,
            ..d
        };
        mla_heads(&q, &kv, &kr, &plain, &mut out);
        assert_eq!(&out[..7], &[3., 4., 5., 6., 0., 1., 2.]);
    }
}
