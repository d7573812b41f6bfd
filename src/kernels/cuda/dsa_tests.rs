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
            context: Vec::new(),
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
    let dq = gpu.upload(&q).unwrap();
    // Every cache / output dtype pair a model runs (f32; a bf16 or f16 model's cache, out in
    // f32 or the cache dtype): within f32 rounding of the reference over the rounded cache,
    // or of the output dtype's rounding.
    use WeightDtype::{Bf16, F16, F32};
    for (dtype, out_dtype) in [
        (F32, F32),
        (Bf16, F32),
        (Bf16, Bf16),
        (F16, F32),
        (F16, F16),
    ] {
        let (kc, vc) = (rounded(&kc, dtype), rounded(&vc, dtype));
        let (dkc, dvc) = (upload_as(gpu, &kc, dtype), upload_as(gpu, &vc, dtype));
        let out = upload_as(gpu, &vec![3.0f32; t * width], out_dtype);
        let cache = (dkc.ptr(), dvc.ptr(), dtype);
        dsa.attend(
            gpu,
            dev_plan,
            (dq.ptr(), width),
            cache,
            shape,
            (out.ptr(), out_dtype),
        )
        .unwrap();
        let got = download_as(gpu, &out, t * width, out_dtype);
        let tol = if out_dtype == F32 { 2e-6 } else { 1e-2 };
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
                let bad = (g as f64 - w).abs() > tol * w.abs().max(1.0);
                assert!(
                    !bad,
                    "{dtype:?} -> {out_dtype:?}: token {r} value {i}: {g} vs {w}"
                );
            }
        }
    }
}

/// `x` rounded to `dtype` (f32 values).
fn rounded(x: &[f32], dtype: WeightDtype) -> Vec<f32> {
    match dtype {
        WeightDtype::Bf16 => x
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_f32())
            .collect(),
        WeightDtype::F16 => x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect(),
        _ => x.to_vec(),
    }
}

/// `x` on the device in `dtype` (exact for values already rounded to it).
fn upload_as(gpu: &Gpu, x: &[f32], dtype: WeightDtype) -> DevBuf<u8> {
    let bytes: Vec<u8> = match dtype {
        WeightDtype::Bf16 => x
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect(),
        WeightDtype::F16 => x
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        _ => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
    };
    gpu.upload(&bytes).unwrap()
}

/// `n` values of `dtype` from the device, as f32.
fn download_as(gpu: &Gpu, x: &DevBuf<u8>, n: usize, dtype: WeightDtype) -> Vec<f32> {
    let size = if dtype == WeightDtype::F32 { 4 } else { 2 };
    let bytes = gpu.download(x, n * size).unwrap();
    bytes
        .chunks_exact(size)
        .map(|b| match dtype {
            WeightDtype::Bf16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f32(),
            WeightDtype::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f32(),
            _ => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        })
        .collect()
}
