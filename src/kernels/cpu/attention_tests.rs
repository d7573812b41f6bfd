//! The CPU attention against a naive f64 reference, chunking / CPU-path invariance.

use super::*;
use crate::kernels::attention_reference::{Variant, naive, rnd};
use crate::kernels::cpu::kv_cache::KvCache;
use crate::kernels::plan::PlanLimits;
use crate::kernels::{Batch, SeqChunk};

fn plan_of<'a>(ids: &'a [u32], seqs: &'a [SeqChunk], lim: &PlanLimits) -> BatchPlan<'a> {
    let batch = Batch {
        token_ids: ids,
        seqs,
    };
    BatchPlan::new(&batch, lim).unwrap()
}

#[test]
fn exp_neg_is_accurate() {
    for i in 0..1990 {
        let x = -(i as f32) * 0.0437;
        let got = exp_neg(x) as f64;
        let want = (x as f64).exp();
        assert!(((got - want) / want).abs() < 3e-7, "x={x}: {got} vs {want}");
    }
}

/// Which kernel [`run`] calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// The f32 task on one vector unit (`Baseline`: the portable task), called per task as
    /// `attention` calls it.
    F32(Unit),
    /// What `attention` picks for an f32 model (the widest f32 kernel the CPU has).
    Fast,
    /// The AMX tiles (bf16 models), where the CPU has them.
    Amx,
    /// The `vdpbf16ps` engine over the same packed operands, where the CPU has AVX512-BF16.
    Dpbf16,
}

impl Path {
    /// The bf16 GEMM path whose attention this is (`None`: the f32 kernels).
    fn kernel(self) -> Option<Bf16Kernel> {
        match self {
            Path::Amx => Some(Bf16Kernel::Amx),
            Path::Dpbf16 => Some(Bf16Kernel::Avx512bf16),
            Path::F32(_) | Path::Fast => None,
        }
    }

    /// Whether this CPU runs the path at head dim `hd` (a skip line naming it where not).
    fn runs(self, hd: usize) -> bool {
        if let Path::F32(unit) = self {
            let runs = f32_runs(unit, hd);
            if !runs {
                println!("skip: the {unit:?} f32 attention at head dim {hd} (this CPU lacks it)");
            }
            return runs;
        }
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        let runs = self
            .kernel()
            .is_none_or(|k| super::amx::engine(k, hd).is_some());
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        let runs = self.kernel().is_none();
        if !runs {
            let why = "this CPU lacks it, or the head dim is not a multiple of 32";
            println!("skip: the {self:?} bf16 attention at head dim {hd} ({why})");
        }
        runs
    }
}

/// Runs `attention` for one sequence of `len` tokens split into `chunks` (each a separate
/// call, as chunked prefill does) and returns the output rows in order.
#[allow(clippy::too_many_arguments)]
fn run(
    shape: AttnShape,
    softmax: Softmax<'_>,
    len: usize,
    chunks: &[usize],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    path: Path,
) -> Vec<f32> {
    let (hd, qd, kvd) = (
        shape.head_dim,
        shape.heads * shape.head_dim,
        shape.kv_heads * shape.head_dim,
    );
    let bs = 4;
    let mut cache = KvCache::new(1, len.div_ceil(bs) + 3, bs, kvd).unwrap();
    // A scrambled block table.
    let nb = len.div_ceil(bs);
    let table: Vec<u32> = (0..nb as u32)
        .map(|b| (b * 5 + 2) % (nb as u32 + 3))
        .collect();
    let lim = PlanLimits {
        vocab: 10,
        max_positions: 100_000,
        num_blocks: nb + 3,
        block_size: bs,
    };
    let mut all = Vec::new();
    let mut start = 0;
    for &n in chunks {
        let ids = vec![0u32; n];
        let seqs = [SeqChunk {
            context: Vec::new(),
            start,
            len: n,
            block_table: table.clone(),
            sample: false,
            state_slot: None,
        }];
        let plan = plan_of(&ids, &seqs, &lim);
        cache.write(
            0,
            &plan.slots,
            &k[start * kvd..(start + n) * kvd],
            &v[start * kvd..(start + n) * kvd],
        );
        let (kc, vc) = cache.layer(0);
        let qs = &q[start * qd..(start + n) * qd];
        let mut out = Vec::new();
        if let Path::F32(unit) = path {
            out.resize(qs.len(), 0.0);
            let group = shape.heads / shape.kv_heads;
            let ctx = Ctx {
                q: qs,
                kc,
                vc,
                plan: &plan,
                shape,
                group,
                softmax,
                out: OutPtr(out.as_mut_ptr()),
            };
            let mut s = Scratch::default();
            let tile = (TILE_ROWS / group).max(1);
            for task in plan_tasks(&plan, shape.kv_heads, tile, softmax.dense_below) {
                f32_task(&ctx, &task, &mut s, unit);
            }
        } else {
            attention(qs, kc, vc, &plan, shape, softmax, &mut out, path.kernel());
        }
        all.extend_from_slice(&out);
        start += n;
    }
    let _ = hd;
    all
}

#[test]
fn matches_naive_and_is_invariant_to_chunking_and_cpu() {
    check_variant(3, |_| Softmax::default());
}

/// DeepSeek Sparse Attention's dense pass (`dense_below`): the rows of the queries at
/// positions below it as without it, bit for bit, on every path here and in every chunking;
/// the others not written (the sparse pass writes them).
#[test]
fn dense_below_computes_only_the_rows_below_it() {
    let (heads, kv_heads, hd, len) = (8, 2, 32, 70);
    let (shape, q, k, v) = inputs((heads, kv_heads, hd), len, &mut 41);
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let units = [Unit::Baseline, Unit::Avx2, Unit::Avx512].map(Path::F32);
    for path in [Path::Fast, Path::Amx, Path::Dpbf16]
        .into_iter()
        .chain(units)
    {
        if !path.runs(hd) {
            continue;
        }
        let all = run(shape, Softmax::default(), len, &[len], &q, &k, &v, path);
        for below in [1, 23, 64, 70, 500] {
            let sm = Softmax {
                dense_below: Some(below),
                ..Softmax::default()
            };
            for chunks in [vec![len], vec![5, len - 5], vec![17, 30, 23]] {
                let got = run(shape, sm, len, &chunks, &q, &k, &v, path);
                let cut = below.min(len) * heads * hd;
                let what = format!("{path:?} below {below} chunks {chunks:?}");
                assert_eq!(bits(&got[..cut]), bits(&all[..cut]), "{what}");
                assert!(got[cut..].iter().all(|&x| x == 0.0), "{what}: rows past it");
            }
        }
    }
}

/// gpt-oss's softmax: a sliding window (shorter and longer than the chunks, 1, and wider than
/// the sequence) and per-head sinks, alone and together.
#[test]
fn window_and_sinks_match_naive_and_are_invariant() {
    let sinks: Vec<f32> = (0..40).map(|h| (h as f32 * 0.77).sin() * 3.0).collect();
    for (seed, window, with_sinks) in [
        (5, Some(7), false),
        (6, None, true),
        (7, Some(5), true),
        (8, Some(1), true),
        (9, Some(64), true),
        (10, Some(1000), false),
    ] {
        check_variant(seed, |heads| Softmax {
            window,
            sinks: with_sinks.then(|| &sinks[..heads]),
            ..Softmax::default()
        });
    }
}

/// Llama-4's softmax: chunks of keys (shorter and longer than the prefill pieces, 1, wider than
/// the sequence) and the query temperature (its floor crossed inside the sequences), alone and
/// together.
#[test]
fn chunks_and_temperature_match_naive_and_are_invariant() {
    let warm = |floor_scale| QueryTemperature {
        floor_scale,
        attn_scale: 0.1,
        offset: 1.0,
    };
    for (seed, chunk, temperature) in [
        (31, Some(7), None),
        (32, Some(16), Some(warm(4.0))),
        (33, None, Some(warm(8.0))),
        (34, Some(1), None),
        (35, Some(1000), Some(warm(1.0))),
    ] {
        check_variant(seed, |_| Softmax {
            chunk,
            temperature,
            ..Softmax::default()
        });
    }
}

/// Gemma-2's soft cap on the scores (caps near and far below the scores' range, so tanh is
/// both nearly linear and saturated), alone, with its sliding window, with sinks.
#[test]
fn soft_cap_matches_naive_and_is_invariant() {
    let sinks: Vec<f32> = (0..40).map(|h| (h as f32 * 0.77).sin() * 3.0).collect();
    for (seed, softcap, window, with_sinks) in [
        (51, 50.0, None, false),
        (52, 0.5, None, false),
        (53, 2.0, Some(6), false),
        (54, 1.0, None, true),
    ] {
        check_variant(seed, |heads| Softmax {
            softcap: Some(softcap),
            window,
            sinks: with_sinks.then(|| &sinks[..heads]),
            ..Softmax::default()
        });
    }
}

fn variant(sm: &Softmax<'_>) -> Variant {
    Variant {
        window: sm.window,
        chunk: sm.chunk,
        temperature: sm.temperature,
        softcap: sm.softcap,
    }
}

/// The shape `(heads, kv_heads, head_dim)` (scale `hd^-0.5`) and random q, k, v of `len`
/// tokens.
fn inputs(
    (heads, kv_heads, hd): (usize, usize, usize),
    len: usize,
    seed: &mut u64,
) -> (AttnShape, Vec<f32>, Vec<f32>, Vec<f32>) {
    let shape = AttnShape {
        heads,
        kv_heads,
        head_dim: hd,
        scale: (hd as f64).powf(-0.5) as f32,
    };
    let q = rnd(len * heads * hd, seed);
    let k = rnd(len * kv_heads * hd, seed);
    let v = rnd(len * kv_heads * hd, seed);
    (shape, q, k, v)
}

/// The kernel against [`naive`] (1e-5) and itself across chunkings and CPU paths (bits).
fn check_variant<'a>(mut seed: u64, softmax: impl Fn(usize) -> Softmax<'a>) {
    for (heads, kv_heads, hd, len) in [
        (4, 2, 16, 37),
        (16, 4, 64, 70),
        (8, 2, 24, 21),
        (3, 3, 5, 9),
        (8, 2, 64, 300),
        (40, 1, 8, 20),
    ] {
        let (shape, q, k, v) = inputs((heads, kv_heads, hd), len, &mut seed);
        let sm = softmax(heads);
        let want = naive(shape, variant(&sm), sm.sinks, len, (&q, &k, &v));
        let whole = run(shape, sm, len, &[len], &q, &k, &v, Path::Fast);
        for (a, b) in whole.iter().zip(&want) {
            assert!((*a as f64 - b).abs() < 1e-5, "{a} vs {b}");
        }
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        for chunks in [vec![len / 3, len - len / 3], vec![5, len - 5], vec![1; len]] {
            let got = run(shape, sm, len, &chunks, &q, &k, &v, Path::Fast);
            assert_eq!(
                bits(&got),
                bits(&whole),
                "{heads}/{kv_heads}/{hd} chunks {chunks:?}"
            );
        }
        for unit in [Unit::Baseline, Unit::Avx2, Unit::Avx512] {
            if !Path::F32(unit).runs(hd) {
                continue;
            }
            for chunks in [vec![len], vec![5, len - 5]] {
                let got = run(shape, sm, len, &chunks, &q, &k, &v, Path::F32(unit));
                assert_eq!(
                    bits(&got),
                    bits(&whole),
                    "{unit:?} vs fast {heads}/{kv_heads}/{hd} chunks {chunks:?}"
                );
            }
        }
    }
}

/// The bf16 tasks (AMX tiles, `vdpbf16ps`): against [`naive`] within bf16 rounding of q, k,
/// v and the probabilities, and bit-identical across chunkings, with and without window,
/// sinks and query temperature.
#[test]
fn bf16_tiles_match_naive_and_are_invariant_to_chunking() {
    for path in [Path::Amx, Path::Dpbf16] {
        if path.runs(32) {
            bf16_tiles_case(path);
        }
    }
}

fn bf16_tiles_case(path: Path) {
    let sinks: Vec<f32> = (0..64).map(|h| (h as f32 * 0.77).sin() * 3.0).collect();
    let mut seed = 11;
    let mut worst = 0.0f64;
    // Mistral's temperature (offset 0), its floor crossed inside the sequence; Llama-4's.
    let warm = |floor_scale, offset| {
        Some(QueryTemperature {
            floor_scale,
            attn_scale: 0.5,
            offset,
        })
    };
    for (heads, kv_heads, hd, len, window, with_sinks, temperature, softcap) in [
        (16, 4, 64, 70, None, false, None),
        (8, 2, 64, 300, None, false, warm(64.0, 0.0)),
        (4, 4, 32, 37, Some(7), true, None),
        (2, 1, 128, 90, None, true, warm(16.0, 1.0)),
        (8, 1, 64, 130, Some(40), false, None),
        (64, 64, 32, 20, None, false, None),
        (12, 4, 96, 75, Some(8), false, warm(30.0, 0.0)),
        // 80 query heads per kv head: tasks of 80 rows, more than 4 row tiles.
        (80, 1, 32, 9, None, false, None),
    ]
    .into_iter()
    .map(|(h, kvh, hd, len, window, sinks, temp)| (h, kvh, hd, len, window, sinks, temp, None))
    // Gemma-2's soft cap, alone and with its window.
    .chain([
        (8, 2, 64, 100, None, false, None, Some(1.0)),
        (4, 2, 32, 50, Some(9), false, None, Some(0.5)),
    ]) {
        let (shape, q, k, v) = inputs((heads, kv_heads, hd), len, &mut seed);
        let sm = Softmax {
            window,
            sinks: with_sinks.then(|| &sinks[..heads]),
            temperature,
            softcap,
            ..Softmax::default()
        };
        let want = naive(shape, variant(&sm), sm.sinks, len, (&q, &k, &v));
        let whole = run(shape, sm, len, &[len], &q, &k, &v, path);
        for (a, b) in whole.iter().zip(&want) {
            worst = worst.max((*a as f64 - b).abs());
            assert!(
                (*a as f64 - b).abs() < 4e-2,
                "{path:?} {heads}/{kv_heads}/{hd}: {a} vs {b}"
            );
        }
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        for chunks in [vec![len / 3, len - len / 3], vec![5, len - 5], vec![1; len]] {
            let got = run(shape, sm, len, &chunks, &q, &k, &v, path);
            assert_eq!(
                bits(&got),
                bits(&whole),
                "{path:?} {heads}/{kv_heads}/{hd} chunks {chunks:?}"
            );
        }
    }
    println!("{path:?} bf16 attention: worst |error| vs f64 {worst:.2e}");
}

/// AMX chains: consecutive tiles of one sequence and kv head, at most `AMX_CHAIN`, never across
/// sequences; one task per chain with a window.
#[test]
fn amx_chains_join_tiles_of_one_sequence_only() {
    let lim = PlanLimits {
        vocab: 10,
        max_positions: 100_000,
        num_blocks: 200,
        block_size: 4,
    };
    let seq = |start, len, first_block: u32| SeqChunk {
        context: Vec::new(),
        start,
        len,
        block_table: (first_block..first_block + 100).collect(),
        sample: false,
        state_slot: None,
    };
    // Sequence 0: positions 3..43 (40 tokens), sequence 1: positions 0..7.
    let seqs = [seq(3, 40, 0), seq(0, 7, 100)];
    let ids = vec![0u32; 47];
    let plan = plan_of(&ids, &seqs, &lim);
    let spans = |chains: &[Vec<Task>]| -> Vec<(usize, Vec<(usize, usize)>)> {
        chains
            .iter()
            .map(|c| (c[0].kv_head, c.iter().map(|t| (t.t0, t.n)).collect()))
            .collect()
    };
    // Tiles of 4 tokens: sequence 0 has 10 tiles (chains of 8 and 2), sequence 1 has 2.
    let chains = amx_chains(&plan, 2, 4, false, None);
    let want_runs: Vec<Vec<(usize, usize)>> = vec![
        (0..8).map(|i| (4 * i, 4)).collect(),
        vec![(32, 4), (36, 4)],
        vec![(40, 4), (44, 3)],
    ];
    let want: Vec<_> = want_runs
        .iter()
        .flat_map(|run| (0..2).map(move |h| (h, run.clone())))
        .collect();
    assert_eq!(spans(&chains), want);
    // With a window every task is its own chain.
    let windowed = amx_chains(&plan, 2, 4, true, None);
    assert_eq!(windowed.len(), 12 * 2);
    assert!(windowed.iter().all(|c| c.len() == 1));
}

/// A NaN value at position `p` reaches only the rows that see key `p` (positions `p..`, and
/// with a window only `p..p + w`): each path skips a key a row does not see rather than adding
/// `0 · v`, also in tiles that mix rows on both sides. The other rows keep their bits.
/// On AMX a tile product adds a whole 32-key step for 16 rows, so `0 · NaN` reaches the
/// task's rows that do not see the key (`attention_amx.rs`): there only the rows that see it
/// are checked (NaN).
#[test]
fn a_nan_value_reaches_only_the_rows_that_see_it() {
    let mut seed = 23;
    let paths = [
        Path::F32(Unit::Baseline),
        Path::F32(Unit::Avx2),
        Path::F32(Unit::Avx512),
        Path::Amx,
        Path::Dpbf16,
    ];
    for (heads, kv_heads, hd, len, window) in [
        (16, 4, 64, 70, None),
        (8, 2, 24, 41, Some(9)),
        (40, 1, 8, 30, None),
        (2, 1, 128, 90, Some(33)),
        // The NaN key odd: the row before it ends on the low half of its pair.
        (8, 2, 64, 72, None),
    ] {
        let (shape, q, k, v) = inputs((heads, kv_heads, hd), len, &mut seed);
        let nan_at = len / 2 + 1;
        let mut bad = v.clone();
        // Key nan_at of the last kv head: its group of query heads only.
        let kvd = kv_heads * hd;
        bad[nan_at * kvd + (kv_heads - 1) * hd..][..hd].fill(f32::NAN);
        let sm = Softmax {
            window,
            ..Softmax::default()
        };
        let group = heads / kv_heads;
        for path in paths {
            if !path.runs(hd) {
                continue;
            }
            let clean = run(shape, sm, len, &[len], &q, &k, &v, path);
            for chunks in [vec![len], vec![7, len - 7]] {
                let got = run(shape, sm, len, &chunks, &q, &k, &bad, path);
                for t in 0..len {
                    let sees = t >= nan_at && window.is_none_or(|w| t < nan_at + w);
                    for h in 0..heads {
                        let row = (t * heads + h) * hd..(t * heads + h + 1) * hd;
                        let hit = sees && h / group == kv_heads - 1;
                        let (g, c) = (&got[row.clone()], &clean[row]);
                        if hit {
                            assert!(g.iter().all(|x| x.is_nan()), "{path:?} t {t} h {h}");
                        } else if path != Path::Amx {
                            let same = g.iter().zip(c).all(|(a, b)| a.to_bits() == b.to_bits());
                            assert!(same, "{path:?} {heads}/{kv_heads}/{hd} t {t} h {h}");
                        }
                    }
                }
            }
        }
    }
}
