//! Device ops of single architectures against f64 references, on the CPU and on CUDA: Cohere's
//! LayerNorm (no bias) and StarCoder2's (`nn.LayerNorm`, with one), `norm` and the residual add
//! fused with it, over rows whose mean is far from zero (which an RMSNorm would keep); Apertus'
//! xIELU activation on both branches and StarCoder2's tanh GELU; LFM2's product gate of two
//! column ranges of one buffer; OLMo's clamp (`clip_qkv`). The models end to end against
//! transformers are the matrix's `cohere*`, `apertus*`, `starcoder2*`, `lfm*` and `olmo`
//! fixtures.

use hsx::kernels::device::{BufKind, Cols, GateFn, NormKind, RowNorm, UnaryAct, Xielu};
use hsx::kernels::{Bf16Kernel, CpuDevice, Device};

const EPS: f64 = 1e-5;

fn values(n: usize, seed: usize, offset: f32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i + seed) * 7919 % 1000) as f32 / 1000.0 - 0.5) * 6.0 + offset)
        .collect()
}

/// `w · (x - mean) / sqrt(var + eps) + b` of each `w.len()`-wide row, in f64 (`b`: 0 where
/// empty).
fn layer_normed(x: &[f32], w: &[f32], b: &[f32]) -> Vec<f64> {
    x.chunks(w.len())
        .flat_map(|row| {
            let n = row.len() as f64;
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / n;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
            let r = 1.0 / (var + EPS).sqrt();
            let bias = |i: usize| b.get(i).map_or(0.0, |&v| v as f64);
            (row.iter().zip(w).enumerate())
                .map(move |(i, (&v, &wi))| (v as f64 - mean) * r * wi as f64 + bias(i))
        })
        .collect()
}

/// Both forms on `dev` over 5 rows of 300 (a width no block or vector divides): `norm` of
/// `x`, then `x += y` fused with the norm of the sum; returns the two outputs. `kind`: without
/// a bias (Cohere's) or with one (`nn.LayerNorm`: the vector `[w | b]`).
fn check<D: Device>(dev: &D, kind: NormKind) -> (Vec<f32>, Vec<f32>) {
    let (t, d) = (5, 300);
    let layer = RowNorm { kind, eps: EPS };
    let (x, y, w) = (
        values(t * d, 3, 40.0),
        values(t * d, 8, -1.5),
        values(d, 11, 1.0),
    );
    let b = match kind {
        NormKind::LayerBias => values(d, 17, 0.3),
        _ => Vec::new(),
    };
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
    let wv = dev.vector(&[w.clone(), b.clone()].concat()).unwrap();
    let mut out = dev.buffer(t, d, BufKind::F32).unwrap();
    dev.norm(&xb, &wv, layer, &mut out).unwrap();
    let normed = dev.download(&out).unwrap();
    close(&normed, layer_normed(&x, &w, &b), "norm");
    dev.add_norm(&mut xb, &yb, &wv, layer, &mut out).unwrap();
    let sum: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
    assert_eq!(dev.download(&xb).unwrap(), sum, "the residual add");
    let fused = dev.download(&out).unwrap();
    close(&fused, layer_normed(&sum, &w, &b), "add_norm");
    // A LayerNorm is not an RMSNorm of the same rows.
    let w_only = dev.vector(&w).unwrap();
    dev.norm(&xb, &w_only, RowNorm::rms(EPS), &mut out).unwrap();
    assert!(dev.download(&out).unwrap() != fused);
    (normed, fused)
}

const KINDS: [NormKind; 2] = [NormKind::Layer, NormKind::LayerBias];

#[test]
fn layer_norm_on_the_cpu() {
    for kind in KINDS {
        check(&CpuDevice::new(1, Bf16Kernel::F32).unwrap(), kind);
    }
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
    for kind in KINDS {
        let gpu = check(&CudaDevice::new(0, WeightDtype::F32).unwrap(), kind);
        let cpu = check(&CpuDevice::new(1, Bf16Kernel::F32).unwrap(), kind);
        for (g, c) in [(gpu.0, cpu.0), (gpu.1, cpu.1)] {
            for (a, b) in g.iter().zip(&c) {
                assert!(
                    (a - b).abs() <= 4e-6 * (1.0 + b.abs()),
                    "{kind:?}: {a} vs {b}"
                );
            }
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

/// The tanh GELU in f64: `x / 2 · (1 + tanh(√(2/π) · (x + 0.044715 x³)))`.
fn gelu_tanh_f64(x: f32) -> f64 {
    let x = x as f64;
    let inner = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
    0.5 * x * (1.0 + inner.tanh())
}

/// `f` over values on both sides of zero (and within xIELU's `eps` of it) on `dev`, against
/// `want` in f64: 5001 values, more than one of the CPU's parallel chunks.
fn check_unary<D: Device>(dev: &D, f: UnaryAct, want: fn(f32) -> f64) -> Vec<f32> {
    let x: Vec<f32> = (0..5000)
        .map(|i| (i as f32 - 2500.0) * 0.0026)
        .chain([0.0, -5e-7])
        .collect();
    let mut xb = dev.buffer(1, x.len(), BufKind::F32).unwrap();
    dev.upload(&x, x.len(), &mut xb).unwrap();
    let mut out = dev.buffer(1, x.len(), BufKind::F32).unwrap();
    dev.unary(&xb, f, &mut out).unwrap();
    let got = dev.download(&out).unwrap();
    for (&v, &g) in x.iter().zip(&got) {
        let want = want(v);
        assert!(
            (g as f64 - want).abs() <= 1e-6 * (1.0 + want.abs()),
            "{f:?}({v}): {g} vs {want}"
        );
    }
    got
}

fn check_xielu<D: Device>(dev: &D) -> Vec<f32> {
    check_unary(dev, UnaryAct::Xielu(XIELU), xielu_f64)
}

fn check_gelu_tanh<D: Device>(dev: &D) -> Vec<f32> {
    check_unary(dev, UnaryAct::GeluTanh, gelu_tanh_f64)
}

#[test]
fn xielu_on_the_cpu() {
    check_xielu(&CpuDevice::new(1, Bf16Kernel::F32).unwrap());
}

/// StarCoder2's activation: the GeGLU's arithmetic with a unit gate, the same bits as it.
#[test]
fn gelu_tanh_on_the_cpu_is_the_geglus_with_a_unit_gate() {
    let cpu = CpuDevice::new(1, Bf16Kernel::F32).unwrap();
    let got = check_gelu_tanh(&cpu);
    let n = got.len();
    let x: Vec<f32> = (0..n).map(|i| (i as f32 - 2500.0) * 0.0026).collect();
    let gu: Vec<f32> = [x, vec![1.0; n]].concat();
    let mut gb = cpu.buffer(1, 2 * n, BufKind::F32).unwrap();
    cpu.upload(&gu, 2 * n, &mut gb).unwrap();
    let mut out = cpu.buffer(1, n, BufKind::F32).unwrap();
    cpu.gelu_tanh_mul(&gb, &mut out).unwrap();
    let geglu = cpu.download(&out).unwrap();
    assert_eq!(got[..n - 2], geglu[..n - 2]);
}

/// The CUDA kernel is the CPU's arithmetic (`gelu_tanh_times`), up to `expf`'s last ulp.
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
#[test]
fn gelu_tanh_on_cuda_matches_the_cpu() {
    use hsx::kernels::cuda::CudaDevice;
    use hsx::models::WeightDtype;
    if !crate::common::backends::cuda_usable() {
        return;
    }
    let gpu = check_gelu_tanh(&CudaDevice::new(0, WeightDtype::F32).unwrap());
    let cpu = check_gelu_tanh(&CpuDevice::new(1, Bf16Kernel::F32).unwrap());
    for (a, b) in gpu.iter().zip(&cpu) {
        assert!((a - b).abs() <= 2e-7 * (1.0 + b.abs()), "{a} vs {b}");
    }
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

/// OLMo's `clip_qkv` on `dev`: values past ±2.5 to the limit, the rest (±0 and the limit
/// itself included) and NaN unchanged, as torch's `clamp_`; the same bits on every device.
fn check_clamp<D: Device>(dev: &D) {
    let mut x = values(3 * 70, 11, 0.5);
    x.extend([
        2.5,
        -2.5,
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ]);
    let mut xb = dev.buffer(1, x.len(), BufKind::F32).unwrap();
    dev.upload(&x, x.len(), &mut xb).unwrap();
    dev.clamp(&mut xb, 2.5).unwrap();
    let got = dev.download(&xb).unwrap();
    let (last, n) = (got[got.len() - 1], got.len() - 1);
    assert!(last.is_nan(), "NaN clamped to {last}");
    let want: Vec<f32> = x[..n].iter().map(|v| v.clamp(-2.5, 2.5)).collect();
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got[..n]), bits(&want));
    assert!(x[..n].iter().any(|v| v.abs() > 2.5) && x[..n].iter().any(|v| v.abs() < 2.5));
}

#[test]
fn clamp_on_the_cpu() {
    check_clamp(&CpuDevice::new(1, Bf16Kernel::F32).unwrap());
}

#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
#[test]
fn clamp_on_cuda() {
    use hsx::kernels::cuda::CudaDevice;
    use hsx::models::WeightDtype;
    if !crate::common::backends::cuda_usable() {
        return;
    }
    check_clamp(&CudaDevice::new(0, WeightDtype::F32).unwrap());
}
