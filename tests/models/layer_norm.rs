//! Cohere's LayerNorm (no bias) as a device op: `norm` and the residual add fused with it, on
//! the CPU and on CUDA, against an f64 reference, over rows whose mean is far from zero (which
//! an RMSNorm would keep). The models end to end against transformers are the matrix's
//! `cohere*` fixtures.

use hsx::kernels::device::{BufKind, NormKind, RowNorm};
use hsx::kernels::{Bf16Kernel, CpuDevice, Device};

const EPS: f64 = 1e-5;

fn values(n: usize, seed: usize, offset: f32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i + seed) * 7919 % 1000) as f32 / 1000.0 - 0.5) * 6.0 + offset)
        .collect()
}

/// `w · (x - mean) / sqrt(var + eps)` of each `w.len()`-wide row, in f64.
fn layer_normed(x: &[f32], w: &[f32]) -> Vec<f64> {
    x.chunks(w.len())
        .flat_map(|row| {
            let n = row.len() as f64;
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / n;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
            let r = 1.0 / (var + EPS).sqrt();
            row.iter()
                .zip(w)
                .map(move |(&v, &wi)| (v as f64 - mean) * r * wi as f64)
        })
        .collect()
}

/// Both forms on `dev` over 5 rows of 300 (a width no block or vector divides): `norm` of
/// `x`, then `x += y` fused with the norm of the sum; returns the two outputs.
fn check<D: Device>(dev: &D) -> (Vec<f32>, Vec<f32>) {
    let (t, d) = (5, 300);
    let layer = RowNorm {
        kind: NormKind::Layer,
        eps: EPS,
    };
    let (x, y, w) = (
        values(t * d, 3, 40.0),
        values(t * d, 8, -1.5),
        values(d, 11, 1.0),
    );
    let close = |got: &[f32], want: Vec<f64>, what: &str| {
        for (i, (g, want)) in got.iter().zip(want).enumerate() {
            // The mean rounded to f32 (~40 · 2^-24) moves each centred value by about that.
            let tol = 2e-5 * (1.0 + want.abs());
            assert!(
                (*g as f64 - want).abs() <= tol,
                "{what} [{i}]: {g} vs {want}"
            );
        }
    };
    let mut xb = dev.buffer(t, d, BufKind::F32).unwrap();
    let mut yb = dev.buffer(t, d, BufKind::F32).unwrap();
    dev.upload(&x, d, &mut xb).unwrap();
    dev.upload(&y, d, &mut yb).unwrap();
    let wv = dev.vector(&w).unwrap();
    let mut out = dev.buffer(t, d, BufKind::F32).unwrap();
    dev.norm(&xb, &wv, layer, &mut out).unwrap();
    let normed = dev.download(&out).unwrap();
    close(&normed, layer_normed(&x, &w), "norm");
    dev.add_norm(&mut xb, &yb, &wv, layer, &mut out).unwrap();
    let sum: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
    assert_eq!(dev.download(&xb).unwrap(), sum, "the residual add");
    let fused = dev.download(&out).unwrap();
    close(&fused, layer_normed(&sum, &w), "add_norm");
    // A LayerNorm is not an RMSNorm of the same rows.
    dev.norm(&xb, &wv, RowNorm::rms(EPS), &mut out).unwrap();
    assert!(dev.download(&out).unwrap() != fused);
    (normed, fused)
}

#[test]
fn layer_norm_on_the_cpu() {
    check(&CpuDevice::new(1, Bf16Kernel::F32).unwrap());
}

/// CUDA's block reductions sum in another order than the CPU's eight lanes: the same values
/// within a few f32 ulps.
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
#[test]
fn layer_norm_on_cuda_matches_the_cpu() {
    use hsx::kernels::cuda::CudaDevice;
    use hsx::models::WeightDtype;
    if !crate::common::backends::cuda_usable() {
        return;
    }
    let gpu = check(&CudaDevice::new(0, WeightDtype::F32).unwrap());
    let cpu = check(&CpuDevice::new(1, Bf16Kernel::F32).unwrap());
    for (g, c) in [(gpu.0, cpu.0), (gpu.1, cpu.1)] {
        for (a, b) in g.iter().zip(&c) {
            assert!((a - b).abs() <= 4e-6 * (1.0 + b.abs()), "{a} vs {b}");
        }
    }
}
