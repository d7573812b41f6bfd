//! The CUDA backend against the CPU backend on every dense fixture model: prompts alone,
//! chunked prefill across calls, several requests' chunks packed in one batch; captured rows
//! within f32 1e-4 / bf16 2e-2 (relative to the largest value of the layer), greedy tokens
//! equal (f32). Skipped, saying why, where no CUDA device is usable.
#![cfg(any(feature = "cuda", feature = "cuda-emu"))]

use crate::common;

use common::backends::{
    Paging, cpu_backend, cpu_options, cuda_backend, cuda_backend_as, cuda_backend_tables,
    cuda_peer_options, cuda_usable, cuda_vs_cpu_tol, layer_of, read_gemm_in,
};
use hsx::kernels::cuda::CudaDevice;
use hsx::kernels::device::BufKind;
use hsx::kernels::{
    Backend, BackendError, Batch, Bf16Kernel, CpuDevice, Device, OutputDtype, SeqChunk,
};
use hsx::models::CpuBackend;
use hsx::models::{ModelSpec, WeightDtype};

const ARCHS: [&str; 21] = [
    "llama",
    "qwen2",
    "qwen3",
    "mistral",
    "llama_bf16",
    "gemma3",
    "gemma3_vl",
    "granite",
    "phi3",
    "phi3_longrope",
    "phi4_mini",
    "ministral3",
    "qwen3_yarn",
    "gemma4",
    "gemma4_bf16",
    "smollm3",
    "olmo2",
    "olmo3",
    "exaone4",
    "seed_oss",
    "glm4",
];
const NUM_BLOCKS: usize = 64;
const BUDGET: usize = 256;
const PAGING: Paging = Paging::Dense {
    num_blocks: NUM_BLOCKS,
};

struct Pair {
    cpu: CpuBackend,
    gpu: Box<dyn Backend>,
    spec: ModelSpec,
    tol: f32,
}

fn pair(name: &str) -> Pair {
    let spec = ModelSpec::from_dir(&common::model_dir(name)).unwrap();
    let layers: Vec<usize> = (0..=spec.num_layers).collect();
    let cpu = cpu_backend(name, cuda_peer_options(layers.clone(), NUM_BLOCKS, 0));
    let gpu = cuda_backend(name, layers, NUM_BLOCKS, 0, BUDGET);
    let tol = cuda_vs_cpu_tol(name);
    Pair {
        cpu,
        gpu,
        spec,
        tol,
    }
}

fn prompts(spec: &ModelSpec) -> Vec<Vec<u32>> {
    [5usize, 17, 33, 64]
        .iter()
        .enumerate()
        .map(|(j, &len)| common::random_prompt(j as u64 + 1, len, spec.vocab_size as u32))
        .collect()
}

/// Largest |a - b| over largest |b|, per captured layer, worst layer.
fn rel_err(a: &[f32], b: &[f32], k: usize, h: usize) -> f32 {
    assert_eq!(a.len(), b.len());
    (0..k)
        .map(|l| common::max_rel(&layer_of(a, l, k, h), &layer_of(b, l, k, h)))
        .fold(0f32, common::nan_max)
}

/// Every prompt split into chunks of `c`, one forward per step with all prompts' chunks of the
/// step packed together (reverse order): per-prompt captured rows and sampled token.
fn run_chunked(
    be: &mut dyn Backend,
    prompts: &[Vec<u32>],
    c: usize,
) -> Vec<(Vec<f32>, Option<u32>)> {
    PAGING.run_pieces(be, prompts, c, true)
}

fn check_alone(name: &str) {
    let mut p = pair(name);
    let (k, h) = (p.spec.num_layers + 1, p.spec.hidden_size);
    for (j, ids) in prompts(&p.spec).iter().enumerate() {
        let c = PAGING.alone(&mut p.cpu, j, ids);
        let g = PAGING.alone(p.gpu.as_mut(), j, ids);
        let e = rel_err(&g.captured_f32(k * h), &c.captured_f32(k * h), k, h);
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
        .map(|(j, ids)| PAGING.alone(p.gpu.as_mut(), j, ids))
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
            let self_e = rel_err(gr, &whole[j].captured_f32(k * h), k, h);
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
    if !cuda_usable() {
        return;
    }
    for name in ARCHS {
        check_alone(name);
    }
}

#[test]
fn dense_models_match_the_cpu_backend_chunked_and_batched() {
    if !cuda_usable() {
        return;
    }
    for name in ARCHS {
        check_chunked(name);
    }
}

#[test]
fn bad_batches_are_errors_not_crashes() {
    if !cuda_usable() {
        return;
    }
    let mut p = pair("llama");
    let vocab = p.spec.vocab_size as u32;
    let seqs = [PAGING.chunk(0, 0, 2, 2)];
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
        context: Vec::new(),
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
    let out = PAGING.alone(p.gpu.as_mut(), 1, &[3, 4, 5]);
    assert_eq!(out.sampled.len(), 1);
}

/// fp8 rows quantized on the device (`capture_quantize_fp8`) against the CPU's: per-token
/// scales within f32 rounding of the states, codes equal but where the states sit at a
/// rounding boundary (then neighbours in value order), at most 0.1% of them.
#[test]
fn fp8_capture_matches_the_cpu() {
    if !cuda_usable() {
        return;
    }
    let name = "llama";
    let spec = ModelSpec::from_dir(&common::model_dir(name)).unwrap();
    let layers: Vec<usize> = (0..=spec.num_layers).collect();
    let opts = hsx::models::CpuOptions {
        output_dtype: OutputDtype::Fp8,
        ..cpu_options(layers.clone(), NUM_BLOCKS, 0)
    };
    let mut cpu = cpu_backend(name, opts);
    let mut gpu = cuda_backend_as(name, layers, NUM_BLOCKS, 0, BUDGET, OutputDtype::Fp8);
    let codes = (spec.num_layers + 1) * spec.hidden_size;
    let (mut differ, mut total) = (0usize, 0usize);
    for (j, ids) in prompts(&spec).iter().enumerate() {
        let c = PAGING.alone(&mut cpu, j, ids);
        let g = PAGING.alone(gpu.as_mut(), j, ids);
        assert_eq!(
            g.captured.len(),
            ids.len() * (codes + 4),
            "prompt {j}: row bytes"
        );
        assert_eq!(g.captured.len(), c.captured.len());
        for (t, (gr, cr)) in g
            .captured
            .chunks(codes + 4)
            .zip(c.captured.chunks(codes + 4))
            .enumerate()
        {
            let scale = |r: &[u8]| f32::from_le_bytes(r[codes..].try_into().unwrap());
            let (gs, cs) = (scale(gr), scale(cr));
            assert!(
                (gs - cs).abs() <= 1e-4 * cs.abs(),
                "prompt {j} token {t}: scale {gs} vs {cs}"
            );
            for (a, b) in gr[..codes].iter().zip(&cr[..codes]) {
                total += 1;
                if a != b {
                    differ += 1;
                    // Codes in value order (sign-magnitude: -0 and +0 are neighbours).
                    let ord = |c: u8| i16::from(c & 0x7f) * if c & 0x80 != 0 { -1 } else { 1 };
                    assert!(
                        (ord(*a) - ord(*b)).abs() <= 1,
                        "prompt {j} token {t}: code {a:#x} vs {b:#x}"
                    );
                }
            }
        }
    }
    eprintln!("fp8 codes differing from the cpu: {differ} of {total}");
    assert!(differ * 1000 <= total, "{differ} of {total} codes differ");
}

/// The runner hands each step's captured bytes back (`recycle_captured`) and the next step is
/// copied into them: the same allocation, exactly the bytes a fresh backend gives (fewer rows
/// than the buffer held, f32 and fp8).
#[test]
fn a_recycled_capture_buffer_gives_the_bytes_of_a_fresh_one() {
    if !cuda_usable() {
        return;
    }
    let name = "llama";
    let spec = ModelSpec::from_dir(&common::model_dir(name)).unwrap();
    let ps = prompts(&spec);
    let (long, short) = (&ps[3], &ps[0]);
    for dtype in [OutputDtype::F32, OutputDtype::Fp8] {
        let backend = || cuda_backend_as(name, vec![0, 2, 4], NUM_BLOCKS, 0, BUDGET, dtype);
        let (mut reused, mut fresh) = (backend(), backend());
        let first = PAGING.alone(reused.as_mut(), 0, long);
        let addr = first.captured.as_ptr();
        reused.recycle_captured(first.captured);
        let got = PAGING.alone(reused.as_mut(), 1, short);
        assert_eq!(
            got.captured.as_ptr(),
            addr,
            "{dtype:?}: the buffer is reused"
        );
        let want = PAGING.alone(fresh.as_mut(), 1, short);
        assert_eq!(got.captured.len(), want.captured.len(), "{dtype:?}");
        assert!(got.captured == want.captured, "{dtype:?}: bytes differ");
    }
}

/// Gemma's GeGLU on the CUDA device against the CPU's, f32 and written as bf16 (read back
/// through an identity GEMM), gates from -12 to 12 (a saturated sigmoid at both ends). The
/// device takes `expf` where the CPU takes its own `exp` polynomial (both ~1 ulp): within 1e-6
/// of 1 + |gate|, times |up|.
#[test]
fn geglu_matches_the_cpu() {
    if !cuda_usable() {
        return;
    }
    let (t, inter) = (5, 300);
    let gu: Vec<f32> = (0..t * 2 * inter)
        .map(|i| ((i * 7919 % 1000) as f32 / 1000.0 - 0.5) * 24.0)
        .collect();
    let cpu = CpuDevice::new(1, Bf16Kernel::F32).unwrap();
    let mut x = cpu.buffer(t, 2 * inter, BufKind::F32).unwrap();
    cpu.upload(&gu, 2 * inter, &mut x).unwrap();
    let mut out = cpu.buffer(t, inter, BufKind::GemmIn).unwrap();
    cpu.gelu_tanh_mul(&x, &mut out).unwrap();
    let want = cpu.download(&out).unwrap();
    for dtype in [WeightDtype::F32, WeightDtype::Bf16] {
        let gpu = CudaDevice::new(0, dtype).unwrap();
        let mut x = gpu.buffer(t, 2 * inter, BufKind::F32).unwrap();
        gpu.upload(&gu, 2 * inter, &mut x).unwrap();
        let mut out = gpu.buffer(t, inter, BufKind::GemmIn).unwrap();
        gpu.gelu_tanh_mul(&x, &mut out).unwrap();
        let got = read_gemm_in(&gpu, &out, t, inter);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let row = &gu[i / inter * 2 * inter..][..2 * inter];
            let (gate, up) = (row[i % inter], row[inter + i % inter]);
            let w = match dtype {
                WeightDtype::Bf16 => half::bf16::from_f32(*w).to_f32(),
                _ => *w,
            };
            let ulp = if dtype == WeightDtype::Bf16 {
                w.abs() / 128.0
            } else {
                0.0
            };
            let tol = 1e-6 * (1.0 + gate.abs()) * up.abs() + ulp;
            assert!(
                (g - w).abs() <= tol,
                "{dtype:?} [{i}] gelu({gate}) * {up}: {g} vs {w}"
            );
        }
    }
    // Rows of an odd width have no [gate | up] halves: refused.
    let gpu = CudaDevice::new(0, WeightDtype::F32).unwrap();
    let mut x = gpu.buffer(3, 3, BufKind::F32).unwrap();
    gpu.upload(&gu[..9], 3, &mut x).unwrap();
    let mut out = gpu.buffer(3, 1, BufKind::GemmIn).unwrap();
    assert!(gpu.gelu_tanh_mul(&x, &mut out).is_err());
}

/// Gather-only tables kept on the host (their rows gathered there and uploaded each step, as
/// for a table past `limits::HOST_TABLE_BYTES`) give the same rows, bit for bit, as tables on
/// the device: untied embeddings and Qwen4-Exp's n-gram table (`qwen4_exp_ple`), Gemma 4's
/// per-layer embeddings (`gemma4_e2b`).
#[test]
fn tables_on_the_host_give_the_same_rows() {
    if !cuda_usable() {
        return;
    }
    for name in ["qwen4_exp_ple", "gemma4_e2b"] {
        let spec = ModelSpec::from_dir(&common::model_dir(name)).unwrap();
        let layers: Vec<usize> = (0..=spec.num_layers).collect();
        let load = |above| {
            let dims = (640, 4, 512);
            cuda_backend_tables(name, layers.clone(), dims, OutputDtype::F32, above)
        };
        let (mut device, mut host) = (load(usize::MAX), load(0));
        let prompts = prompts(&spec);
        let a = Paging::Hybrid.run_pieces(device.as_mut(), &prompts, 61, false);
        let b = Paging::Hybrid.run_pieces(host.as_mut(), &prompts, 61, false);
        assert_eq!(a.len(), prompts.len());
        for (i, ((ra, ta), (rb, tb))) in a.iter().zip(&b).enumerate() {
            assert!(!ra.is_empty(), "{name} prompt {i}: no rows");
            assert!(
                ra == rb && ta == tb,
                "{name} prompt {i}: host-side tables differ"
            );
        }
    }
}
