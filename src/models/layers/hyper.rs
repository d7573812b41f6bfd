//! Hyper-connections (Qwen4-Exp's `Qwen4ExpTextGatedResidual`): the residual stream is `S`
//! copies of the hidden width side by side, `x = [x_1 | … | x_S]`. Around each sublayer, with
//! `n` the RMSNorm of each copy (zero-centred weights over all `S · H` values):
//! - input: `mean_k(sigmoid(up(silu(down(n) / S)))_k · n_k)` (hidden-wide, in place of the
//!   pre-norm);
//! - output `y`: `x_k += y · 2 · sigmoid(inject(n)_k / S)` for every copy.
//!
//! The model's last one (`hyper_connection_mixer`, no inject) makes the hidden-wide rows the
//! LM head reads, in place of the final norm.

use super::{Scratch, Widths};
use crate::kernels::Device;
use crate::kernels::device::{BufKind, DevResult, DeviceError, HyperOp};

/// One hyper-connection's weights.
pub struct HyperConnection<D: Device> {
    /// `1 + w` of `hc_norm`, `S · H` values (one `H`-wide group per copy).
    pub norm: D::Vector,
    /// `input_mix_weight_down` `[rank, S · H]`.
    pub down: D::Linear,
    /// `input_mix_weight_up` `[S · H, rank]`.
    pub up: D::Linear,
    /// `block_inject_weight` `[S, S · H]`; `None` for the final mixer.
    pub inject: Option<D::Linear>,
    pub streams: usize,
    pub hidden: usize,
    /// `input_mix_weight_down`'s rows.
    pub rank: usize,
    pub eps: f64,
}

/// The buffers of one hyper-connection step (`[T, S · H]` unless said).
pub struct HyperScratch<D: Device> {
    /// The normed copies, f32 (the mix reads them).
    pub normed: D::Buf,
    /// The same in the GEMMs' input kind.
    pub normed_in: D::Buf,
    /// `down(n)`, `[T, rank]` f32, then its activation in the GEMMs' kind.
    pub down: D::Buf,
    pub down_act: D::Buf,
    /// `up(…)` before its sigmoid.
    pub gates: D::Buf,
    /// `inject(n)` before its sigmoid, `[T, S]`.
    pub inject: D::Buf,
}

impl<D: Device> HyperScratch<D> {
    /// Buffers for `t` rows of `streams` copies of `hidden` and a `rank`-wide down-projection.
    pub fn new(
        dev: &D,
        (streams, hidden, rank): (usize, usize, usize),
        t: usize,
    ) -> DevResult<Self> {
        use BufKind::{F32, GemmIn};
        let wide = streams * hidden;
        Ok(Self {
            normed: dev.buffer(t, wide, F32)?,
            normed_in: dev.buffer(t, wide, GemmIn)?,
            down: dev.buffer(t, rank, F32)?,
            down_act: dev.buffer(t, rank, GemmIn)?,
            gates: dev.buffer(t, wide, F32)?,
            inject: dev.buffer(t, streams, F32)?,
        })
    }

    /// The hyper-connection buffers of a scratch made for a model with hyper-connections.
    pub(crate) fn of(h: &mut Option<Self>) -> DevResult<&mut Self> {
        h.as_mut()
            .ok_or_else(|| DeviceError::Invalid("hyper-connection without its buffers".into()))
    }
}

impl<D: Device> HyperConnection<D> {
    /// (streams, hidden, rank): the scratch this connection runs in.
    pub fn dims(&self) -> (usize, usize, usize) {
        (self.streams, self.hidden, self.rank)
    }

    pub(super) fn widths(&self) -> Widths {
        Widths {
            hyper: Some(self.dims()),
            ..Widths::default()
        }
    }

    /// `out` = the sublayer's input mixed from the copies in `x`, leaving the inject logits
    /// (when this connection has them) in `hs.inject` for [`Self::inject`].
    pub fn mix(
        &self,
        dev: &D,
        x: &D::Buf,
        hs: &mut HyperScratch<D>,
        out: &mut D::Buf,
    ) -> DevResult<()> {
        let (w, group, eps) = (&self.norm, self.hidden, self.eps);
        let normed = &mut hs.normed;
        dev.hyper(HyperOp::GroupNorm {
            x,
            w,
            group,
            eps,
            out: normed,
        })?;
        dev.cast(&hs.normed, &mut hs.normed_in)?;
        dev.matmul(&hs.normed_in, &self.down, &mut hs.down)?;
        let divisor = self.streams as f32;
        let act = &mut hs.down_act;
        dev.hyper(HyperOp::SiluDiv {
            x: &hs.down,
            divisor,
            out: act,
        })?;
        dev.matmul(&hs.down_act, &self.up, &mut hs.gates)?;
        if let Some(inject) = &self.inject {
            dev.matmul(&hs.normed_in, inject, &mut hs.inject)?;
        }
        let (normed, gates, streams) = (&hs.normed, &hs.gates, self.streams);
        dev.hyper(HyperOp::Mix {
            normed,
            gates,
            streams,
            out,
        })
    }

    /// `x_k += y · 2 · sigmoid(logits_k / S)` with the logits [`Self::mix`] left.
    pub fn inject(
        &self,
        dev: &D,
        x: &mut D::Buf,
        hs: &HyperScratch<D>,
        y: &D::Buf,
    ) -> DevResult<()> {
        if self.inject.is_none() {
            return Err(DeviceError::Invalid(
                "the final mixer injects nothing".into(),
            ));
        }
        dev.hyper(HyperOp::Inject {
            x,
            logits: &hs.inject,
            y,
        })
    }

    /// Around `sublayer` of the scratch `s`: mix the streams into `s.normed`, run it, add its
    /// output `s.proj` back into every stream.
    pub fn around(
        &self,
        dev: &D,
        s: &mut Scratch<D>,
        sublayer: impl FnOnce(&mut Scratch<D>) -> DevResult<()>,
    ) -> DevResult<()> {
        self.mix(dev, &s.x, HyperScratch::of(&mut s.hyper)?, &mut s.normed)?;
        sublayer(s)?;
        self.inject(dev, &mut s.x, HyperScratch::of(&mut s.hyper)?, &s.proj)
    }
}
