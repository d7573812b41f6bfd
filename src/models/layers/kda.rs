//! Kimi Delta Attention (Kimi Linear's `linear_attention`): Gated DeltaNet with a decay per
//! key channel. `[q | k | v | b]` from one stacked projection, causal conv + SiLU over q k v
//! with the slot's conv state; the forget gate `f_b(f_a(x))` gives each channel's decay
//! `exp(-exp(A_log) · softplus(f + dt_bias))`, `beta = sigmoid(b)`; L2-normalised q / k and the
//! delta rule token by token with the slot's state ([`crate::kernels::Device::gated_delta_rule`]
//! with `per_channel`); the output gate `g_b(g_a(x))` through the per-head norm
//! `w · norm(o) · sigmoid(gate)`, then `o_proj`. The low-rank pairs run as two GEMMs each, the
//! rank-wide rows rounded to the GEMM input dtype between them (as transformers' bf16 runs).

use super::{CausalConv, Ctx, Scratch, Widths};
use crate::kernels::Device;
use crate::kernels::device::{Cols, DevResult, GdnDims, GdnParams, NormGate};

/// A rank-`r` linear map `b(a(x))`: `a` `[r, hidden]`, `b` `[out, r]`.
pub struct LowRank<D: Device> {
    pub a: D::Linear,
    pub b: D::Linear,
}

pub struct KimiDeltaAttention<D: Device> {
    /// `[q (h·d) | k (h·d) | v (h·d) | b (h)]` rows.
    pub in_proj: D::Linear,
    /// Over `[q | k | v]`.
    pub conv: CausalConv<D>,
    /// The forget gate's `f_a_proj` / `f_b_proj` (`h·d` channels).
    pub forget: LowRank<D>,
    /// The output gate's `g_a_proj` / `g_b_proj`.
    pub gate: LowRank<D>,
    /// `-exp(A_log)` per head.
    pub neg_a: D::Vector,
    /// `[h·d]`, per channel.
    pub dt_bias: D::Vector,
    /// `[d]`, the per-head output norm.
    pub norm: D::Vector,
    pub o_proj: D::Linear,
    /// Heads (q, k and v alike) and their dim.
    pub heads: usize,
    pub head_dim: usize,
    /// The low-rank gates' rank (`head_dim` in Kimi Linear).
    pub rank: usize,
    pub eps: f64,
}

impl<D: Device> KimiDeltaAttention<D> {
    fn channels(&self) -> usize {
        self.heads * self.head_dim
    }

    fn dims(&self) -> GdnDims {
        let (h, d) = (self.heads, self.head_dim);
        GdnDims {
            nk: h,
            nv: h,
            dk: d,
            dv: d,
        }
    }

    /// (conv floats, state floats) per slot.
    pub fn state_shape(&self) -> (usize, usize) {
        let c = self.channels();
        (self.conv.state_floats(3 * c), c * self.head_dim)
    }

    pub(super) fn widths(&self) -> Widths {
        let c = self.channels();
        Widths {
            wide: 3 * c + self.heads,
            conv: 3 * c,
            mid: c,
            act: c.max(self.rank),
            aux: c.max(self.rank),
            ..Widths::default()
        }
    }

    /// `lr.b(lr.a(s.normed))` into `s.aux` (the rank-wide rows through `s.aux` and `s.act`).
    fn low_rank(dev: &D, lr: &LowRank<D>, s: &mut Scratch<D>) -> DevResult<()> {
        dev.matmul(&s.normed, &lr.a, &mut s.aux)?;
        dev.cast(&s.aux, &mut s.act)?;
        dev.matmul(&s.act, &lr.b, &mut s.aux)
    }

    /// `[q k v b]` into `s.wide`, the conv into `s.conv`, the decay's input into `s.aux`, the
    /// delta rule into `s.mid`, the output gate into `s.aux`, the norm into `s.act`, `o_proj`
    /// into `s.proj`.
    pub(super) fn forward(
        &self,
        dev: &D,
        ctx: &mut Ctx<'_, '_, D>,
        s: &mut Scratch<D>,
    ) -> DevResult<()> {
        let c = self.channels();
        self.conv.project(dev, ctx, s, &self.in_proj, (0, 3 * c))?;
        Self::low_rank(dev, &self.forget, s)?;
        let params = GdnParams {
            dims: self.dims(),
            neg_a: &self.neg_a,
            dt_bias: &self.dt_bias,
            beta_scale: 1.0,
            per_channel: true,
        };
        let beta_alpha = (
            Cols::new(&s.wide, 3 * c, self.heads),
            Cols::new(&s.aux, 0, c),
        );
        let (step, l) = (ctx.step, self.conv.state_layer);
        dev.gated_delta_rule(
            step,
            ctx.states()?,
            l,
            &mut s.conv,
            beta_alpha,
            &params,
            &mut s.mid,
        )?;
        Self::low_rank(dev, &self.gate, s)?;
        let norm = (self.eps, NormGate::Sigmoid);
        dev.gdn_gated_norm(
            &s.mid,
            Cols::new(&s.aux, 0, c),
            &self.norm,
            norm,
            &mut s.act,
        )?;
        dev.matmul(&s.act, &self.o_proj, &mut s.proj)
    }
}
