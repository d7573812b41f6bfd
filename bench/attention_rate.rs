//! The CPU attention's rate, f32 (what f32 models, and bf16 models on the `avx2` / `f32` GEMM
//! paths, run) or a bf16 path's (a bf16 model's on `amx` / `avx512bf16`): one prompt of `len`
//! tokens in one chunk over the paged cache, GFLOP/s counted as the causal products only (QKᵀ
//! and PV: 4 · hd flops per query head and visible key), best of 4. The sparse attention of
//! DSA / QSA ([`sparse_gflops`]) the same way, counting only its queries and their chosen keys.

use hsx::kernels::Bf16Kernel;
use hsx::kernels::cpu::attention::{AttnShape, Softmax, attention};
use hsx::kernels::cpu::dsa::{Selection, attend_selected};
use hsx::kernels::cpu::kv_cache::KvCache;
use hsx::kernels::plan::{BatchPlan, PlanLimits};
use hsx::kernels::{Batch, SeqChunk};

/// (label, heads, kv heads, head dim): the dense bench model's and an 8B model's attention.
pub const SHAPES: [(&str, usize, usize, usize); 2] =
    [("16/4x64", 16, 4, 64), ("32/8x128", 32, 8, 128)];

/// Gemma 2's `attn_logit_softcapping`, measured on the first shape as well (rows labelled
/// "soft cap 50").
pub const SOFT_CAP: f32 = 50.0;

/// GFLOP/s of `attention` over one prompt of `len` tokens with `heads / kv_heads × hd`, as a
/// model whose weights are multiplied on `bf16` runs it (`None`: an f32 model), its scores
/// soft-capped at `softcap` where given.
pub fn gflops(
    pool: &rayon::ThreadPool,
    len: usize,
    (heads, kv_heads, hd): (usize, usize, usize),
    (bf16, softcap): (Option<Bf16Kernel>, Option<f32>),
) -> f64 {
    let softmax = Softmax {
        softcap,
        ..Softmax::default()
    };
    with_prompt(len, (heads, kv_heads, hd), |q, (kc, vc), plan, shape| {
        let mut out = Vec::new();
        let best = super::best_secs(|| {
            pool.install(|| attention(q, kc, vc, plan, shape, softmax, &mut out, bf16));
        });
        let flops = 4.0 * (hd * heads) as f64 * (len * (len + 1) / 2) as f64;
        flops / best / 1e9
    })
}

/// GFLOP/s of the sparse attention (f32) over one prompt of `len` tokens, where each query
/// from `len / 2` on keeps every other block of 4 keys before it (QSA's blocks; DSA's
/// scattered keys read the same rows) and its own: `len / 4` to `len / 2` keys.
pub fn sparse_gflops(
    pool: &rayon::ThreadPool,
    len: usize,
    (heads, kv_heads, hd): (usize, usize, usize),
) -> f64 {
    let rows: Vec<Vec<u32>> = (0..len as u32)
        .map(|p| match p as usize >= len / 2 {
            true => (0..p).filter(|j| j / 4 % 2 == 0).chain([p]).collect(),
            false => Vec::new(),
        })
        .collect();
    let keys: usize = rows.iter().map(Vec::len).sum();
    let mut sel = Selection::default();
    sel.set(rows);
    with_prompt(len, (heads, kv_heads, hd), |q, kv, plan, shape| {
        let mut out = vec![0.0f32; q.len()];
        let best = super::best_secs(|| {
            pool.install(|| attend_selected(q, kv, plan, shape, &sel, &mut out));
        });
        4.0 * (hd * heads) as f64 * keys as f64 / best / 1e9
    })
}

/// `f(q, (k cache, v cache), plan, shape)` for one prompt of `len` tokens written to a paged
/// cache.
fn with_prompt<R>(
    len: usize,
    (heads, kv_heads, hd): (usize, usize, usize),
    f: impl FnOnce(&[f32], (&[f32], &[f32]), &BatchPlan<'_>, AttnShape) -> R,
) -> R {
    let (qd, kvd, bs) = (heads * hd, kv_heads * hd, 16);
    let nb = len.div_ceil(bs);
    let mut cache = KvCache::new(1, nb + 1, bs, kvd).unwrap();
    // Blocks in reverse order: slots are not one contiguous run, as in a busy cache.
    let table: Vec<u32> = (0..nb as u32).rev().collect();
    let ids = vec![0u32; len];
    let seqs = [SeqChunk {
        context: Vec::new(),
        start: 0,
        len,
        block_table: table,
        sample: false,
        state_slot: None,
    }];
    let lim = PlanLimits {
        vocab: 1,
        max_positions: len,
        num_blocks: nb + 1,
        block_size: bs,
    };
    let batch = Batch {
        token_ids: &ids,
        seqs: &seqs,
    };
    let plan = BatchPlan::new(&batch, &lim).unwrap();
    let val = |i: usize, m: usize| ((i * 7919 % m) as f32 / m as f32 - 0.5) * 0.5;
    let k: Vec<f32> = (0..len * kvd).map(|i| val(i, 1009)).collect();
    let v: Vec<f32> = (0..len * kvd).map(|i| val(i, 997)).collect();
    let q: Vec<f32> = (0..len * qd).map(|i| val(i, 1013)).collect();
    cache.write(0, &plan.slots, &k, &v);
    let shape = AttnShape {
        heads,
        kv_heads,
        head_dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
    };
    f(&q, cache.layer(0), &plan, shape)
}
