//! The device's indexer against the rule's own arithmetic (src/kernels/dsa.rs, which the CPU
//! runs): the same prepared q / k bits and the same keys; the sparse attention against an f64
//! softmax over the chosen keys.

use super::super::context::test_gpu;
use super::*;
use crate::kernels::attention_reference::rnd;
use crate::kernels::dsa::top_keys;
use crate::kernels::dsa_reference::{IndexerInputs, sparse_softmax};
use crate::kernels::plan::{BatchPlan, PlanLimits};
use crate::kernels::{Batch, SeqChunk};

const BLOCK: usize = 8;
const BLOCKS: usize = 32;
/// Two requests, each over its own shuffled blocks.
const LENS: [usize; 2] = [70, 45];

fn with_plan<R>(f: impl FnOnce(&[u32], &BatchPlan<'_>) -> R) -> R {
    let seqs: Vec<SeqChunk> = (LENS.iter().enumerate())
        .map(|(r, &len)| SeqChunk {
            start: 0,
            len,
            block_table: (0..len.div_ceil(BLOCK) as u32)
                .rev()
                .map(|b| 2 * b + r as u32)
                .collect(),
            sample: false,
            state_slot: None,
        })
        .collect();
    let ids = vec![1u32; LENS.iter().sum()];
    let batch = Batch {
        token_ids: &ids,
        seqs: &seqs,
    };
    let plan = BatchPlan::new(&batch, &PlanLimits::new(8, 1024, BLOCKS, BLOCK)).unwrap();
    f(&ids, &plan)
}

#[test]
fn indexer_and_sparse_attention_follow_the_rule() {
    let Some(gpu) = test_gpu() else { return };
    let (heads, d, rot, topk) = (5, 16, 8, 24);
    let t: usize = LENS.iter().sum();
    let inputs = IndexerInputs::new(t, (heads, d, rot), 5);
    let (q0, k0, w) = (&inputs.q, &inputs.k, &inputs.w);
    let shape = IndexShape { layers: 1, dim: d };
    for interleave in [false, true] {
        let ix = inputs.indexer(topk, interleave);
        let (rope, (nw, nb, _)) = (ix.rope.0, ix.norm);
        with_plan(|ids, plan| {
            // The rule, token by token: prepared rows, then each token's keys (None: all).
            let (mut q, mut k, mut tmp) = (q0.clone(), k0.clone(), Vec::new());
            for (r, &pos) in plan.positions.iter().enumerate() {
                let qr = &mut q[r * heads * d..][..heads * d];
                ix.prepare(qr, &mut k[r * d..][..d], pos, &mut tmp);
            }
            let want: Vec<Option<Vec<i32>>> = (0..t)
                .map(|r| {
                    let (p, first) = (plan.positions[r], r - plan.positions[r]);
                    let (qr, wr) = (&q[r * heads * d..][..heads * d], &w[r * heads..][..heads]);
                    let scores: Vec<f32> = (0..=p)
                        .map(|j| ix.score(qr, wr, &k[(first + j) * d..][..d]))
                        .collect();
                    let keys = top_keys(&scores, topk).into_iter().map(|j| j as i32);
                    (p >= topk).then(|| keys.collect())
                })
                .collect();

            let dev_plan = DevPlan::new(&gpu, ids, plan).unwrap();
            let (dq, dk, dw) = (
                gpu.upload(q0).unwrap(),
                gpu.upload(k0).unwrap(),
                gpu.upload(w).unwrap(),
            );
            let (freqs, dnw, dnb) = (
                gpu.upload(rope.inv_freq()).unwrap(),
                gpu.upload(nw).unwrap(),
                gpu.upload(nb).unwrap(),
            );
            let mut dsa = DevDsa::new(&gpu, shape, BLOCKS * BLOCK).unwrap();
            let args = IndexerArgs {
                layer: 0,
                q: dq.ptr(),
                k: dk.ptr(),
                w: dw.ptr(),
                heads,
                rot,
                interleave,
                rope: (freqs.ptr(), rope.scale()),
                norm: (dnw.ptr(), dnb.ptr(), 1e-6),
                scales: (ix.score_scale, ix.weight_scale),
                topk,
            };
            dsa.select(&gpu, &dev_plan, &args).unwrap();
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&gpu.download(&dq, q.len()).unwrap()), bits(&q), "q");
            assert_eq!(bits(&gpu.download(&dk, k.len()).unwrap()), bits(&k), "k");
            let count = gpu.download(&dsa.count, t).unwrap();
            let chosen = gpu.download(&dsa.sel, t * topk).unwrap();
            for (r, want) in want.iter().enumerate() {
                let got = (count[r] > 0).then(|| chosen[r * topk..][..count[r] as usize].to_vec());
                assert_eq!(&got, want, "token {r}, interleave {interleave}");
            }
            assert!(want.iter().any(|w| w.is_some()));
            sparse_attention_matches(&gpu, plan, &dev_plan, &dsa, &want);
        });
    }
}

/// The device's sparse attention over an f32 cache against an f64 softmax over each token's
/// chosen keys (GQA, shuffled slots), rows without a selection untouched.
fn sparse_attention_matches(
    gpu: &Gpu,
    plan: &BatchPlan<'_>,
    dev_plan: &DevPlan,
    dsa: &DevDsa,
    chosen: &[Option<Vec<i32>>],
) {
    let shape = AttnShape::new(4, 2, 16);
    let (t, hd, kv_dim, width) = (plan.num_tokens(), 16, 32, 64);
    let mut seed = 9u64;
    let q = rnd(t * width, &mut seed);
    let (kc, vc) = (
        rnd(BLOCKS * BLOCK * kv_dim, &mut seed),
        rnd(BLOCKS * BLOCK * kv_dim, &mut seed),
    );
    let (dq, dkc, dvc) = (
        gpu.upload(&q).unwrap(),
        gpu.upload(&kc).unwrap(),
        gpu.upload(&vc).unwrap(),
    );
    let out = gpu.upload(&vec![3.0f32; t * width]).unwrap();
    let cache = (dkc.ptr(), dvc.ptr(), WeightDtype::F32);
    let o = (out.ptr(), WeightDtype::F32);
    dsa.attend(gpu, dev_plan, (dq.ptr(), width), cache, shape, o)
        .unwrap();
    let got = gpu.download(&out, t * width).unwrap();
    for (r, keys) in chosen.iter().enumerate() {
        let row = &got[r * width..][..width];
        let Some(keys) = keys else {
            assert!(row.iter().all(|&x| x == 3.0), "row {r} was written");
            continue;
        };
        let table = plan.tables[plan.seq_of[r]];
        let at = |x: &[f32], j: i32, kh: usize| {
            let slot = table[j as usize / BLOCK] as usize * BLOCK + j as usize % BLOCK;
            x[slot * kv_dim + kh * hd..][..hd].to_vec()
        };
        let q_r = &q[r * width..][..width];
        let want = sparse_softmax(q_r, keys, shape, |j, kh| (at(&kc, j, kh), at(&vc, j, kh)));
        for (i, (&g, w)) in row.iter().zip(&want).enumerate() {
            assert!(
                (g as f64 - w).abs() < 2e-6,
                "token {r} value {i}: {g} vs {w}"
            );
        }
    }
}
