//! Gated DeltaNet (Qwen3.5 / Qwen3-Next linear attention): one fused projection
//! `[q k v | z | b | a]`, causal conv + SiLU over q k v with the request slot's conv state,
//! L2-normalised q / k and the gated delta rule token by token with the slot's state, the
//! per-head gated norm `w · norm(o) · silu(z)`, then `out_proj`.

use super::{CausalConv, Ctx, Scratch, Widths};
use crate::kernels::Device;
use crate::kernels::device::{Cols, DevResult, GdnDims, GdnParams, NormGate};

pub struct GatedDeltaNet<D: Device> {
    /// `[q (nk·dk) | k (nk·dk) | v (nv·dv) | z (nv·dv) | b (nv) | a (nv)]` rows.
    pub in_proj: D::Linear,
    /// Over `[q | k | v]`.
    pub conv: CausalConv<D>,
    /// `-exp(A_log)`.
    pub neg_a: D::Vector,
    pub dt_bias: D::Vector,
    /// `[dv]`, the per-head gated norm.
    pub norm: D::Vector,
    pub out_proj: D::Linear,
    pub dims: GdnDims,
    /// The gated norm's epsilon.
    pub eps: f64,
    /// `beta = beta_scale · sigmoid(b)` ([`GdnParams::beta_scale`]).
    pub beta_scale: f32,
    /// The output norm's gate (`silu(z)`; Qwen4-Exp's may be `sigmoid(z)`).
    pub gate: NormGate,
}

impl<D: Device> GatedDeltaNet<D> {
    fn conv_dim(&self) -> usize {
        let d = self.dims;
        2 * d.nk * d.dk + d.nv * d.dv
    }

    fn value_dim(&self) -> usize {
        self.dims.nv * self.dims.dv
    }

    /// (conv floats, state floats) per slot.
    pub fn state_shape(&self) -> (usize, usize) {
        let d = self.dims;
        (self.conv.state_floats(self.conv_dim()), d.nv * d.dk * d.dv)
    }

    pub(super) fn widths(&self) -> Widths {
        let (cd, vd) = (self.conv_dim(), self.value_dim());
        Widths {
            wide: cd + vd + 2 * self.dims.nv,
            conv: cd,
            mid: vd,
            act: vd,
            ..Widths::default()
        }
    }

    pub(super) fn forward(
        &self,
        dev: &D,
        ctx: &mut Ctx<'_, '_, D>,
        s: &mut Scratch<D>,
    ) -> DevResult<()> {
        let (cd, vd, nv) = (self.conv_dim(), self.value_dim(), self.dims.nv);
        self.conv.project(dev, ctx, s, &self.in_proj, (0, cd))?;
        let cols = |col, width| Cols::new(&s.wide, col, width);
        let params = GdnParams {
            dims: self.dims,
            neg_a: &self.neg_a,
            dt_bias: &self.dt_bias,
            beta_scale: self.beta_scale,
            per_channel: false,
        };
        let ba = (cols(cd + vd, nv), cols(cd + vd + nv, nv));
        let (step, l) = (ctx.step, self.conv.state_layer);
        dev.gated_delta_rule(step, ctx.states()?, l, &mut s.conv, ba, &params, &mut s.mid)?;
        let norm = (self.eps, self.gate);
        dev.gdn_gated_norm(&s.mid, cols(cd, vd), &self.norm, norm, &mut s.act)?;
        dev.matmul(&s.act, &self.out_proj, &mut s.proj)
    }
}
