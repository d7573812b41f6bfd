use super::*;
use std::ops::Range;

/// A chunk at `rows` of the batch on `slot`, starting at position 0 (`fresh`) or later.
fn seq(rows: Range<usize>, slot: usize, fresh: bool) -> SeqState {
    let start = if fresh { 0 } else { 1 };
    SeqState { rows, slot, start }
}

/// The tasks of `per_head` write through raw pointers: their chunks must be disjoint and
/// inside the batch; a batch with a gap is zero-filled first.
#[test]
fn per_head_checks_the_chunks_rows() {
    let covering = [seq(4..9, 0, true), seq(0..4, 1, false)];
    assert!(disjoint_rows(&covering, 9));
    assert!(!disjoint_rows(&[seq(0..3, 0, true), seq(5..9, 1, true)], 9));
    assert!(!disjoint_rows(&covering, 10));
    for bad in [
        vec![seq(0..5, 0, true), seq(4..9, 1, true)],
        vec![seq(0..10, 0, true)],
    ] {
        assert!(std::panic::catch_unwind(|| disjoint_rows(&bad, 9)).is_err());
    }
}

/// Conv over one 10-token chunk == conv over chunks 3 + 1 + 6 (state carried), bit for bit,
/// with SiLU and without (LFM2's short convolution); SiLU of the plain conv is the SiLU conv.
#[test]
fn conv_carries_state_across_chunks() {
    let (ch, k, t) = (3, 4, 10);
    let x: Vec<f32> = (0..t * ch)
        .map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.3)
        .collect();
    let w: Vec<f32> = (0..ch * k).map(|i| (i as f32 - 4.0) * 0.1).collect();
    let bias = vec![0.1, -0.2, 0.3];
    let mut outputs = Vec::new();
    for silu in [true, false] {
        let mut state = vec![0.0; 2 * (k - 1) * ch];
        let mut whole = Vec::new();
        let whole_seq = [seq(0..t, 1, true)];
        causal_conv(
            &x,
            ch,
            &w,
            Some(&bias),
            (k, silu),
            &whole_seq,
            &mut state,
            &mut whole,
        );
        let mut state2 = vec![0.0; 2 * (k - 1) * ch];
        let mut parts = Vec::new();
        let mut start = 0;
        for len in [3, 1, 6] {
            let mut o = Vec::new();
            let xs = &x[start * ch..(start + len) * ch];
            let part = [seq(0..len, 0, start == 0)];
            causal_conv(
                xs,
                ch,
                &w,
                Some(&bias),
                (k, silu),
                &part,
                &mut state2,
                &mut o,
            );
            parts.extend(o);
            start += len;
        }
        assert_eq!(whole, parts);
        assert_eq!(&state[(k - 1) * ch..], &state2[..(k - 1) * ch]);
        outputs.push(whole);
    }
    let mut plain = outputs[1].clone();
    crate::kernels::cpu::exp::silu_inplace(&mut plain);
    assert_eq!(plain, outputs[0]);
    assert_ne!(outputs[0], outputs[1]);
}

/// The conv row gives the bits of the scalar per-channel loop on every vector unit this CPU
/// has.
#[test]
fn conv_same_bits_on_every_vector_unit() {
    use crate::kernels::cpu::vector::{self, Unit};
    let vals = |n: usize, m: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * m % 101) as f32 - 50.0) * 0.037)
            .collect()
    };
    let (ch, k) = (70, 4);
    let (w, bias, x) = (vals(ch * k, 7), vals(ch, 3), vals(k * ch, 13));
    let taps = taps_by_position(&w, ch, k);
    let want: Vec<f32> = (0..ch)
        .map(|c| {
            let mut acc = 0.0f32;
            for j in 0..k {
                acc += w[c * k + j] * x[j * ch + c];
            }
            acc + bias[c]
        })
        .collect();
    for unit in [Unit::Avx512, Unit::Avx2, Unit::Baseline] {
        if !unit.available() {
            println!("skip: conv on {unit:?} (this CPU lacks it)");
            continue;
        }
        let mut o = vec![f32::NAN; ch];
        vector::on(unit, || {
            conv_row(&mut o, &taps, Some(&bias), |j| &x[j * ch..(j + 1) * ch])
        });
        assert!(o.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}
