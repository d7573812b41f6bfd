//! Nemotron 3's MoE ops on the CUDA device against the CPU's, op by op: the group-limited
//! sigmoid router on ties (equal logits, equal groups), coarse logits full of ties and random
//! ones, up to 1,024 experts in 32 groups — the same experts in the same order with the same
//! weights; and the experts' weighted sum and the latent cast, in f32 and written as bf16 (read
//! back through an identity GEMM, exact) against the CPU's values rounded to bf16; Llama-4's
//! router (the logits ranked) and its scaled gather of the experts' input rows; Mistral 4's
//! router (softmax scores, grouped); LFM2-MoE's (its renormalising epsilon 1e-6).
#![cfg(any(feature = "cuda", feature = "cuda-emu"))]

use crate::common::backends::{cuda_usable, read_gemm_in};
use hsx::kernels::cuda::CudaDevice;
use hsx::kernels::device::{BufKind, HostMatrix};
use hsx::kernels::routing::{GroupRank, GroupedTopK, RouterScore, Routing};
use hsx::kernels::{Bf16Kernel, CpuDevice, Device, WeightDtype};
use rand::{Rng, SeedableRng, rngs::StdRng};

fn router(top_k: usize, n_group: usize, topk_group: usize) -> GroupedTopK {
    GroupedTopK {
        top_k,
        n_group,
        topk_group,
        renorm: true,
        renorm_eps: hsx::kernels::routing::DEFAULT_RENORM_EPS,
        group_rank: GroupRank::TopTwoSum,
        scale: 2.5,
        score: RouterScore::Sigmoid,
    }
}

fn route<D: Device>(dev: &D, logits: &[f32], bias: &[f32], r: &GroupedTopK) -> Routing {
    let e = bias.len();
    let mut buf = dev.buffer(logits.len() / e, e, BufKind::F32).unwrap();
    dev.upload(logits, e, &mut buf).unwrap();
    let b = dev.vector(bias).unwrap();
    dev.moe_route_grouped(&buf, &b, r).unwrap()
}

/// Same rows and order; weights equal within 1e-6 (the device's `expf` may differ from the
/// host's in the last bit: bit for bit on the emulator).
fn assert_same(cpu: &Routing, gpu: &Routing, what: &str) {
    assert_eq!(
        (&cpu.rows, &cpu.offsets, &cpu.tok_pos),
        (&gpu.rows, &gpu.offsets, &gpu.tok_pos),
        "{what}"
    );
    for (a, b) in cpu.tok_w.iter().zip(&gpu.tok_w) {
        assert!((a - b).abs() <= 1e-6 * a.abs(), "{what}: weight {a} vs {b}");
    }
}

fn random(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

/// (name, experts, router, logits `[T, experts]`, bias)
type Case = (&'static str, usize, GroupedTopK, Vec<f32>, Vec<f32>);

#[test]
fn grouped_routing_matches_the_cpu() {
    if !cuda_usable() {
        return;
    }
    let cpu = CpuDevice::new(1, Bf16Kernel::F32).unwrap();
    let gpu = CudaDevice::new(0, WeightDtype::F32).unwrap();
    let mut rng = StdRng::seed_from_u64(15);
    let mut cases: Vec<Case> = vec![
        ("all equal", 8, router(3, 4, 2), vec![0.5; 24], vec![0.0; 8]),
        (
            "tied groups",
            6,
            router(2, 3, 1),
            vec![0., 0., 1., 1., 1., 1.],
            vec![0.0; 6],
        ),
    ];
    let coarse: Vec<f32> = random(&mut rng, 37 * 64, 2.0)
        .iter()
        .map(|v| (v * 2.0).round() / 2.0)
        .collect();
    cases.push(("coarse", 64, router(6, 8, 3), coarse, vec![0.0; 64]));
    // Llama-4's router: the logits ranked (f32's sigmoid ties 20 and 21), weights unscaled.
    let llama4 = GroupedTopK {
        n_group: 1,
        topk_group: 1,
        renorm: false,
        scale: 1.0,
        score: RouterScore::SigmoidByLogit,
        ..router(2, 1, 1)
    };
    // Mistral 4's: softmax scores over every expert, the group-limited choice, no bias.
    let mistral4 = GroupedTopK {
        score: RouterScore::Softmax,
        ..router(4, 4, 2)
    };
    // LFM2-MoE's: one group, the weights over their sum + 1e-6.
    let lfm2_moe = GroupedTopK {
        renorm_eps: 1e-6,
        scale: 1.0,
        ..router(4, 1, 1)
    };
    // DeepSeek-V2's group_limited_greedy: softmax scores, groups ranked by their best expert,
    // never renormalised, x 16 (V2 / V2.5 236B: top-6 of 160 in 3 of 8 groups).
    let deepseek_v2 = GroupedTopK {
        renorm: false,
        scale: 16.0,
        score: RouterScore::Softmax,
        group_rank: GroupRank::Best,
        ..router(6, 8, 3)
    };
    let ties = vec![1.0, 1.0, 1.0, 1.0, 0.0, 2.0, 2.0, -1.0];
    cases.push(("mistral4 ties", 8, mistral4, ties, vec![0.0; 8]));
    let saturated = vec![20.0, 21.0, -1.0, 0.5, 0.0, 1.0, 1.0, 3.0];
    let top1 = GroupedTopK { top_k: 1, ..llama4 };
    cases.push(("llama4 saturated", 4, top1, saturated, vec![0.0; 4]));
    for (name, t, e, r) in [
        ("random", 37, 64, router(6, 8, 3)),
        ("nano", 19, 128, router(6, 1, 1)),
        ("widest", 5, 1024, router(8, 32, 4)),
        ("llama4", 29, 16, llama4),
        ("mistral4", 31, 128, mistral4),
        ("lfm2_moe", 17, 32, lfm2_moe),
        ("deepseek_v2", 23, 160, deepseek_v2),
    ] {
        let bias = match r.score {
            RouterScore::Softmax => vec![0.0; e],
            _ => random(&mut rng, e, 0.1),
        };
        cases.push((name, e, r, random(&mut rng, t * e, 3.0), bias));
    }
    for (name, e, r, logits, bias) in &cases {
        assert_eq!(bias.len(), *e);
        let (c, g) = (route(&cpu, logits, bias, r), route(&gpu, logits, bias, r));
        assert_same(&c, &g, name);
    }
}

#[test]
fn weighted_sum_and_cast_match_the_cpu() {
    if !cuda_usable() {
        return;
    }
    let cpu = CpuDevice::new(1, Bf16Kernel::F32).unwrap();
    let mut rng = StdRng::seed_from_u64(16);
    let (t, e, h, r) = (23, 16, 48, router(3, 4, 2));
    let routing = route(
        &cpu,
        &random(&mut rng, t * e, 3.0),
        &random(&mut rng, e, 0.1),
        &r,
    );
    let n = routing.rows.len();
    let y = random(&mut rng, n * h, 4.0);
    let on_cpu = {
        let mut yb = cpu.buffer(n, h, BufKind::F32).unwrap();
        cpu.upload(&y, h, &mut yb).unwrap();
        let mut out = cpu.buffer(t, h, BufKind::F32).unwrap();
        cpu.moe_weighted_sum(&yb, &routing, t, &mut out).unwrap();
        cpu.download(&out).unwrap()
    };
    let bf16 = |v: &[f32]| {
        HostMatrix::from_f32(v, 1, v.len())
            .to_dtype(WeightDtype::Bf16)
            .to_f32()
    };
    for dtype in [WeightDtype::F32, WeightDtype::Bf16] {
        let gpu = CudaDevice::new(0, dtype).unwrap();
        let mut yb = gpu.buffer(n, h, BufKind::F32).unwrap();
        gpu.upload(&y, h, &mut yb).unwrap();
        let mut out = gpu.buffer(t, h, BufKind::GemmIn).unwrap();
        gpu.moe_weighted_sum(&yb, &routing, t, &mut out).unwrap();
        let want = match dtype {
            WeightDtype::F32 => on_cpu.clone(),
            _ => bf16(&on_cpu),
        };
        assert_eq!(
            read_gemm_in(&gpu, &out, t, h),
            want,
            "weighted sum into {dtype:?}"
        );
        let mut cast = gpu.buffer(n, h, BufKind::GemmIn).unwrap();
        gpu.cast(&yb, &mut cast).unwrap();
        let want = match dtype {
            WeightDtype::F32 => y.clone(),
            _ => bf16(&y),
        };
        assert_eq!(read_gemm_in(&gpu, &cast, n, h), want, "cast to {dtype:?}");
    }
}

/// Llama-4's expert inputs: the rows gathered into expert order times each row's routing
/// weight, rounded once to the GEMM input dtype (f32: the CPU's products exactly; bf16: the
/// CPU's products of the bf16 inputs, rounded to bf16).
#[test]
fn scaled_gather_matches_the_cpu() {
    if !cuda_usable() {
        return;
    }
    let cpu = CpuDevice::new(1, Bf16Kernel::F32).unwrap();
    let mut rng = StdRng::seed_from_u64(17);
    let (t, e, h) = (21, 8, 40);
    let mut routing = route(
        &cpu,
        &random(&mut rng, t * e, 3.0),
        &[0.0; 8],
        &router(2, 2, 1),
    );
    let scale = routing.take_row_weights();
    let n = routing.rows.len();
    let x = random(&mut rng, t * h, 4.0);
    let bf16 = |v: &[f32]| {
        HostMatrix::from_f32(v, 1, v.len())
            .to_dtype(WeightDtype::Bf16)
            .to_f32()
    };
    for dtype in [WeightDtype::F32, WeightDtype::Bf16] {
        let x_in = match dtype {
            WeightDtype::F32 => x.clone(),
            _ => bf16(&x),
        };
        let mut want = Vec::with_capacity(n * h);
        for (i, &tok) in routing.rows.iter().enumerate() {
            let row = &x_in[tok as usize * h..][..h];
            want.extend(row.iter().map(|v| v * scale[i]));
        }
        if dtype == WeightDtype::Bf16 {
            want = bf16(&want);
        }
        let gpu = CudaDevice::new(0, dtype).unwrap();
        let mut xf = gpu.buffer(t, h, BufKind::F32).unwrap();
        gpu.upload(&x, h, &mut xf).unwrap();
        let mut xg = gpu.buffer(t, h, BufKind::GemmIn).unwrap();
        gpu.cast(&xf, &mut xg).unwrap();
        let mut rows = gpu.buffer(n, h, BufKind::GemmIn).unwrap();
        gpu.moe_gather(&xg, &routing, Some(&scale), &mut rows)
            .unwrap();
        assert_eq!(read_gemm_in(&gpu, &rows, n, h), want, "{dtype:?}");
        let short = &scale[..n - 1];
        assert!(
            gpu.moe_gather(&xg, &routing, Some(short), &mut rows)
                .is_err()
        );
    }
}
