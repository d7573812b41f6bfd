//! Qwen4-Exp's hyper-connections on CUDA: the steps ([`HyperOp`]) checked on the host, then
//! launched (hyper.cu; the grouped norm in norm.cu).

use super::context::{CudaResult, LaunchConfig, elems_cfg, launch, rows_cfg};
use super::device::CudaDevice;
use super::device_types::{CudaBuf, invalid};

use super::ops::{i32_of, suffix};
use crate::kernels::device::{
    DevResult, HyperOp, hyper_group_norm_fits, hyper_hidden, hyper_same_shape, hyper_streams,
};

fn shape(b: &CudaBuf) -> (usize, usize) {
    (b.rows(), b.width())
}

impl CudaDevice {
    pub(super) fn hyper_op(&self, op: HyperOp<'_, Self>) -> DevResult<()> {
        match op {
            HyperOp::Repeat { x, streams, out } => {
                x.f32("hyper-connection repeat")?;
                out.f32("hyper-connection repeat output")?;
                let width = x.width() * streams;
                hyper_streams(width, x.width(), "hyper-connection repeat")?;
                out.set(x.rows(), width, "hyper-connection repeat")?;
                let (h, s) = (i32_of(x.width(), "hidden")?, i32_of(streams, "streams")?);
                Ok(launch_elems(out.len(), |cfg| {
                    launch!(
                        &self.gpu,
                        "hyper_repeat",
                        cfg,
                        x.ptr(),
                        out.ptr(),
                        h,
                        s,
                        total(out)
                    )
                })?)
            }
            HyperOp::GroupNorm {
                x,
                w,
                group,
                eps,
                out,
            } => {
                x.f32("hyper-connection norm")?;
                out.f32("hyper-connection norm output")?;
                hyper_group_norm_fits(w.len(), group, x.width())?;
                out.set(x.rows(), x.width(), "hyper-connection norm")?;
                let groups = x.width() / group;
                let (n, g) = (i32_of(group, "group")?, i32_of(groups, "groups")?);
                if x.rows() == 0 {
                    return Ok(());
                }
                let cfg = rows_cfg(x.rows() * groups, 256)?;
                let (xp, wp, op) = (x.ptr(), w.ptr(), out.ptr());
                Ok(launch!(
                    &self.gpu,
                    "group_rms_norm_f32",
                    cfg,
                    xp,
                    wp,
                    op,
                    n,
                    g,
                    eps
                )?)
            }
            HyperOp::SiluDiv { x, divisor, out } => {
                x.f32("silu_div")?;
                out.set(x.rows(), x.width(), "silu_div")?;
                let name = format!("silu_div_{}", suffix(out.dtype()));
                Ok(launch_elems(out.len(), |cfg| {
                    let (xp, op) = (x.ptr(), out.ptr());
                    launch!(&self.gpu, &name => "silu_div_f32", cfg, xp, op, divisor, total(out))
                })?)
            }
            HyperOp::Mix {
                normed,
                gates,
                streams,
                out,
            } => {
                normed.f32("hyper-connection mix")?;
                gates.f32("hyper-connection mix gates")?;
                hyper_same_shape(shape(normed), shape(gates), "hyper-connection mix")?;
                let width = normed.width();
                let h = hyper_hidden(width, streams, "hyper-connection mix")?;
                out.set(normed.rows(), h, "hyper-connection mix")?;
                let name = format!("hyper_mix_{}", suffix(out.dtype()));
                let (hh, s) = (i32_of(h, "hidden")?, i32_of(streams, "streams")?);
                Ok(launch_elems(out.len(), |cfg| {
                    let (np, gp, op) = (normed.ptr(), gates.ptr(), out.ptr());
                    let t = total(out);
                    launch!(&self.gpu, &name => "hyper_mix_f32", cfg, np, gp, op, hh, s, t)
                })?)
            }
            HyperOp::NgramGate {
                key,
                query,
                value,
                out,
            } => {
                let what = "n-gram gate";
                for b in [key, query, value] {
                    b.f32(what)?;
                }
                out.f32(what)?;
                let (width, h) = (key.width(), value.width());
                hyper_same_shape(shape(key), shape(query), what)?;
                hyper_same_shape((key.rows(), 1), (value.rows(), 1), what)?;
                let streams = hyper_streams(width, h, what)?;
                out.set(key.rows(), width, what)?;
                if key.rows() == 0 {
                    return Ok(());
                }
                let cfg = LaunchConfig {
                    grid_dim: (grid(key.rows())?, grid(streams)?, 1),
                    block_dim: (32, 1, 1),
                    shared_mem_bytes: 0,
                };
                let (kp, qp, vp, op) = (key.ptr(), query.ptr(), value.ptr(), out.ptr());
                let (hh, s) = (i32_of(h, "hidden")?, i32_of(streams, "streams")?);
                Ok(launch!(
                    &self.gpu,
                    "ngram_gate",
                    cfg,
                    kp,
                    qp,
                    vp,
                    op,
                    hh,
                    s
                )?)
            }
            HyperOp::Inject { x, logits, y } => {
                let what = "hyper-connection inject";
                x.f32(what)?;
                logits.f32(what)?;
                y.f32(what)?;
                let (streams, h) = (logits.width(), y.width());
                hyper_same_shape(shape(x), (y.rows(), streams * h), what)?;
                hyper_same_shape(shape(logits), (y.rows(), streams), what)?;
                hyper_streams(x.width(), h, what)?;
                let (hh, s) = (i32_of(h, "hidden")?, i32_of(streams, "streams")?);
                Ok(launch_elems(x.len(), |cfg| {
                    let (xp, lp, yp) = (x.ptr(), logits.ptr(), y.ptr());
                    launch!(&self.gpu, "hyper_inject", cfg, xp, lp, yp, hh, s, total(x))
                })?)
            }
        }
    }
}

/// `launch(cfg)` over `total` elements, nothing when there are none.
fn launch_elems(
    total: usize,
    launch: impl FnOnce(LaunchConfig) -> CudaResult<()>,
) -> CudaResult<()> {
    match total {
        0 => Ok(()),
        n => launch(elems_cfg(n)?),
    }
}

/// `n` as a launch grid dimension.
fn grid(n: usize) -> DevResult<u32> {
    u32::try_from(n).or_else(|_| invalid(format!("{n} exceeds a launch grid")))
}

/// Elements of `b` as the kernels' `long long` count.
fn total(b: &CudaBuf) -> i64 {
    // A buffer that fits in device memory has fewer than i64::MAX elements.
    b.len() as i64
}
