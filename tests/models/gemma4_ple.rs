//! The device ops Gemma 4 E2B / E4B added: RMSNorm per piece of each row (the per-layer
//! embeddings' norm), `gelu_tanh(x) · up` with `up` a column range of a wider buffer (each
//! layer's piece of the per-layer inputs), and the KV-sharing layers' missing caches. The
//! model end to end against transformers is the matrix's `gemma4_e2b`.

use crate::common;

use common::backends::{cpu_backend, cpu_options};
use hsx::kernels::device::{BufKind, Cols, GateFn, RowNorm};
use hsx::kernels::{Bf16Kernel, CpuDevice, Device};

fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i + seed) * 7919 % 1000) as f32 / 1000.0 - 0.5) * 12.0)
        .collect()
}

/// RMSNorm of each `w.len()`-wide piece of `x`'s rows, in f64.
fn pieces_normed(x: &[f32], w: &[f32], eps: f64) -> Vec<f64> {
    x.chunks(w.len())
        .flat_map(|p| {
            let ms = p.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / p.len() as f64;
            let r = 1.0 / (ms + eps).sqrt();
            p.iter()
                .zip(w)
                .map(move |(&v, &wi)| v as f64 * r * wi as f64)
        })
        .collect()
}

/// `gelu_tanh(x) · u` in f64 (torch's tanh approximation).
fn gelu_times(x: f32, u: f32) -> f64 {
    let x = x as f64;
    let z = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3));
    0.5 * x * (1.0 + z.tanh()) * u as f64
}

/// Both ops on `dev`: norm pieces of 8 in rows of 40, the gate over columns 16..24 of a
/// 40-wide buffer; the refusals (a weight that does not divide the row, columns past it).
fn check_ops<D: Device>(dev: &D, read: impl Fn(&D, &D::Buf) -> Vec<f32>) {
    let (t, width, d) = (6, 40, 8);
    let x = values(t * width, 3);
    let w = values(d, 11);
    let mut buf = dev.buffer(t, width, BufKind::F32).unwrap();
    dev.upload(&x, width, &mut buf).unwrap();
    let wv = dev.vector(&w).unwrap();
    let mut out = dev.buffer(t, width, BufKind::F32).unwrap();
    dev.norm(&buf, &wv, RowNorm::rms(1e-6), &mut out).unwrap();
    let got = dev.download(&out).unwrap();
    for (i, (g, want)) in got.iter().zip(pieces_normed(&x, &w, 1e-6)).enumerate() {
        assert!(
            (*g as f64 - want).abs() <= 1e-5,
            "norm [{i}]: {g} vs {want}"
        );
    }
    let odd = dev.vector(&values(7, 1)).unwrap();
    assert!(dev.norm(&buf, &odd, RowNorm::rms(1e-6), &mut out).is_err());

    let g = values(t * d, 5);
    let mut gate = dev.buffer(t, d, BufKind::F32).unwrap();
    dev.upload(&g, d, &mut gate).unwrap();
    let mut act = dev.buffer(t, d, BufKind::GemmIn).unwrap();
    let up = Cols::new(&buf, 2 * d, d);
    let gate_cols = Cols::new(&gate, 0, d);
    dev.gate(gate_cols, up, GateFn::GeluTanh, &mut act).unwrap();
    let got = read(dev, &act);
    for (i, v) in got.iter().enumerate() {
        let (row, c) = (i / d, i % d);
        let (a, u) = (g[i], x[row * width + 2 * d + c]);
        let want = gelu_times(a, u);
        let tol = 2e-6 * (1.0 + a.abs() as f64) * (u.abs() as f64).max(1.0);
        assert!((*v as f64 - want).abs() <= tol, "gate [{i}]: {v} vs {want}");
    }
    let past = Cols::new(&buf, width - d + 1, d);
    assert!(
        dev.gate(gate_cols, past, GateFn::GeluTanh, &mut act)
            .is_err()
    );
}

#[test]
fn piece_norm_and_gelu_gate_on_the_cpu() {
    let cpu = CpuDevice::new(1, Bf16Kernel::F32).unwrap();
    check_ops(&cpu, |d, b| d.download(b).unwrap());
}

#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
#[test]
fn piece_norm_and_gelu_gate_on_cuda() {
    use hsx::kernels::cuda::CudaDevice;
    use hsx::models::WeightDtype;
    if !common::backends::cuda_usable() {
        return;
    }
    let gpu = CudaDevice::new(0, WeightDtype::F32).unwrap();
    check_ops(&gpu, |d, b| d.download(b).unwrap());
}

/// The three KV-sharing layers of the E2B fixture (of 8) read layers 2's and 4's caches and
/// have none of their own.
#[test]
fn kv_sharing_layers_have_no_cache() {
    let backend = cpu_backend("gemma4_e2b", cpu_options(vec![0, 8], 16, 1));
    let shape = backend.cache_shape();
    assert_eq!(shape.kv_layers, 5);
    let g = backend.spec().gemma4.clone().unwrap();
    let from: Vec<Option<usize>> = g.kv_from.clone();
    assert_eq!(
        from,
        [None, None, None, None, None, Some(2), Some(4), Some(2)]
    );
}

/// The per-layer table is read where the checkpoint maps it: its rows are the stored matrix's
/// (the fixture's 512 × 8 layers × 8 values), and a wrong shape or a missing tensor is an error.
#[test]
fn per_layer_table_rows_are_read_from_the_checkpoint() {
    let w = hsx::models::Weights::open(&common::model_dir("gemma4_e2b")).unwrap();
    let name = "model.embed_tokens_per_layer.weight";
    let (rows, cols) = (512, 64);
    let table = w.table(name, rows, cols).unwrap();
    let all = w.matrix(name, rows, cols).unwrap().to_f32();
    let mut row = vec![0.0; cols];
    for r in [0, 1, 300, rows - 1] {
        table.row_into(r, &mut row).unwrap();
        assert_eq!(row, all[r * cols..(r + 1) * cols], "row {r}");
    }
    assert!(table.row_into(rows, &mut row).is_err());
    assert!(w.table(name, rows, cols + 1).is_err());
    assert!(w.table("model.no_such_table.weight", rows, cols).is_err());
}
