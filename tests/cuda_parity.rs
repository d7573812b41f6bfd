//! The CUDA backend against the CPU backend on every dense fixture model: prompts alone,
//! chunked prefill across calls, several requests' chunks packed in one batch; captured rows
//! within f32 1e-4 / bf16 2e-2 (relative to the largest value of the layer), greedy tokens
//! equal (f32). Skipped, saying why, where no CUDA device is usable.
#![cfg(feature = "cuda")]

use std::path::{Path, PathBuf};

use hsx::kernels::cpu::{CpuBackend, CpuOptions};
use hsx::kernels::cuda::{self, CudaOptions};
use hsx::kernels::{Backend, BackendError, Batch, BatchOutput, SeqChunk};
use hsx::models::{ModelSpec, WeightDtype};

const ARCHS: [&str; 5] = ["llama", "qwen2", "qwen3", "mistral", "llama_bf16"];
const BLOCK: usize = 16;
const NUM_BLOCKS: usize = 64;
const BUDGET: usize = 256;

fn model_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/models")
        .join(name)
}

fn usable() -> bool {
    match cuda::probe(0) {
        Ok(info) => {
            eprintln!(
                "cuda device: {} (sm_{}{})",
                info.name, info.compute_capability.0, info.compute_capability.1
            );
            true
        }
        Err(reason) => {
            eprintln!("skipping: {reason}");
            false
        }
    }
}

struct Pair {
    cpu: CpuBackend,
    gpu: Box<dyn Backend>,
    spec: ModelSpec,
    tol: f32,
}

fn pair(name: &str) -> Pair {
    let dir = model_dir(name);
    let spec = ModelSpec::from_dir(&dir).unwrap();
    let layers: Vec<usize> = (0..=spec.num_layers).collect();
    let cpu = CpuBackend::load(
        &dir,
        spec.clone(),
        CpuOptions {
            capture_layers: layers.clone(),
            num_blocks: NUM_BLOCKS,
            block_size: BLOCK,
            threads: 2,
            num_state_slots: 0,
        },
    )
    .unwrap();
    let gpu = cuda::load(
        &dir,
        spec.clone(),
        CudaOptions {
            capture_layers: layers,
            num_blocks: NUM_BLOCKS,
            block_size: BLOCK,
            num_state_slots: 0,
            max_num_batched_tokens: BUDGET,
            device: 0,
        },
    )
    .unwrap_or_else(|e| panic!("{name}: cuda load: {e}"));
    let tol = if spec.dtype == WeightDtype::F32 {
        1e-4
    } else {
        2e-2
    };
    Pair {
        cpu,
        gpu,
        spec,
        tol,
    }
}

/// Request `r` owns blocks `NUM_BLOCKS - 1 - (r + 4 k)`: non-contiguous, descending.
fn table(r: usize, len: usize) -> Vec<u32> {
    (0..len.div_ceil(BLOCK))
        .map(|k| (NUM_BLOCKS - 1 - (r + 4 * k)) as u32)
        .collect()
}

fn chunk(r: usize, start: usize, len: usize, total: usize) -> SeqChunk {
    SeqChunk {
        start,
        len,
        block_table: table(r, total),
        sample: start + len == total,
        state_slot: None,
    }
}

fn prompts(spec: &ModelSpec) -> Vec<Vec<u32>> {
    let v = spec.vocab_size as u64;
    [5usize, 17, 33, 64]
        .iter()
        .enumerate()
        .map(|(j, &len)| {
            let mut x = (j as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x % v) as u32
                })
                .collect()
        })
        .collect()
}

/// Largest |a - b| over largest |b|, per captured layer, worst layer.
fn rel_err(a: &[f32], b: &[f32], k: usize, h: usize) -> f32 {
    assert_eq!(a.len(), b.len());
    let mut worst = 0f32;
    for layer in 0..k {
        let (mut num, mut den) = (0f32, 0f32);
        for (ra, rb) in a.chunks_exact(k * h).zip(b.chunks_exact(k * h)) {
            for (x, y) in ra[layer * h..][..h].iter().zip(&rb[layer * h..][..h]) {
                num = num.max((x - y).abs());
                den = den.max(y.abs());
            }
        }
        worst = worst.max(num / den.max(f32::MIN_POSITIVE));
    }
    worst
}

/// Every prompt split into chunks of `c`, one forward per step with all prompts' chunks of the
/// step packed together (reverse order): per-prompt captured rows and sampled token.
fn run_chunked(
    be: &mut dyn Backend,
    prompts: &[Vec<u32>],
    c: usize,
) -> Vec<(Vec<f32>, Option<u32>)> {
    let row = be.capture_layers().len() * be.hidden_size();
    let mut results = vec![(Vec::new(), None); prompts.len()];
    for step in 0.. {
        let (mut ids, mut seqs, mut owners) = (Vec::new(), Vec::new(), Vec::new());
        for (r, p) in prompts.iter().enumerate().rev() {
            let start = step * c;
            if start < p.len() {
                let len = c.min(p.len() - start);
                ids.extend_from_slice(&p[start..start + len]);
                seqs.push(chunk(r, start, len, p.len()));
                owners.push((r, len));
            }
        }
        if seqs.is_empty() {
            break;
        }
        let out = be
            .forward(&Batch {
                token_ids: &ids,
                seqs: &seqs,
            })
            .unwrap();
        let mut offset = 0;
        for (s, &(r, len)) in owners.iter().enumerate() {
            let rows = &out.captured[offset * row..(offset + len) * row];
            results[r].0.extend_from_slice(rows);
            if out.sampled[s].is_some() {
                results[r].1 = out.sampled[s];
            }
            offset += len;
        }
    }
    results
}

fn alone(be: &mut dyn Backend, r: usize, ids: &[u32]) -> BatchOutput {
    let seqs = [chunk(r, 0, ids.len(), ids.len())];
    be.forward(&Batch {
        token_ids: ids,
        seqs: &seqs,
    })
    .unwrap()
}

fn check_alone(name: &str) {
    let mut p = pair(name);
    let (k, h) = (p.spec.num_layers + 1, p.spec.hidden_size);
    for (j, ids) in prompts(&p.spec).iter().enumerate() {
        let c = alone(&mut p.cpu, j, ids);
        let g = alone(p.gpu.as_mut(), j, ids);
        let e = rel_err(&g.captured, &c.captured, k, h);
        eprintln!("{name} prompt {j} ({} tokens): rel err {e:.2e}", ids.len());
        assert!(e <= p.tol, "{name} prompt {j}: rel err {e} > {}", p.tol);
        if p.spec.dtype == WeightDtype::F32 {
            assert_eq!(g.sampled, c.sampled, "{name} prompt {j}: greedy token");
        } else if g.sampled != c.sampled {
            eprintln!(
                "{name} prompt {j}: bf16 greedy token differs: {:?} vs {:?}",
                g.sampled, c.sampled
            );
        }
    }
}

fn check_chunked(name: &str) {
    let mut p = pair(name);
    let (k, h) = (p.spec.num_layers + 1, p.spec.hidden_size);
    let ps = prompts(&p.spec);
    let whole: Vec<_> = ps
        .iter()
        .enumerate()
        .map(|(j, ids)| alone(p.gpu.as_mut(), j, ids))
        .collect();
    for c in [1, 7, 16, 37] {
        let cpu = run_chunked(&mut p.cpu, &ps, c);
        let gpu = run_chunked(p.gpu.as_mut(), &ps, c);
        for (j, ((gr, gs), (cr, cs))) in gpu.iter().zip(&cpu).enumerate() {
            let e = rel_err(gr, cr, k, h);
            assert!(
                e <= p.tol,
                "{name} chunk {c} prompt {j}: cuda vs cpu rel err {e}"
            );
            let self_e = rel_err(gr, &whole[j].captured, k, h);
            eprintln!(
                "{name} chunk {c} prompt {j}: vs cpu {e:.2e}, vs cuda unchunked {self_e:.2e}"
            );
            assert!(
                self_e <= p.tol,
                "{name} chunk {c} prompt {j}: chunked vs whole {self_e}"
            );
            if p.spec.dtype == WeightDtype::F32 {
                assert_eq!(gs, cs, "{name} chunk {c} prompt {j}: greedy token");
            }
        }
    }
}

#[test]
fn dense_models_match_the_cpu_backend_alone() {
    if !usable() {
        return;
    }
    for name in ARCHS {
        check_alone(name);
    }
}

#[test]
fn dense_models_match_the_cpu_backend_chunked_and_batched() {
    if !usable() {
        return;
    }
    for name in ARCHS {
        check_chunked(name);
    }
}

#[test]
fn bad_batches_are_errors_not_crashes() {
    if !usable() {
        return;
    }
    let mut p = pair("llama");
    let vocab = p.spec.vocab_size as u32;
    let seqs = [chunk(0, 0, 2, 2)];
    let err = p
        .gpu
        .forward(&Batch {
            token_ids: &[1, vocab],
            seqs: &seqs,
        })
        .unwrap_err();
    assert!(matches!(err, BackendError::TokenOutOfRange { .. }), "{err}");
    let ids = vec![1u32; BUDGET + 1];
    let seqs = [SeqChunk {
        start: 0,
        len: ids.len(),
        block_table: (0..NUM_BLOCKS as u32).collect(),
        sample: true,
        state_slot: None,
    }];
    let err = p
        .gpu
        .forward(&Batch {
            token_ids: &ids,
            seqs: &seqs,
        })
        .unwrap_err();
    assert!(err.to_string().contains("budget"), "{err}");
    // The backend still works after refusing batches.
    let out = alone(p.gpu.as_mut(), 1, &[3, 4, 5]);
    assert_eq!(out.sampled.len(), 1);
}
