//! Gated DeltaNet (Qwen3.5 / Qwen3-Next linear attention): one fused projection
//! `[q k v | z | b | a]`, causal conv + SiLU over q k v with the request slot's conv state,
//! L2-normalised q / k and the gated delta rule token by token with the slot's state, the
//! per-head gated norm `w · norm(o) · silu(z)`, then `out_proj`.

use super::{Ctx, Scratch, Widths};
use crate::kernels::Device;
use crate::kernels::device::{Cols, ConvCall, DevResult, GdnDims, GdnParams};

pub struct GatedDeltaNet<D: Device> {
    /// `[q (nk·dk) | k (nk·dk) | v (nv·dv) | z (nv·dv) | b (nv) | a (nv)]` rows.
    pub in_proj: D::Linear,
    /// `[conv_dim, kernel]`.
    pub conv_w: D::Vector,
    pub conv_kernel: usize,
    /// `-exp(A_log)`.
    pub neg_a: D::Vector,
    pub dt_bias: D::Vector,
    /// `[dv]`, the per-head gated norm.
    pub norm: D::Vector,
    pub out_proj: D::Linear,
    pub dims: GdnDims,
    pub eps: f64,
    /// This layer's index among the recurrent layers.
    pub state_layer: usize,
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
        (
            (self.conv_kernel - 1) * self.conv_dim(),
            d.nv * d.dk * d.dv,
        )
    }

    pub(super) fn widths(&self) -> Widths {
        let (cd, vd) = (self.conv_dim(), self.value_dim());
        Widths {
            wide: cd + vd + 2 * self.dims.nv,
            conv: cd,
            mid: vd,
            act: vd,
            moe: None,
        }
    }

    pub(super) fn forward(
        &self,
        dev: &D,
        ctx: &mut Ctx<'_, '_, D>,
        s: &mut Scratch<D>,
    ) -> DevResult<()> {
        let (cd, vd, nv) = (self.conv_dim(), self.value_dim(), self.dims.nv);
        dev.matmul(&s.normed, &self.in_proj, &mut s.wide)?;
        let cols = |col, width| Cols {
            buf: &s.wide,
            col,
            width,
        };
        let conv = ConvCall {
            state_layer: self.state_layer,
            weight: &self.conv_w,
            bias: None,
            kernel: self.conv_kernel,
        };
        let step = ctx.step;
        let states = ctx.states()?;
        dev.conv1d_silu(step, states, cols(0, cd), &conv, &mut s.conv)?;
        let params = GdnParams {
            dims: self.dims,
            neg_a: &self.neg_a,
            dt_bias: &self.dt_bias,
        };
        let ba = (cols(cd + vd, nv), cols(cd + vd + nv, nv));
        let l = self.state_layer;
        dev.gated_delta_rule(step, states, l, &mut s.conv, ba, &params, &mut s.mid)?;
        dev.gdn_gated_norm(&s.mid, cols(cd, vd), &self.norm, self.eps, &mut s.act)?;
        dev.matmul(&s.act, &self.out_proj, &mut s.proj)
    }
}
