//! The two attention kernels over a bf16 cache, directly: the tensor-core one (`attn_mma_*`)
//! and the CUDA-core one (`attention_bf16_*`) against an f64 reference at every head dim the
//! tensor-core kernel is built for (16, 32, 64, 128, 256: the fixtures', the bench models' and
//! Qwen3.5's, whose 256 splits a row tile's output over two warps):
//! prompts over several key blocks and tiles, GQA, two sequences in one batch, a chunk that
//! starts inside a key block, and a row's bits independent of the batch. Heads over 256 (the
//! wide CUDA-core kernel: Gemma 4's 512) likewise, against the reference.
//! Runs on the emulator (`cuda-emu`) or a GPU; skipped, saying why, where neither is there.
//! Also which layers take the tensor-core kernel (no device needed).

use super::super::context::test_gpu;
use super::*;
use crate::kernels::SeqChunk;
use crate::kernels::attention_reference::{Variant, naive, rnd};
use crate::kernels::device::QueryTemperature;
use crate::kernels::plan::PlanLimits;
use crate::kernels::{BackendError, Batch};

const BLOCK: usize = 16;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;

struct Setup {
    hd: usize,
    /// The softmax's window, chunks and query temperature.
    variant: Variant,
    /// f32 rows `[q | k | v]` of every position of sequences A and B.
    rows: [Vec<f32>; 2],
    /// [`naive`] attention of each sequence over its K and V rounded to bf16 (as cached):
    /// `[len, HEADS, hd]`.
    want: [Vec<f64>; 2],
}

impl Setup {
    fn new(hd: usize, lens: [usize; 2], seed: u64) -> Self {
        Self::with_variant(hd, lens, seed, Variant::default())
    }

    fn with_variant(hd: usize, lens: [usize; 2], mut seed: u64, variant: Variant) -> Self {
        let width = (HEADS + 2 * KV_HEADS) * hd;
        let rows = lens.map(|n| rnd(n * width, &mut seed));
        let shape = AttnShape {
            heads: HEADS,
            kv_heads: KV_HEADS,
            head_dim: hd,
            scale: (hd as f64).powf(-0.5) as f32,
        };
        let bf16 = |x: &f32| half::bf16::from_f32(*x).to_f32();
        let want = [0, 1].map(|s| {
            let cols = |t: usize, from: usize, n: usize| &rows[s][t * width + from..][..n];
            let (qn, kvn) = (HEADS * hd, KV_HEADS * hd);
            let mut q = Vec::new();
            let (mut k, mut v) = (Vec::new(), Vec::new());
            for t in 0..lens[s] {
                q.extend_from_slice(cols(t, 0, qn));
                k.extend(cols(t, qn, kvn).iter().map(bf16));
                v.extend(cols(t, qn + kvn, kvn).iter().map(bf16));
            }
            naive(shape, variant, None, lens[s], (&q, &k, &v))
        });
        Self {
            hd,
            variant,
            rows,
            want,
        }
    }

    fn width(&self) -> usize {
        (HEADS + 2 * KV_HEADS) * self.hd
    }

    /// Output rows (f32, `[tokens, HEADS * hd]`) of a batch of chunks `(seq, start, len)`.
    fn run(&self, gpu: &Gpu, kv: &DevKvCache, chunks: &[(usize, usize, usize)]) -> Vec<f32> {
        self.run_below(gpu, kv, chunks, 0)
    }

    /// [`Setup::run`] with the softmax's `dense_below` (rows left unwritten are 0).
    fn run_below(
        &self,
        gpu: &Gpu,
        kv: &DevKvCache,
        chunks: &[(usize, usize, usize)],
        dense_below: usize,
    ) -> Vec<f32> {
        let tables: Vec<Vec<u32>> = (0..2)
            .map(|s| (0..16).map(|b| (s * 16 + b) as u32).collect())
            .collect();
        let seqs: Vec<SeqChunk> = chunks
            .iter()
            .map(|&(s, start, len)| SeqChunk {
                context: Vec::new(),
                start,
                len,
                block_table: tables[s].clone(),
                sample: false,
                state_slot: None,
            })
            .collect();
        let w = self.width();
        let mut rows = Vec::new();
        for &(s, start, len) in chunks {
            rows.extend_from_slice(&self.rows[s][start * w..(start + len) * w]);
        }
        let ids = vec![0u32; rows.len() / w];
        let batch = Batch {
            token_ids: &ids,
            seqs: &seqs,
        };
        let plan = BatchPlan::new(&batch, &PlanLimits::new(1, 4096, 32, BLOCK)).unwrap();
        let dev = DevPlan::new(gpu, &ids, &plan).unwrap();
        let qkv = gpu.upload(&rows).unwrap();
        let out = gpu.zeros::<f32>(ids.len() * HEADS * self.hd).unwrap();
        let qkv_rows = QkvRows {
            base: qkv.ptr(),
            width: w,
            k_col: HEADS * self.hd,
            heads: HEADS,
            kv_heads: KV_HEADS,
            head_dim: self.hd,
            shared_kv: false,
        };
        let softmax = DevSoftmax {
            shape: AttnShape {
                heads: HEADS,
                kv_heads: KV_HEADS,
                head_dim: self.hd,
                scale: (self.hd as f64).powf(-0.5) as f32,
            },
            sinks: 0,
            window: self.variant.window.unwrap_or(0),
            chunk: self.variant.chunk.unwrap_or(0),
            temperature: self.variant.temperature,
            dense_below,
            softcap: self.variant.softcap.unwrap_or(0.0),
        };
        kv.attend(
            gpu,
            0,
            qkv_rows,
            (None, None),
            None,
            softmax,
            (out.ptr(), WeightDtype::F32),
            &dev,
        )
        .unwrap();
        gpu.download(&out, ids.len() * HEADS * self.hd).unwrap()
    }
}

/// Largest |got - want| over the largest |want| of the rows of `chunk` (at `offset` in `out`);
/// infinite where an output is not finite (`f64::max` would pass over a NaN).
fn err_of(s: &Setup, out: &[f32], offset: usize, (seq, start, len): (usize, usize, usize)) -> f64 {
    let hd = s.hd;
    let (mut worst, mut top) = (0f64, 0f64);
    for i in 0..len {
        for h in 0..HEADS {
            let want = &s.want[seq][((start + i) * HEADS + h) * hd..][..hd];
            let got = &out[(offset + i) * HEADS * hd + h * hd..][..hd];
            for d in 0..hd {
                if !got[d].is_finite() {
                    return f64::INFINITY;
                }
                worst = worst.max((got[d] as f64 - want[d]).abs());
                top = top.max(want[d].abs());
            }
        }
    }
    worst / top
}

#[test]
fn both_kernels_match_the_reference_and_rows_do_not_depend_on_the_batch() {
    let Some(gpu) = test_gpu() else { return };
    if gpu.info.compute_capability < (8, 0) {
        eprintln!(
            "skipping: sm_{}{} has no bf16 mma",
            gpu.info.compute_capability.0, gpu.info.compute_capability.1
        );
        return;
    }
    for hd in [16, 32, 64, 128, 256] {
        both_kernels_match(&gpu, &Setup::new(hd, [230, 90], hd as u64));
    }
}

/// DeepSeek Sparse Attention's dense pass (`dense_below`) on both kernels: the rows of the
/// queries at positions below it the same bits as without it, the others not written (the
/// sparse pass writes them); two sequences in one batch, the cut inside and between tiles.
#[test]
fn dense_below_computes_only_the_rows_below_it() {
    let Some(gpu) = test_gpu() else { return };
    if gpu.info.compute_capability < (8, 0) {
        eprintln!("skipping: no bf16 mma on this GPU");
        return;
    }
    let (hd, chunks) = (64, [(0, 100, 130), (1, 0, 90)]);
    let setup = Setup::new(hd, [230, 90], 77);
    let positions: Vec<usize> = (100..230).chain(0..90).collect();
    for tensor_cores in [true, false] {
        let mut kv = DevKvCache::new(&gpu, kv_shape(KV_HEADS * hd), WeightDtype::Bf16).unwrap();
        kv.tensor_cores = tensor_cores;
        let all = setup.run(&gpu, &kv, &chunks);
        for below in [1, 64, 100, 150, 164, 1000] {
            let got = setup.run_below(&gpu, &kv, &chunks, below);
            let rows = got
                .chunks_exact(HEADS * hd)
                .zip(all.chunks_exact(HEADS * hd));
            for ((g, a), &p) in rows.zip(&positions) {
                let what = format!("tensor cores {tensor_cores}, below {below}, position {p}");
                match p < below {
                    true => assert!(
                        g.iter().zip(a).all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{what}"
                    ),
                    false => assert!(g.iter().all(|&x| x == 0.0), "{what}: written"),
                }
            }
        }
    }
}

/// Heads over 256 (Gemma 4's full layers: 512; and one not a multiple of 64) on the wide
/// CUDA-core kernel, key blocks of 2: the reference within 1e-5, a row's bits independent of
/// the batch it is in.
#[test]
fn wide_heads_match_the_reference() {
    let Some(gpu) = test_gpu() else { return };
    for hd in [288, 512] {
        let setup = Setup::new(hd, [230, 90], hd as u64 + 11);
        cuda_core_kernel_matches(&gpu, &setup, "wide kernel");
    }
}

/// The CUDA-core kernel over `setup` (a bf16 cache; heads no tensor-core kernel is taken for,
/// or a variant it does not take): A whole within 1e-5 of the reference, then A from 100 on
/// beside all of B, A's rows the same bits as in the whole run.
fn cuda_core_kernel_matches(gpu: &Gpu, setup: &Setup, what: &str) {
    let hd = setup.hd;
    let kv = DevKvCache::new(gpu, kv_shape(KV_HEADS * hd), WeightDtype::Bf16).unwrap();
    let whole = setup.run(gpu, &kv, &[(0, 0, 230)]);
    let e = err_of(setup, &whole, 0, (0, 0, 230));
    eprintln!("hd {hd}, {what}: max-rel {e:.2e}");
    assert!(e <= 1e-5, "hd {hd}, {what}: {e:e}");
    let both = setup.run(gpu, &kv, &[(0, 100, 130), (1, 0, 90)]);
    let same = (both[..130 * HEADS * hd].iter())
        .zip(&whole[100 * HEADS * hd..])
        .all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(same, "hd {hd}, {what}: rows depend on the chunking");
    assert!(err_of(setup, &both, 130, (1, 0, 90)) <= 1e-5);
}

/// Ministral 3's / Mistral 4's query temperature (offset 0) crossing its floor twice inside A
/// and once inside B, on both kernels (the tensor-core one scales q in f32 before rounding it).
#[test]
fn both_kernels_apply_the_query_temperature() {
    let Some(gpu) = test_gpu() else { return };
    if gpu.info.compute_capability < (8, 0) {
        return eprintln!("skipping: no bf16 mma on this GPU");
    }
    let mistral = QueryTemperature {
        floor_scale: 64.0,
        attn_scale: 0.5,
        offset: 0.0,
    };
    let variant = Variant {
        temperature: Some(mistral),
        ..Variant::default()
    };
    for hd in [64, 128] {
        both_kernels_match(
            &gpu,
            &Setup::with_variant(hd, [230, 90], hd as u64 + 3, variant),
        );
    }
}

/// Gemma-2's soft cap on both kernels: a cap inside the scores' range (tanh bends) and one far
/// below it (saturated).
#[test]
fn both_kernels_apply_the_soft_cap() {
    let Some(gpu) = test_gpu() else { return };
    if gpu.info.compute_capability < (8, 0) {
        return eprintln!("skipping: no bf16 mma on this GPU");
    }
    for (hd, cap) in [(64, 2.0), (128, 0.5)] {
        let variant = Variant {
            softcap: Some(cap),
            ..Variant::default()
        };
        both_kernels_match(
            &gpu,
            &Setup::with_variant(hd, [230, 90], hd as u64 + 5, variant),
        );
    }
}

/// Both kernels over `setup` against its reference (tensor cores within 1.5e-2, the CUDA-core
/// kernel within 1e-5), a row's bits independent of the batch it is in.
fn both_kernels_match(gpu: &Gpu, setup: &Setup) {
    let hd = setup.hd;
    let new_cache = |tensor_cores: bool| {
        let mut kv = DevKvCache::new(gpu, kv_shape(KV_HEADS * hd), WeightDtype::Bf16).unwrap();
        kv.tensor_cores = tensor_cores;
        kv
    };
    for (tc, tol) in [(true, 1.5e-2), (false, 1e-5)] {
        let kv = new_cache(tc);
        // A's first 100 positions, then A's 100..230 (from inside a key block) with all of B.
        setup.run(gpu, &kv, &[(0, 0, 100)]);
        let both = setup.run(gpu, &kv, &[(0, 100, 130), (1, 0, 90)]);
        let e_a = err_of(setup, &both, 0, (0, 100, 130));
        let e_b = err_of(setup, &both, 130, (1, 0, 90));
        eprintln!("hd {hd}, tensor cores {tc}: max-rel {e_a:.2e} (A 100..230), {e_b:.2e} (B)");
        assert!(
            e_a <= tol && e_b <= tol,
            "hd {hd}, tensor cores {tc}: {e_a:e} / {e_b:e}"
        );
        // A's rows again, alone in their batch: the same bits.
        let alone = setup.run(gpu, &kv, &[(0, 100, 130)]);
        let n = 130 * HEADS * hd;
        let same = alone
            .iter()
            .zip(&both[..n])
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "hd {hd}, tensor cores {tc}: rows depend on the batch");
    }
}

/// Llama-4's softmax on the CUDA-core kernel (the tensor-core one is not taken for chunks): chunks
/// of keys shorter than a key block and longer than one, the query temperature crossing its
/// floor inside the prompt; a chunk of A that starts inside a key block and a chunk of keys.
#[test]
fn chunks_and_temperature_match_the_reference() {
    let Some(gpu) = test_gpu() else { return };
    let warm = QueryTemperature {
        floor_scale: 16.0,
        attn_scale: 0.1,
        offset: 1.0,
    };
    for (hd, chunk, temperature) in [(32, Some(7), None), (64, Some(40), Some(warm))] {
        let variant = Variant {
            chunk,
            temperature,
            ..Variant::default()
        };
        let setup = Setup::with_variant(hd, [230, 90], hd as u64 + 7, variant);
        let what = format!("chunk {chunk:?}, temperature {temperature:?}");
        cuda_core_kernel_matches(&gpu, &setup, &what);
    }
}

#[test]
fn mma_tiles_are_runs_of_one_sequence() {
    // The tiles the tensor-core kernel gets are runs of consecutive positions of one sequence.
    let tables = [vec![0u32, 1, 2, 3, 4], vec![5u32]];
    let seqs = [
        SeqChunk {
            context: Vec::new(),
            start: 3,
            len: 70,
            block_table: tables[0].clone(),
            sample: false,
            state_slot: None,
        },
        SeqChunk {
            context: Vec::new(),
            start: 0,
            len: 5,
            block_table: tables[1].clone(),
            sample: false,
            state_slot: None,
        },
    ];
    let ids = vec![0u32; 75];
    let plan = BatchPlan::new(
        &Batch {
            token_ids: &ids,
            seqs: &seqs,
        },
        &PlanLimits::new(1, 4096, 8, BLOCK),
    );
    let plan = plan.map_err(|e: BackendError| e.to_string()).unwrap();
    // 64 tokens of the first chunk, its last 6, then the second sequence's 5.
    let tiles = tiles_of(&plan, MMA_TILE);
    assert_eq!(tiles, vec![0, 64, 0, 64, 6, 0, 70, 5, 1]);
}

#[test]
fn tensor_core_kernel_is_taken_for_plain_bf16_layers_only() {
    let plain = DevSoftmax {
        shape: AttnShape {
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            scale: 0.088,
        },
        ..DevSoftmax::causal(AttnShape::new(32, 8, 128))
    };
    let (bf16, f32) = (WeightDtype::Bf16, WeightDtype::F32);
    let pick = |c, o, hd, s: &DevSoftmax| mma_kernel(c, o, hd, s);
    assert_eq!(
        pick(bf16, bf16, 128, &plain).as_deref(),
        Some("attn_mma_h128_bf16")
    );
    assert_eq!(
        pick(bf16, f32, 16, &plain).as_deref(),
        Some("attn_mma_h16_f32")
    );
    assert_eq!(pick(f32, f32, 128, &plain), None);
    assert_eq!(pick(WeightDtype::F16, f32, 128, &plain), None);
    assert_eq!(
        pick(bf16, bf16, 256, &plain).as_deref(),
        Some("attn_mma_h256_bf16")
    );
    assert_eq!(pick(bf16, bf16, 512, &plain), None);
    assert_eq!(pick(bf16, bf16, 80, &plain), None);
    let window = DevSoftmax {
        window: 128,
        ..plain
    };
    let sinks = DevSoftmax {
        sinks: 0x1000,
        ..plain
    };
    let chunks = DevSoftmax { chunk: 64, ..plain };
    for other in [window, sinks, chunks] {
        assert_eq!(pick(bf16, bf16, 64, &other), None);
    }
    let warm = DevSoftmax {
        temperature: Some(QueryTemperature {
            floor_scale: 8192.0,
            attn_scale: 0.1,
            offset: 0.0,
        }),
        ..plain
    };
    assert_eq!(
        pick(bf16, bf16, 64, &warm).as_deref(),
        Some("attn_mma_h64_bf16")
    );
}

/// One layer of 32 blocks of `BLOCK` slots, `kv_dim` wide, no indexer.
fn kv_shape(kv_dim: usize) -> KvShape {
    KvShape {
        layers: 1,
        num_blocks: 32,
        block_size: BLOCK,
        kv_dim,
        index: None,
    }
}
