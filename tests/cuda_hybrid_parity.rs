//! The CUDA backend on the hybrid fixtures (Qwen3.5, Qwen3-Next, Nemotron-H, Qwen3.5 bf16)
//! against the CPU backend and the transformers references: every layer id, one pass vs
//! chunked prefill (pieces of 1, 7, 61 tokens) vs several requests' chunks packed in one batch,
//! recurrent-state slots reused after an abandoned request, bad slots rejected.
//! Captured rows within f32 1e-4 / bf16 2e-2 (relative to the largest value of the layer),
//! greedy tokens equal (f32).
//!
//! The NVRTC test only needs libnvrtc; the others need a GPU and are skipped, saying why,
//! where none is usable.
#![cfg(feature = "cuda")]

mod common;

use common::{Reference, max_rel, model_dir, random_prompt};
use hsx::kernels::cpu::{CpuBackend, CpuOptions};
use hsx::kernels::cuda::{self, CudaOptions};
use hsx::kernels::{Backend, BackendError, Batch, SeqChunk};
use hsx::models::{ModelSpec, WeightDtype};

/// (fixture, L)
const MODELS: [(&str, usize); 4] = [
    ("qwen3_5", 4),
    ("qwen3_next", 4),
    ("nemotron_h", 6),
    ("qwen3_5_bf16", 4),
];
const HIDDEN: usize = 64;
const BLOCK: usize = 16;
const NUM_BLOCKS: usize = 1024;
const SLOTS: usize = 8;
const BUDGET: usize = 1024;

/// The hybrid kernel sources (the NVRTC header is prepended by `nvrtc::compile`).
const SOURCES: [(&str, &str); 5] = [
    ("conv1d", include_str!("../src/kernels/cuda/conv1d.cu")),
    (
        "gated_delta",
        include_str!("../src/kernels/cuda/gated_delta.cu"),
    ),
    ("mamba2", include_str!("../src/kernels/cuda/mamba2.cu")),
    ("moe", include_str!("../src/kernels/cuda/moe.cu")),
    (
        "gated_attn",
        include_str!("../src/kernels/cuda/hybrid/gated_attn.cu"),
    ),
];

/// Every hybrid kernel compiles for A100 and H100/H200; needs libnvrtc only (no GPU).
#[test]
fn hybrid_kernels_compile_with_nvrtc() {
    if !cuda::nvrtc::nvrtc_present() {
        eprintln!("skipping: libnvrtc.so not found (set LD_LIBRARY_PATH to a CUDA 13 lib dir)");
        return;
    }
    for cc in [(9, 0), (8, 0)] {
        for (name, src) in SOURCES {
            match cuda::nvrtc::compile(name, src, cc) {
                Ok(img) => eprintln!("{name}.cu: sm_{}{} cubin, {} bytes", cc.0, cc.1, img.len()),
                Err(e) => panic!("{name}.cu does not compile:\n{e}"),
            }
        }
    }
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

fn cpu_backend(name: &str, layers: Vec<usize>) -> CpuBackend {
    let dir = model_dir(name);
    let spec = ModelSpec::from_dir(&dir).unwrap();
    let opts = CpuOptions {
        capture_layers: layers,
        num_blocks: NUM_BLOCKS,
        block_size: BLOCK,
        threads: 2,
        num_state_slots: SLOTS,
    };
    CpuBackend::load(&dir, spec, opts).unwrap()
}

fn gpu_backend(name: &str, layers: Vec<usize>) -> Box<dyn Backend> {
    let dir = model_dir(name);
    let spec = ModelSpec::from_dir(&dir).unwrap();
    assert!(cuda::supports(&spec), "{name} should run on CUDA");
    let opts = CudaOptions {
        capture_layers: layers,
        num_blocks: NUM_BLOCKS,
        block_size: BLOCK,
        num_state_slots: SLOTS,
        max_num_batched_tokens: BUDGET,
        device: 0,
    };
    cuda::load(&dir, spec, opts).unwrap_or_else(|e| panic!("{name}: cuda load: {e}"))
}

fn tol(name: &str) -> f32 {
    let spec = ModelSpec::from_dir(&model_dir(name)).unwrap();
    if spec.dtype == WeightDtype::F32 {
        1e-4
    } else {
        2e-2
    }
}

/// Request `r` owns blocks `r, r + 64, ...` (interleaved, so paging bugs show).
fn table(r: usize, len: usize) -> Vec<u32> {
    (0..len.div_ceil(BLOCK))
        .map(|k| (r + 64 * k) as u32)
        .collect()
}

fn chunk(r: usize, start: usize, len: usize, total: usize) -> SeqChunk {
    SeqChunk {
        start,
        len,
        block_table: table(r, total),
        sample: start + len == total,
        state_slot: Some(r as u32),
    }
}

/// Runs `prompts[r]` as request r (slot r), cutting every request into pieces of at most
/// `piece` tokens; each step holds the next piece of every unfinished request. Returns each
/// request's captured rows `[T, K, H]` and its sampled token.
fn run_split(be: &mut dyn Backend, prompts: &[Vec<u32>], piece: usize) -> Vec<(Vec<f32>, u32)> {
    let k = be.capture_layers().len();
    let mut done = vec![0usize; prompts.len()];
    let mut rows: Vec<Vec<f32>> = vec![Vec::new(); prompts.len()];
    let mut sampled = vec![u32::MAX; prompts.len()];
    while done.iter().zip(prompts).any(|(d, p)| d < &p.len()) {
        let (mut tokens, mut seqs, mut who) = (Vec::new(), Vec::new(), Vec::new());
        for (r, p) in prompts.iter().enumerate() {
            if done[r] < p.len() {
                let len = piece.min(p.len() - done[r]);
                tokens.extend_from_slice(&p[done[r]..done[r] + len]);
                seqs.push(chunk(r, done[r], len, p.len()));
                who.push((r, len));
            }
        }
        let out = be
            .forward(&Batch {
                token_ids: &tokens,
                seqs: &seqs,
            })
            .unwrap();
        let mut off = 0;
        for (i, &(r, len)) in who.iter().enumerate() {
            rows[r].extend_from_slice(&out.captured[off * k * HIDDEN..(off + len) * k * HIDDEN]);
            off += len;
            done[r] += len;
            if let Some(t) = out.sampled[i] {
                sampled[r] = t;
            }
        }
    }
    rows.into_iter().zip(sampled).collect()
}

fn layer_of(rows: &[f32], k: usize, kk: usize) -> Vec<f32> {
    rows.chunks_exact(kk * HIDDEN)
        .flat_map(|r| r[k * HIDDEN..(k + 1) * HIDDEN].to_vec())
        .collect()
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Every layer id of every reference prompt: CUDA vs CPU within tolerance, greedy tokens equal
/// (f32), and (f32) CUDA vs transformers within 2e-4. Prompts run one after another on slot 0,
/// so a reused slot is zeroed.
#[test]
fn every_layer_matches_cpu_and_transformers() {
    if !usable() {
        return;
    }
    for (name, l) in MODELS {
        let layers: Vec<usize> = (0..=l).collect();
        let mut cpu = cpu_backend(name, layers.clone());
        let mut gpu = gpu_backend(name, layers);
        let reference = Reference::load(name);
        let tol = tol(name);
        let mut worst = 0f32;
        for j in 0..reference.num_prompts() {
            let ids = reference.input_ids(j);
            let (want, want_tok) =
                run_split(&mut cpu, std::slice::from_ref(&ids), BUDGET).remove(0);
            let (got, tok) = run_split(gpu.as_mut(), std::slice::from_ref(&ids), BUDGET).remove(0);
            for i in 0..=l {
                let (g, c) = (layer_of(&got, i, l + 1), layer_of(&want, i, l + 1));
                assert!(g.iter().all(|v| v.is_finite()), "{name} p{j} layer {i}");
                let err = max_rel(&g, &c);
                worst = worst.max(err);
                assert!(err <= tol, "{name} p{j} layer {i}: cuda vs cpu {err:e}");
                if tol < 1e-3 {
                    let hf = reference.f32(&format!("p{j}.layer.{i}"));
                    let e = max_rel(&g, &hf);
                    assert!(
                        e <= 2e-4,
                        "{name} p{j} layer {i}: cuda vs transformers {e:e}"
                    );
                }
            }
            if tol < 1e-3 {
                assert_eq!(tok, want_tok, "{name} p{j}: greedy token");
                assert_eq!(tok, reference.next_token(j), "{name} p{j}: vs transformers");
            }
        }
        eprintln!("{name}: worst cuda vs cpu max-rel {worst:e}");
    }
}

/// Pieces of 1, 7, 61 tokens with several requests per step (each on its own slot) against
/// each request alone in one chunk, on CUDA (and the CPU's one-pass rows).
#[test]
fn chunked_and_packed_batches_match_one_pass() {
    if !usable() {
        return;
    }
    for (name, l) in MODELS {
        let layers = vec![0, 1, 3, l];
        let prompts: Vec<Vec<u32>> = [150usize, 1, 64, 9, 77, 130]
            .iter()
            .enumerate()
            .map(|(i, &n)| random_prompt(100 + i as u64, n, 512))
            .collect();
        let mut gpu = gpu_backend(name, layers.clone());
        let mut cpu = cpu_backend(name, layers);
        let tol = tol(name);
        let solo: Vec<_> = prompts
            .iter()
            .map(|p| run_split(gpu.as_mut(), std::slice::from_ref(p), BUDGET).remove(0))
            .collect();
        let cpu_solo = run_split(&mut cpu, &prompts, BUDGET);
        for (r, ((g, _), (c, _))) in solo.iter().zip(&cpu_solo).enumerate() {
            let err = max_rel(g, c);
            assert!(err <= tol, "{name}: request {r} one pass vs cpu {err:e}");
        }
        for piece in [1usize, 7, 61] {
            let got = run_split(gpu.as_mut(), &prompts, piece);
            let mut identical = 0;
            for (r, ((a, ta), (b, tb))) in got.iter().zip(&solo).enumerate() {
                let err = max_rel(a, b);
                assert!(err <= tol, "{name}: piece {piece}, request {r}: {err:e}");
                if tol < 1e-3 {
                    assert_eq!(ta, tb, "{name}: piece {piece}, request {r} token");
                }
                identical += usize::from(same_bits(a, b));
            }
            eprintln!(
                "{name}: piece {piece}: {identical}/{} requests byte-identical to one pass",
                prompts.len()
            );
        }
    }
}

/// A request abandoned mid-prefill leaves state in its slot; the next request given that
/// slot starts from zero (the same bits as on a fresh backend: same batches, same kernels).
#[test]
fn reused_slot_starts_from_zero() {
    if !usable() {
        return;
    }
    for (name, l) in MODELS {
        let mut gpu = gpu_backend(name, vec![0, 1, l]);
        let b = random_prompt(7, 90, 512);
        let solo = run_split(gpu.as_mut(), std::slice::from_ref(&b), 33).remove(0);
        let a = random_prompt(8, 120, 512);
        let seqs = [chunk(0, 0, 70, a.len())];
        gpu.forward(&Batch {
            token_ids: &a[..70],
            seqs: &seqs,
        })
        .unwrap();
        let again = run_split(gpu.as_mut(), std::slice::from_ref(&b), 33).remove(0);
        assert!(same_bits(&again.0, &solo.0), "{name}: stale state leaked");
        assert_eq!(again.1, solo.1);
    }
}

#[test]
fn bad_state_slots_are_rejected() {
    if !usable() {
        return;
    }
    let mut gpu = gpu_backend("qwen3_5", vec![0, 4]);
    let ids = [1u32, 2];
    let mut c0 = chunk(0, 0, 1, 1);
    let mut c1 = chunk(1, 0, 1, 1);
    c1.state_slot = Some(0);
    let e = gpu.forward(&Batch {
        token_ids: &ids,
        seqs: &[c0.clone(), c1],
    });
    assert!(matches!(e, Err(BackendError::InvalidBatch(m)) if m.contains("slot 0")));
    c0.state_slot = None;
    let e = gpu.forward(&Batch {
        token_ids: &ids[..1],
        seqs: std::slice::from_ref(&c0),
    });
    assert!(matches!(e, Err(BackendError::InvalidBatch(_))));
    c0.state_slot = Some(SLOTS as u32);
    let e = gpu.forward(&Batch {
        token_ids: &ids[..1],
        seqs: &[c0],
    });
    assert!(matches!(e, Err(BackendError::InvalidBatch(_))));
}
