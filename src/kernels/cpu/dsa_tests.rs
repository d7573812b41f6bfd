//! The CPU indexer and sparse attention against f64 references over a shuffled paged cache.

use super::*;
use crate::kernels::attention_reference::rnd;
use crate::kernels::dsa::{deinterleaved_source, dot8};
use crate::kernels::dsa_reference::{IndexerInputs, sparse_softmax};
use crate::kernels::plan::PlanLimits;
use crate::kernels::rope::Rope;
use crate::kernels::{Batch, SeqChunk};

const BLOCK: usize = 4;
const TOKENS: usize = 40;

/// One request of `TOKENS` tokens over a shuffled block table.
fn with_plan<R>(f: impl FnOnce(&BatchPlan<'_>) -> R) -> R {
    let ids = vec![1u32; TOKENS];
    let table: Vec<u32> = (0..TOKENS.div_ceil(BLOCK) as u32)
        .rev()
        .map(|b| 3 * b + 1)
        .collect();
    let seqs = [SeqChunk {
        context: Vec::new(),
        start: 0,
        len: TOKENS,
        block_table: table,
        sample: false,
        state_slot: None,
    }];
    let batch = Batch {
        token_ids: &ids,
        seqs: &seqs,
    };
    let plan = BatchPlan::new(&batch, &PlanLimits::new(8, 1024, 64, BLOCK)).unwrap();
    f(&plan)
}

/// `x` rotated as transformers does (de-interleaved first when `interleave`), in f64.
fn rotated(x: &[f32], rope: &Rope, rot: usize, pos: usize, interleave: bool) -> Vec<f64> {
    let half = rot / 2;
    let (mut cos, mut sin) = (vec![0.0f32; half], vec![0.0f32; half]);
    rope.cos_sin(pos, &mut cos, &mut sin);
    let src = |c: usize| {
        if interleave {
            deinterleaved_source(c, rot)
        } else {
            c
        }
    };
    let mut out: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    for i in 0..half {
        let (a, b) = (x[src(i)] as f64, x[src(i + half)] as f64);
        out[i] = a * cos[i] as f64 - b * sin[i] as f64;
        out[i + half] = b * cos[i] as f64 + a * sin[i] as f64;
    }
    out
}

/// Each token's selection equals the f64 indexer's (LayerNorm, RoPE, relu-weighted head sum,
/// top-k), on both pairings; tokens before `topk` keep every key.
#[test]
fn selection_matches_an_f64_indexer() {
    let (heads, d, rot, topk) = (3, 8, 4, 10);
    let inputs = IndexerInputs::new(TOKENS, (heads, d, rot), 7);
    let (q0, k0, w) = (&inputs.q, &inputs.k, &inputs.w);
    for interleave in [false, true] {
        let ix = inputs.indexer(topk, interleave);
        let (rope, (nw, nb, _)) = (ix.rope.0, ix.norm);
        let sel = with_plan(|plan| {
            let (mut q, mut k) = (q0.clone(), k0.clone());
            prepare(&mut q, &mut k, &plan.positions, &ix);
            let mut cache = IndexCache::new(IndexShape { layers: 2, dim: d }, 64 * BLOCK).unwrap();
            cache.write(1, &plan.slots, &k);
            let mut sel = Selection::default();
            select(&q, w, cache.layer(1), plan, &ix, &mut sel);
            sel
        });
        // The reference: keys normed in f64, then rotated.
        let keys: Vec<Vec<f64>> = (0..TOKENS)
            .map(|j| {
                let x = &k0[j * d..][..d];
                let mean = x.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
                let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / d as f64;
                let r = 1.0 / (var + 1e-6).sqrt();
                let n: Vec<f32> = (0..d)
                    .map(|i| ((x[i] as f64 - mean) * r * nw[i] as f64 + nb[i] as f64) as f32)
                    .collect();
                rotated(&n, rope, rot, j, interleave)
            })
            .collect();
        assert_eq!(sel.tokens(), TOKENS);
        for t in 0..TOKENS {
            let Some(got) = sel.keys(t) else {
                assert!(t < topk, "token {t} kept every key");
                continue;
            };
            let scores: Vec<f64> = (0..=t)
                .map(|j| {
                    (0..heads)
                        .map(|h| {
                            let qh =
                                rotated(&q0[(t * heads + h) * d..][..d], rope, rot, t, interleave);
                            let dot: f64 = qh.iter().zip(&keys[j]).map(|(a, b)| a * b).sum();
                            w[t * heads + h] as f64 * (dot / (d as f64).sqrt()).max(0.0)
                        })
                        .sum::<f64>()
                })
                .collect();
            let mut want: Vec<u32> = (0..=t as u32).collect();
            want.sort_by(|&a, &b| scores[b as usize].total_cmp(&scores[a as usize]));
            want.truncate(topk);
            want.sort_unstable();
            assert_eq!(got, &want[..], "token {t}, interleave {interleave}");
        }
    }
}

/// A token with a selection gets the softmax over its chosen keys only (f64 reference; GQA,
/// the cache's shuffled slots); the other rows are left as they were.
#[test]
fn sparse_attention_is_softmax_over_the_chosen_keys() {
    let shape = AttnShape::new(4, 2, 8);
    let (hd, kv_dim) = (shape.head_dim, shape.kv_heads * shape.head_dim);
    let mut seed = 11u64;
    let q = rnd(TOKENS * shape.heads * hd, &mut seed);
    let (k, v) = (
        rnd(TOKENS * kv_dim, &mut seed),
        rnd(TOKENS * kv_dim, &mut seed),
    );
    // Tokens from 30 on keep keys 0, 3, 6, ... and themselves; the others keep all.
    let rows: Vec<Vec<u32>> = (0..TOKENS as u32)
        .map(|t| match t >= 30 {
            true => (0..t).step_by(3).chain([t]).collect(),
            false => Vec::new(),
        })
        .collect();
    let mut sel = Selection::default();
    sel.set(rows.clone());
    let mut out = vec![7.0f32; q.len()];
    with_plan(|plan| {
        let slots = 64 * BLOCK;
        let (mut kc, mut vc) = (vec![0.0f32; slots * kv_dim], vec![0.0f32; slots * kv_dim]);
        for (t, &s) in plan.slots.iter().enumerate() {
            kc[s * kv_dim..][..kv_dim].copy_from_slice(&k[t * kv_dim..][..kv_dim]);
            vc[s * kv_dim..][..kv_dim].copy_from_slice(&v[t * kv_dim..][..kv_dim]);
        }
        attend_selected(&q, (&kc, &vc), plan, shape, &sel, &mut out);
    });
    let width = shape.heads * hd;
    for (t, keys) in rows.iter().enumerate() {
        let row = &out[t * width..][..width];
        if keys.is_empty() {
            assert!(row.iter().all(|&x| x == 7.0), "row {t} was written");
            continue;
        }
        let at = |x: &[f32], j: u32, kh: usize| x[j as usize * kv_dim + kh * hd..][..hd].to_vec();
        let q_t = &q[t * width..][..width];
        let want = sparse_softmax(q_t, keys, shape, |j, kh| (at(&k, j, kh), at(&v, j, kh)));
        for (i, (&g, w)) in row.iter().zip(&want).enumerate() {
            assert!(
                (g as f64 - w).abs() < 2e-6,
                "token {t} value {i}: {g} vs {w}"
            );
        }
    }
}

/// One token's sparse attention gives, on every vector unit, the bits of a plain loop over
/// one head at a time with the same arithmetic (GQA, keys out of order, head dims with and
/// without a tail past the chunks of 8).
#[test]
fn sparse_attention_same_bits_on_every_vector_unit() {
    use crate::kernels::cpu::vector::{self, Unit};
    for (heads, kv_heads, hd) in [(4, 2, 8), (6, 3, 20), (8, 1, 64)] {
        let shape = AttnShape::new(heads, kv_heads, hd);
        let (kv_dim, n) = (kv_heads * hd, 37);
        let mut seed = 3 + hd as u64;
        let q = rnd(heads * hd, &mut seed);
        let (k, v) = (rnd(n * kv_dim, &mut seed), rnd(n * kv_dim, &mut seed));
        let slots: Vec<usize> = (0..n).rev().map(|i| i * kv_dim).collect();
        let want = one_head_at_a_time(&q, (&k, &v), &slots, shape);
        for unit in [Unit::Avx512, Unit::Avx2, Unit::Baseline] {
            if !unit.available() {
                println!("skip: sparse attention on {unit:?} (this CPU lacks it)");
                continue;
            }
            let mut s = Scratch {
                slots: slots.clone(),
                ..Scratch::default()
            };
            let mut got = vec![f32::NAN; heads * hd];
            vector::on(
                unit,
                #[inline(always)]
                || attend_token(&q, (&k, &v), shape, &mut s, &mut got),
            );
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{unit:?} at {heads}/{kv_heads}x{hd}");
        }
    }
}

/// The sparse attention's arithmetic one head at a time, each step in key order.
fn one_head_at_a_time(
    q: &[f32],
    (k, v): (&[f32], &[f32]),
    slots: &[usize],
    shape: AttnShape,
) -> Vec<f32> {
    let hd = shape.head_dim;
    let group = shape.heads / shape.kv_heads;
    let mut out = vec![0.0f32; q.len()];
    for (h, (qh, oh)) in q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)).enumerate() {
        let off = (h / group) * hd;
        let mut e: Vec<f32> = (slots.iter())
            .map(|&s| dot8(qh, &k[s + off..][..hd]) * shape.scale)
            .collect();
        let m = e.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f32;
        for x in e.iter_mut() {
            *x = exp_neg(*x - m);
            sum += *x;
        }
        for (&s, &p) in slots.iter().zip(&e) {
            for (o, &x) in oh.iter_mut().zip(&v[s + off..][..hd]) {
                *o += p * x;
            }
        }
        oh.iter_mut().for_each(|o| *o *= 1.0 / sum);
    }
    out
}

/// `dot8_each` (the indexers' scores, the sparse attention's) hands out each row's [`dot8`]
/// bits in row order, four rows at a time or one, on every vector unit, at lengths with and
/// without a tail past the chunks of 8.
#[test]
fn dot8_each_gives_each_rows_dot8_on_every_vector_unit() {
    use crate::kernels::cpu::vector::{self, Unit};
    use crate::kernels::dsa::dot8_each;
    let mut seed = 17;
    for (rows, d) in [(1, 8), (4, 8), (6, 20), (9, 64), (8, 3), (13, 128)] {
        let (q, key) = (rnd(rows * d, &mut seed), rnd(d, &mut seed));
        let want: Vec<u32> = (0..rows)
            .map(|r| dot8(&q[r * d..][..d], &key).to_bits())
            .collect();
        for unit in [Unit::Avx512, Unit::Avx2, Unit::Baseline] {
            if !unit.available() {
                println!("skip: dot8_each on {unit:?} (this CPU lacks it)");
                continue;
            }
            let mut got = Vec::new();
            vector::on(
                unit,
                #[inline(always)]
                || dot8_each(&q, &key, |x| got.push(x.to_bits())),
            );
            assert_eq!(got, want, "{unit:?}: {rows} rows of {d}");
        }
    }
}
