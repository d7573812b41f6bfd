//! The device's QSA selection against the rule's own arithmetic (src/kernels/qsa.rs, which
//! the CPU runs: the same prepared q bits, the same keys per token) and the f64 reference,
//! over two steps of two requests on shuffled blocks (a chunk starting mid-request).

use super::super::context::test_gpu;
use super::*;
use crate::kernels::dsa::IndexShape;
use crate::kernels::plan::{BatchPlan, PlanLimits};
use crate::kernels::qsa_reference::QsaInputs;
use crate::kernels::{Batch, SeqChunk};

const BLOCK: usize = 8;
const BLOCKS: usize = 32;
const TOKENS: usize = 70;
/// Blocks kept and keys per block: tokens from position 3 · 4 + 3 = 15 on are sparse.
const KEEP: (usize, usize) = (3, 4);
/// Steps of `(request, start, len)` chunks.
const STEPS: [&[(u32, usize, usize)]; 2] = [&[(0, 0, 30)], &[(1, 0, 45), (0, 30, 40)]];

fn chunk(&(request, start, len): &(u32, usize, usize)) -> SeqChunk {
    let last = TOKENS.div_ceil(BLOCK) as u32 - 1;
    SeqChunk {
        context: Vec::new(),
        start,
        len,
        block_table: (0..(start + len).div_ceil(BLOCK) as u32)
            .map(|b| 2 * (last - b) + request)
            .collect(),
        sample: false,
        state_slot: None,
    }
}

#[test]
fn qsa_selection_follows_the_rule() {
    let Some(gpu) = test_gpu() else { return };
    let (heads, d, rot) = (5, 16, 8);
    let inputs = QsaInputs::new(TOKENS, (heads, d, rot), 21);
    let rule = inputs.rule(KEEP.0, KEEP.1);
    let shape = IndexShape { layers: 2, dim: d };
    // The rule's block keys, every request's the same (the same inputs at each position).
    let mut tmp = Vec::new();
    let block_keys: Vec<Vec<f32>> = (0..TOKENS / KEEP.1)
        .map(|b| {
            let mut key = vec![0.0f32; d];
            rule.block_key(b, |j| &inputs.k[j * d..][..d], &mut key, &mut tmp);
            key
        })
        .collect();
    let mut dsa = DevDsa::new(&gpu, shape, BLOCKS * BLOCK).unwrap();
    let (rope, (qn, kn, _)) = (rule.rope.0, rule.norms);
    let (freqs, dqn, dkn) = (
        gpu.upload(rope.inv_freq()).unwrap(),
        gpu.upload(qn).unwrap(),
        gpu.upload(kn).unwrap(),
    );
    let mut sparse = 0;
    for step in STEPS {
        let seqs: Vec<SeqChunk> = step.iter().map(chunk).collect();
        let t: usize = seqs.iter().map(|s| s.len).sum();
        let ids = vec![1u32; t];
        let batch = Batch {
            token_ids: &ids,
            seqs: &seqs,
        };
        let plan = BatchPlan::new(&batch, &PlanLimits::new(8, 1024, BLOCKS, BLOCK)).unwrap();
        // Every request reads the same inputs at its positions.
        let rows = |x: &[f32], w: usize| -> Vec<f32> {
            (plan.positions.iter())
                .flat_map(|&p| x[p * w..][..w].to_vec())
                .collect()
        };
        let (q0, k) = (rows(&inputs.q, heads * d), rows(&inputs.k, d));
        // The rule, token by token: prepared q rows, then each token's keys (None: all).
        let mut q = q0.clone();
        let want: Vec<Option<Vec<u32>>> = (q.chunks_exact_mut(heads * d).zip(&plan.positions))
            .map(|(qt, &pos)| {
                rule.prepare_q(qt, pos, &mut tmp);
                let scores: Vec<f32> = (block_keys[..(pos + 1) / KEEP.1].iter())
                    .map(|key| rule.score(qt, key))
                    .collect();
                rule.keys(pos, &scores)
            })
            .collect();

        let dev_plan = DevPlan::new(&gpu, &ids, &plan).unwrap();
        let (dq, dk) = (gpu.upload(&q0).unwrap(), gpu.upload(&k).unwrap());
        let args = QsaArgs {
            layer: 1,
            q: dq.ptr(),
            k: dk.ptr(),
            heads,
            rot,
            rope: (freqs.ptr(), rope.scale()),
            norms: (dqn.ptr(), dkn.ptr(), 1e-6),
            blocks: KEEP.0,
            ratio: KEEP.1,
        };
        dsa.qsa_select(&gpu, &dev_plan, &args).unwrap();
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&gpu.download(&dq, q.len()).unwrap()), bits(&q), "q");
        let cap = args.cap();
        assert_eq!(dsa.selected, Some((t, cap)));
        let count = gpu.download(&dsa.count, t).unwrap();
        let chosen = gpu.download(&dsa.sel, t * cap).unwrap();
        for r in 0..t {
            let got = (count[r] > 0).then(|| {
                let keys = &chosen[r * cap..][..count[r] as usize];
                keys.iter().map(|&j| j as u32).collect::<Vec<_>>()
            });
            assert_eq!(got, want[r], "token {r}");
            let pos = plan.positions[r];
            assert_eq!(got, inputs.want_keys(pos, KEEP.0, KEEP.1), "position {pos}");
            sparse += got.is_some() as usize;
        }
    }
    assert!(sparse > 60, "{sparse} sparse tokens");
}
