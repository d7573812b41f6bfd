//! The MoE router's choice on CUDA against the CPU's, where ties decide it: experts with equal
//! logits are taken lower index first on both devices (experts spread over lanes and registers
//! of the warp), and a step where most experts receive no token routes each token alike.
//!
//! torch.topk does not promise an order among equal values (torch 2.15 on the CPU took the
//! higher index in about half of the boundary ties for 4–32 experts, measured 2026-11-24), so
//! hsx's rule is its own: deterministic and the same on every device and batch split. Random
//! router weights (the fixtures) give no exact ties.
#![cfg(any(feature = "cuda", feature = "cuda-emu"))]

use crate::common::backends::cuda_usable;
use hsx::kernels::cuda::CudaDevice;
use hsx::kernels::device::BufKind;
use hsx::kernels::routing::Routing;
use hsx::kernels::{Bf16Kernel, CpuDevice, Device, WeightDtype};

/// Routing of `logits` (`[t, experts]`) on `dev`.
fn route<D: Device>(dev: &D, logits: &[f32], experts: usize, k: usize, renorm: bool) -> Routing {
    let t = logits.len() / experts;
    let mut buf = dev.buffer(t, experts, BufKind::F32).unwrap();
    dev.upload(logits, experts, &mut buf).unwrap();
    dev.moe_route(&buf, k, renorm).unwrap()
}

fn cuda_route(dev: &CudaDevice, logits: &[f32], experts: usize, k: usize, renorm: bool) -> Routing {
    route(dev, logits, experts, k, renorm)
}

fn cpu_route(logits: &[f32], experts: usize, k: usize, renorm: bool) -> Routing {
    let cpu = CpuDevice::new(1, Bf16Kernel::F32).unwrap();
    route(&cpu, logits, experts, k, renorm)
}

#[test]
fn ties_go_to_the_lower_expert_on_cpu_and_cuda() {
    if !cuda_usable() {
        return;
    }
    let dev = CudaDevice::new(0, WeightDtype::F32).unwrap();
    let experts = 72; // three registers per lane: ties between lanes and within a lane
    let mut logits = Vec::new();
    // token 0: every expert equal -> 0, 1, 2
    logits.extend(vec![0.5f32; experts]);
    // token 1: 40 (lane 8, register 1) and 8 (lane 8, register 0) tie for the lead; 70 next
    let mut l = vec![0.0f32; experts];
    (l[40], l[8], l[70]) = (3.0, 3.0, 2.0);
    logits.extend(&l);
    // token 2: 33 best, then 65, 1 and 17 tied for the last two places -> 1, 17
    let mut l = vec![-1.0f32; experts];
    (l[33], l[65], l[1], l[17]) = (4.0, 2.5, 2.5, 2.5);
    logits.extend(&l);
    for renorm in [false, true] {
        let want = cpu_route(&logits, experts, 3, renorm);
        let got = cuda_route(&dev, &logits, experts, 3, renorm);
        assert_eq!(got.rows, want.rows, "renorm {renorm}");
        assert_eq!(got.offsets, want.offsets, "renorm {renorm}");
        assert_eq!(got.tok_pos, want.tok_pos, "renorm {renorm}");
        for (g, c) in got.tok_w.iter().zip(&want.tok_w) {
            assert!(
                (g - c).abs() <= 1e-6 * c.abs(),
                "renorm {renorm}: {g} vs {c}"
            );
        }
    }
    // The experts chosen, token by token (tok_pos rows are in ascending expert order).
    let r = cpu_route(&logits, experts, 3, true);
    let chosen: Vec<Vec<usize>> = (0..3)
        .map(|t| {
            (r.tok_pos[t * 3..t * 3 + 3].iter())
                .map(|&row| r.offsets.partition_point(|&o| o <= row as usize) - 1)
                .collect()
        })
        .collect();
    assert_eq!(
        chosen,
        vec![vec![0, 1, 2], vec![8, 40, 70], vec![1, 17, 33]]
    );
}

/// One token, top-2 of 72: 70 experts get no row; both devices route it the same.
#[test]
fn experts_without_tokens_route_alike() {
    if !cuda_usable() {
        return;
    }
    let dev = CudaDevice::new(0, WeightDtype::F32).unwrap();
    let logits: Vec<f32> = (0..72).map(|e| ((e * 37 % 72) as f32).sin()).collect();
    let want = cpu_route(&logits, 72, 2, false);
    let got = cuda_route(&dev, &logits, 72, 2, false);
    assert_eq!((got.rows.len(), got.offsets.len()), (2, 73));
    let empty = want.offsets.windows(2).filter(|w| w[0] == w[1]).count();
    assert_eq!(empty, 70);
    assert_eq!(
        (got.rows, got.offsets, got.tok_pos),
        (want.rows, want.offsets, want.tok_pos)
    );
}
