//! What Qwen4-Exp added: the hyper-connection steps and the n-gram gate ([`HyperOp`]) and the
//! rows of a table by id, each against an f64 reference on every device here; the files'
//! rows as wide as the streams, the final mixer giving transformers' last hidden state; and a
//! chunk of an n-gram model without the tokens before it refused. The models end to end
//! against transformers are the matrix's `qwen4_exp` and `qwen4_exp_ple`.

use crate::common;

use common::backends::{Paging, cpu_backend, cpu_options, layer_of};
use common::{Reference, max_rel};
use hsx::kernels::device::{BufKind, HostTable, HyperOp};
use hsx::kernels::{Backend, Batch, Bf16Kernel, CpuDevice, Device};

fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i + seed) * 7919 % 1000) as f32 / 1000.0 - 0.5) * 6.0)
        .collect()
}

fn sigmoid(v: f64) -> f64 {
    1.0 / (1.0 + (-v).exp())
}

/// Within `tol` relative to `scale` of each expected value.
fn close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g as f64 - w).abs() <= tol * (1.0 + w.abs()),
            "{what} [{i}]: {g} vs {w}"
        );
    }
}

/// Every step on `dev` for 5 rows of 3 streams of 8, and their refusals.
fn check_ops<D: Device>(dev: &D) {
    let (t, s, h) = (5, 3, 8);
    let w = s * h;
    let buf = |data: &[f32], width: usize| {
        let mut b = dev.buffer(t, width, BufKind::F32).unwrap();
        dev.upload(data, width, &mut b).unwrap();
        b
    };
    let (xv, nv, gv, yv) = (
        values(t * w, 1),
        values(t * w, 2),
        values(t * w, 3),
        values(t * h, 4),
    );
    let (x, n, g, y) = (buf(&xv, w), buf(&nv, w), buf(&gv, w), buf(&yv, h));
    let mut out = dev.buffer(t, w, BufKind::F32).unwrap();

    dev.hyper(HyperOp::Repeat {
        x: &y,
        streams: s,
        out: &mut out,
    })
    .unwrap();
    let want: Vec<f64> = (0..t * w).map(|i| yv[i / w * h + i % h] as f64).collect();
    close(&dev.download(&out).unwrap(), &want, 0.0, "repeat");

    let wts = values(w, 5);
    let wd = dev.vector(&wts).unwrap();
    dev.hyper(HyperOp::GroupNorm {
        x: &x,
        w: &wd,
        group: h,
        eps: 1e-6,
        out: &mut out,
    })
    .unwrap();
    let want: Vec<f64> = (xv.chunks(h).enumerate())
        .flat_map(|(p, piece)| {
            let ms = piece.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / h as f64;
            let r = 1.0 / (ms + 1e-6).sqrt();
            let wp = &wts[p % s * h..][..h];
            piece
                .iter()
                .zip(wp)
                .map(move |(&v, &wi)| v as f64 * r * wi as f64)
        })
        .collect();
    close(&dev.download(&out).unwrap(), &want, 1e-5, "group norm");
    let short = dev.vector(&wts[..h]).unwrap();
    let bad = HyperOp::GroupNorm {
        x: &x,
        w: &short,
        group: h,
        eps: 1e-6,
        out: &mut out,
    };
    assert!(dev.hyper(bad).is_err(), "a weight narrower than the rows");

    dev.hyper(HyperOp::SiluDiv {
        x: &x,
        divisor: 3.0,
        out: &mut out,
    })
    .unwrap();
    let want: Vec<f64> = (xv.iter())
        .map(|&v| (v / 3.0) as f64 * sigmoid((v / 3.0) as f64))
        .collect();
    close(&dev.download(&out).unwrap(), &want, 1e-6, "silu / 3");

    let mut mixed = dev.buffer(t, h, BufKind::F32).unwrap();
    let mix = HyperOp::Mix {
        normed: &n,
        gates: &g,
        streams: s,
        out: &mut mixed,
    };
    dev.hyper(mix).unwrap();
    let want: Vec<f64> = (0..t * h)
        .map(|i| {
            let (r, j) = (i / h, i % h);
            let e = |k: usize| r * w + k * h + j;
            (0..s)
                .map(|k| sigmoid(gv[e(k)] as f64) * nv[e(k)] as f64)
                .sum::<f64>()
                / s as f64
        })
        .collect();
    close(&dev.download(&mixed).unwrap(), &want, 1e-6, "mix");
    let bad = HyperOp::Mix {
        normed: &n,
        gates: &y,
        streams: s,
        out: &mut mixed,
    };
    assert!(dev.hyper(bad).is_err(), "gates narrower than the streams");

    let lv = values(t * s, 6);
    let logits = buf(&lv, s);
    let mut streams = buf(&xv, w);
    dev.hyper(HyperOp::Inject {
        x: &mut streams,
        logits: &logits,
        y: &y,
    })
    .unwrap();
    let want: Vec<f64> = (0..t * w)
        .map(|i| {
            let (r, k, j) = (i / w, i % w / h, i % h);
            let wk = 2.0 * sigmoid(lv[r * s + k] as f64 / s as f64);
            xv[i] as f64 + yv[r * h + j] as f64 * wk
        })
        .collect();
    close(&dev.download(&streams).unwrap(), &want, 1e-6, "inject");
    let bad = HyperOp::Inject {
        x: &mut streams,
        logits: &x,
        y: &y,
    };
    assert!(dev.hyper(bad).is_err(), "a logit per value, not per stream");

    let (key, query) = (&n, &g);
    dev.hyper(HyperOp::NgramGate {
        key,
        query,
        value: &y,
        out: &mut out,
    })
    .unwrap();
    let want: Vec<f64> = (0..t * w)
        .map(|i| {
            let (r, k, j) = (i / w, i % w / h, i % h);
            let e = |c: usize| r * w + k * h + c;
            let dot = (0..h)
                .map(|c| nv[e(c)] as f64 * gv[e(c)] as f64)
                .sum::<f64>();
            let g = dot / (h as f64).sqrt();
            let gate = sigmoid(g.abs().max(1e-6).sqrt() * g.signum());
            gate * yv[r * h + j] as f64
        })
        .collect();
    close(&dev.download(&out).unwrap(), &want, 1e-5, "n-gram gate");
    let bad = HyperOp::NgramGate {
        key,
        query: &y,
        value: &y,
        out: &mut out,
    };
    assert!(dev.hyper(bad).is_err(), "a query narrower than the key");

    // Rows of a 6 x 4 table by id, 2 ids per output row; an id past it refused.
    let tv = values(24, 7);
    let bytes: Vec<u8> = tv.iter().flat_map(|v| v.to_le_bytes()).collect();
    let host = HostTable::new(
        std::sync::Arc::new(bytes),
        0..96,
        hsx::models::WeightDtype::F32,
        (6, 4),
    );
    let table = dev.table(host.unwrap()).unwrap();
    let ids: [u32; 6] = [5, 0, 3, 3, 1, 2];
    let mut rows = dev.buffer(3, 8, BufKind::F32).unwrap();
    dev.table_rows(&table, &ids, 2, &mut rows).unwrap();
    let want: Vec<f64> = (ids.iter())
        .flat_map(|&r| tv[r as usize * 4..][..4].to_vec())
        .map(f64::from)
        .collect();
    close(&dev.download(&rows).unwrap(), &want, 0.0, "table rows");
    assert!(
        dev.table_rows(&table, &[6, 0], 2, &mut rows).is_err(),
        "id past the table"
    );
    assert!(
        dev.table_rows(&table, &[1, 0, 2], 2, &mut rows).is_err(),
        "a ragged last row"
    );
}

#[test]
fn hyper_connection_steps_on_the_cpu() {
    let cpu = CpuDevice::new(1, Bf16Kernel::F32).unwrap();
    cpu.run(|| check_ops(&cpu));
}

#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
#[test]
fn hyper_connection_steps_on_cuda() {
    use hsx::kernels::cuda::CudaDevice;
    use hsx::models::WeightDtype;
    if !common::backends::cuda_usable() {
        return;
    }
    let gpu = CudaDevice::new(0, WeightDtype::F32).unwrap();
    check_ops(&gpu);
}

/// The captured rows are the 4 streams of 64 (256 values per layer), not the hidden size, and
/// the final mixer of id L gives transformers' last hidden state (hidden-wide).
#[test]
fn rows_are_the_streams_and_the_mixer_gives_the_last_hidden_state() {
    for name in ["qwen4_exp", "qwen4_exp_ple"] {
        let reference = Reference::load(name);
        let mut be = cpu_backend(name, cpu_options(vec![0, 2, 4], 640, 4));
        assert_eq!(
            (be.hidden_size(), be.spec().hidden_size),
            (256, 64),
            "{name}"
        );
        for j in 0..reference.num_prompts() {
            let ids = reference.input_ids(j);
            let out = Paging::Hybrid.alone(&mut be, 0, &ids);
            let rows = out.captured_f32(3 * 256);
            let last = layer_of(&rows, 2, 3, 256);
            let mixed = be.final_norm(&last).unwrap();
            let hf_last = reference.f32(&format!("p{j}.hf_last"));
            let err = max_rel(&mixed, &hf_last);
            assert!(err <= 1e-5, "{name} p{j}: mixer(id L) vs hf_last {err:e}");
        }
    }
}

/// A chunk of the n-gram model that starts past position 0 without the tokens before it is
/// refused (its n-grams would be wrong), and the backend runs the next step.
#[test]
fn an_ngram_chunk_without_its_context_is_refused() {
    let mut be = cpu_backend("qwen4_exp_ple", cpu_options(vec![4], 640, 4));
    let p: Vec<u32> = (0..20).map(|i| (i * 37 % 500) as u32).collect();
    Paging::Hybrid.alone(&mut be, 0, &p[..10]);
    let seqs = [Paging::Hybrid.chunk(0, 10, 10, 20)];
    let batch = Batch {
        token_ids: &p[10..],
        seqs: &seqs,
    };
    let err = be.forward(&batch).unwrap_err().to_string();
    assert!(err.contains("context"), "{err}");
    let seqs = [Paging::Hybrid.chunk(0, 10, 10, 20).with_context(&p)];
    let batch = Batch {
        token_ids: &p[10..],
        seqs: &seqs,
    };
    assert!(be.forward(&batch).is_ok());
}
