//! The CPU device's hyper-connection steps ([`HyperOp`]): the body of `CpuDevice::hyper`.
//! Rows are independent (each row's arithmetic is fixed whatever shares the batch), so rows
//! run in parallel.

use rayon::prelude::*;

use super::{CpuBuf, CpuDevice, set};
use crate::kernels::cpu::exp::silu_inplace;
use crate::kernels::cpu::norm::rms_norm_row;
use crate::kernels::cpu::recurrent::sigmoid;
use crate::kernels::device::{
    DevResult, HyperOp, hyper_group_norm_fits, hyper_hidden, hyper_same_shape, hyper_streams,
};

pub(super) fn hyper(op: HyperOp<'_, CpuDevice>) -> DevResult<()> {
    match op {
        HyperOp::Repeat { x, streams, out } => repeat(x, streams, out),
        HyperOp::GroupNorm {
            x,
            w,
            group,
            eps,
            out,
        } => {
            hyper_group_norm_fits(w.len(), group, x.width)?;
            out.data.resize(x.data.len(), 0.0);
            (out.data.par_chunks_mut(x.width.max(1)))
                .zip(x.data.par_chunks(x.width.max(1)))
                .for_each(|(o, row)| {
                    let pieces = o.chunks_exact_mut(group).zip(row.chunks_exact(group));
                    for ((o, xs), w) in pieces.zip(w.chunks_exact(group)) {
                        rms_norm_row(xs, w, eps, o);
                    }
                });
            set(out, x.width);
            Ok(())
        }
        HyperOp::SiluDiv { x, divisor, out } => {
            out.data.clear();
            out.data.extend(x.data.iter().map(|&v| v / divisor));
            silu_inplace(&mut out.data);
            set(out, x.width);
            Ok(())
        }
        HyperOp::Mix {
            normed,
            gates,
            streams,
            out,
        } => mix(normed, gates, streams, out),
        HyperOp::Inject { x, logits, y } => inject(x, logits, y),
        HyperOp::NgramGate {
            key,
            query,
            value,
            out,
        } => ngram_gate(key, query, value, out),
    }
}

fn repeat(x: &CpuBuf, streams: usize, out: &mut CpuBuf) -> DevResult<()> {
    let h = x.width;
    out.data.resize(x.data.len() * streams, 0.0);
    if h > 0 {
        (out.data.par_chunks_mut(h * streams))
            .zip(x.data.par_chunks(h))
            .for_each(|(o, row)| o.chunks_exact_mut(h).for_each(|s| s.copy_from_slice(row)));
    }
    set(out, h * streams);
    Ok(())
}

/// torch's `(sigmoid(gates) · normed).mean(dim=streams)`: the products summed stream by
/// stream in order, times `1 / S`.
fn mix(normed: &CpuBuf, gates: &CpuBuf, streams: usize, out: &mut CpuBuf) -> DevResult<()> {
    let width = normed.width;
    let shape = |b: &CpuBuf| (b.rows(), b.width);
    hyper_same_shape(shape(normed), shape(gates), "hyper-connection mix")?;
    let h = hyper_hidden(width, streams, "hyper-connection mix")?;
    let inv = 1.0 / streams as f32;
    out.data.resize(normed.rows() * h, 0.0);
    (out.data.par_chunks_mut(h))
        .zip(normed.data.par_chunks(width))
        .zip(gates.data.par_chunks(width))
        .for_each(|((o, n), g)| {
            for (j, o) in o.iter_mut().enumerate() {
                let mut acc = 0.0f32;
                for k in 0..streams {
                    acc += sigmoid(g[k * h + j]) * n[k * h + j];
                }
                *o = acc * inv;
            }
        });
    set(out, h);
    Ok(())
}

/// Per stream k: `sigmoid(signed_sqrt((key_k · query_k) / √H)) · value`, the dot product
/// summed in order.
fn ngram_gate(key: &CpuBuf, query: &CpuBuf, value: &CpuBuf, out: &mut CpuBuf) -> DevResult<()> {
    let (width, h) = (key.width, value.width);
    let what = "n-gram gate";
    hyper_same_shape((key.rows(), width), (query.rows(), query.width), what)?;
    hyper_same_shape((key.rows(), 1), (value.rows(), 1), what)?;
    hyper_streams(width, h, what)?;
    let root = (h as f32).sqrt();
    out.data.resize(key.data.len(), 0.0);
    (out.data.par_chunks_mut(width))
        .zip(key.data.par_chunks(width))
        .zip(query.data.par_chunks(width))
        .zip(value.data.par_chunks(h))
        .for_each(|(((o, k), q), v)| {
            let streams = o
                .chunks_exact_mut(h)
                .zip(k.chunks_exact(h).zip(q.chunks_exact(h)));
            for (o, (k, q)) in streams {
                let dot = k.iter().zip(q).fold(0.0f32, |acc, (a, b)| acc + a * b) / root;
                // `max` would drop a NaN: it stays one, as in torch.
                let mag = if dot.is_nan() {
                    dot
                } else {
                    dot.abs().max(1e-6).sqrt()
                };
                let g = sigmoid(mag * sign(dot));
                for (o, &v) in o.iter_mut().zip(v) {
                    *o = g * v;
                }
            }
        });
    set(out, width);
    Ok(())
}

/// torch's `sign`: -1, 0 or 1 (0 for ±0).
fn sign(v: f32) -> f32 {
    match v {
        v if v > 0.0 => 1.0,
        v if v < 0.0 => -1.0,
        _ => 0.0,
    }
}

/// `x_k += y · (2 · sigmoid(l_k / S))`, as transformers multiplies then adds.
fn inject(x: &mut CpuBuf, logits: &CpuBuf, y: &CpuBuf) -> DevResult<()> {
    let (streams, h) = (logits.width, y.width);
    let what = "hyper-connection inject";
    hyper_same_shape((x.rows(), x.width), (y.rows(), streams * h), what)?;
    hyper_same_shape((logits.rows(), streams), (y.rows(), streams), what)?;
    hyper_streams(x.width, h, what)?;
    let divisor = streams as f32;
    (x.data.par_chunks_mut(x.width))
        .zip(logits.data.par_chunks(streams))
        .zip(y.data.par_chunks(h))
        .for_each(|((x, l), y)| {
            for (xs, &l) in x.chunks_exact_mut(h).zip(l) {
                let w = 2.0 * sigmoid(l / divisor);
                for (v, &yv) in xs.iter_mut().zip(y) {
                    *v += yv * w;
                }
            }
        });
    Ok(())
}
