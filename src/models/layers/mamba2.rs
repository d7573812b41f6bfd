//! Mamba-2 (Nemotron-H): `in_proj` -> `[z (inner) | xBC (conv_dim) | dt (heads)]`; causal
//! conv + SiLU over xBC with the request slot's conv state; the selective scan token by token
//! with `dt` clamped to `time_step_min`; `y · silu(z)`, then RMSNorm per group; `out_proj`.

use super::{Ctx, Scratch, Widths};
use crate::kernels::Device;
use crate::kernels::device::{Cols, ConvCall, DevResult, MambaDims, MambaParams};

pub struct Mamba2<D: Device> {
    pub in_proj: D::Linear,
    /// `[conv_dim, kernel]` and optional `[conv_dim]` bias.
    pub conv_w: D::Vector,
    pub conv_b: Option<D::Vector>,
    pub conv_kernel: usize,
    /// `-exp(A_log)`, `D`, `dt_bias` per head.
    pub neg_a: D::Vector,
    pub d: D::Vector,
    pub dt_bias: D::Vector,
    /// `[inner]`, the grouped gated norm.
    pub norm: D::Vector,
    pub out_proj: D::Linear,
    pub dims: MambaDims,
    pub eps: f64,
    pub state_layer: usize,
}

impl<D: Device> Mamba2<D> {
    fn inner(&self) -> usize {
        self.dims.heads * self.dims.head_dim
    }

    fn conv_dim(&self) -> usize {
        self.inner() + 2 * self.dims.groups * self.dims.d_state
    }

    /// (conv floats, state floats) per slot.
    pub fn state_shape(&self) -> (usize, usize) {
        let d = self.dims;
        (
            (self.conv_kernel - 1) * self.conv_dim(),
            d.heads * d.head_dim * d.d_state,
        )
    }

    pub(super) fn widths(&self) -> Widths {
        let inner = self.inner();
        Widths {
            wide: inner + self.conv_dim() + self.dims.heads,
            conv: self.conv_dim(),
            mid: inner,
            act: inner,
            moe: None,
        }
    }

    pub(super) fn forward(
        &self,
        dev: &D,
        ctx: &mut Ctx<'_, '_, D>,
        s: &mut Scratch<D>,
    ) -> DevResult<()> {
        let (inner, cd, nh) = (self.inner(), self.conv_dim(), self.dims.heads);
        dev.matmul(&s.normed, &self.in_proj, &mut s.wide)?;
        let cols = |col, width| Cols {
            buf: &s.wide,
            col,
            width,
        };
        let conv = ConvCall {
            state_layer: self.state_layer,
            weight: &self.conv_w,
            bias: self.conv_b.as_ref(),
            kernel: self.conv_kernel,
        };
        let step = ctx.step;
        let states = ctx.states()?;
        dev.conv1d_silu(step, states, cols(inner, cd), &conv, &mut s.conv)?;
        let params = MambaParams {
            dims: self.dims,
            neg_a: &self.neg_a,
            d: &self.d,
            dt_bias: &self.dt_bias,
        };
        let dt = cols(inner + cd, nh);
        let l = self.state_layer;
        dev.mamba2_scan(step, states, l, &s.conv, dt, &params, &mut s.mid)?;
        let group = (inner / self.dims.groups, self.eps);
        dev.mamba2_gated_norm(&s.mid, cols(0, inner), &self.norm, group, &mut s.act)?;
        dev.matmul(&s.act, &self.out_proj, &mut s.proj)
    }
}
