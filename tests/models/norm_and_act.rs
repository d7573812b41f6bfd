//! Device ops of single architectures against f64 references, on the CPU and on CUDA: Cohere's
//! LayerNorm (no bias), `norm` and the residual add fused with it, over rows whose mean is far
//! from zero (which an RMSNorm would keep); Apertus' xIELU activation on both branches; LFM2's
//! product gate of two column ranges of one buffer. The models end to end against
//! transformers are the matrix's `cohere*`, `apertus*` and `lfm*` fixtures.

use hsx::kernels::device::{BufKind, Cols, GateFn, NormKind, RowNorm, UnaryAct, Xielu};
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

const XIELU: Xielu = Xielu {
    alpha_p: 0.9,
    alpha_n: 1.3,
    beta: 0.5,
    eps: -1e-6,
};

/// xIELU in f64: `ap·x² + β·x` for x > 0, `(expm1(min(x, eps)) − x)·an + β·x` otherwise.
fn xielu_f64(x: f32) -> f64 {
    let (x, p) = (x as f64, XIELU);
    let (ap, an, b, eps) = (
        p.alpha_p as f64,
        p.alpha_n as f64,
        p.beta as f64,
        p.eps as f64,
    );
    match x > 0.0 {
        true => ap * x * x + b * x,
        false => (x.min(eps).exp_m1() - x) * an + b * x,
    }
}

/// xIELU over values on both sides of zero (and within `eps` of it) on `dev`.
fn check_xielu<D: Device>(dev: &D) -> Vec<f32> {
    let x: Vec<f32> = (0..1000)
        .map(|i| (i as f32 - 500.0) * 0.013)
        .chain([0.0, -5e-7])
        .collect();
    let mut xb = dev.buffer(1, x.len(), BufKind::F32).unwrap();
    dev.upload(&x, x.len(), &mut xb).unwrap();
    let mut out = dev.buffer(1, x.len(), BufKind::F32).unwrap();
    dev.unary(&xb, UnaryAct::Xielu(XIELU), &mut out).unwrap();
    let got = dev.download(&out).unwrap();
    for (&v, &g) in x.iter().zip(&got) {
        let want = xielu_f64(v);
        assert!(
            (g as f64 - want).abs() <= 1e-6 * (1.0 + want.abs()),
            "xielu({v}): {g} vs {want}"
        );
    }
    got
}

#[test]
fn xielu_on_the_cpu() {
    check_xielu(&CpuDevice::new(1, Bf16Kernel::F32).unwrap());
}

/// CUDA's `expm1f` is not the CPU's `exp_m1`: within an f32 ulp or two.
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
#[test]
fn xielu_on_cuda_matches_the_cpu() {
    use hsx::kernels::cuda::CudaDevice;
    use hsx::models::WeightDtype;
    if !crate::common::backends::cuda_usable() {
        return;
    }
    let gpu = check_xielu(&CudaDevice::new(0, WeightDtype::F32).unwrap());
    let cpu = check_xielu(&CpuDevice::new(1, Bf16Kernel::F32).unwrap());
    for (a, b) in gpu.iter().zip(&cpu) {
        assert!((a - b).abs() <= 2e-7 * (1.0 + b.abs()), "{a} vs {b}");
    }
}

/// `x · g` of columns 30..90 and 150..210 of 7 rows of 240 on `dev`: each product rounded
/// once, so every device gives the same bits; ranges of different widths are refused.
fn check_product_gate<D: Device>(dev: &D) {
    let (t, w) = (7, 240);
    let x = values(t * w, 5, 0.25);
    let mut xb = dev.buffer(t, w, BufKind::F32).unwrap();
    dev.upload(&x, w, &mut xb).unwrap();
    let mut out = dev.buffer(t, 60, BufKind::F32).unwrap();
    let (a, b) = (Cols::new(&xb, 30, 60), Cols::new(&xb, 150, 60));
    dev.gate(a, b, GateFn::Product, &mut out).unwrap();
    let want: Vec<f32> = (0..t)
        .flat_map(|r| (0..60).map(move |c| (r, c)))
        .map(|(r, c)| x[r * w + 30 + c] * x[r * w + 150 + c])
        .collect();
    assert_eq!(dev.download(&out).unwrap(), want);
    let narrow = Cols::new(&xb, 150, 59);
    assert!(dev.gate(a, narrow, GateFn::Product, &mut out).is_err());
    let past = Cols::new(&xb, 200, 60);
    assert!(dev.gate(a, past, GateFn::Product, &mut out).is_err());
}

#[test]
fn product_gate_on_the_cpu() {
    check_product_gate(&CpuDevice::new(1, Bf16Kernel::F32).unwrap());
}

#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
#[test]
fn product_gate_on_cuda() {
    use hsx::kernels::cuda::CudaDevice;
    use hsx::models::WeightDtype;
    if !crate::common::backends::cuda_usable() {
        return;
    }
    check_product_gate(&CudaDevice::new(0, WeightDtype::F32).unwrap());
}
