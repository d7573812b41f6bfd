//! Mamba-2 (Nemotron-H): `in_proj` -> `[z (inner) | xBC (conv_dim) | dt (heads)]`; causal
//! conv + SiLU over xBC with the request slot's conv state; the selective scan token by token
//! with `dt` clamped to `time_step_min`; `y · silu(z)`, then RMSNorm per group (or, in
//! Falcon-H1, the norm before the gate or no norm); `out_proj`.

use super::{CausalConv, Ctx, Scratch, Widths};
use crate::kernels::Device;
use crate::kernels::device::{Cols, DevResult, GroupNorm, MambaDims, MambaGate, MambaParams};

pub struct Mamba2<D: Device> {
    pub in_proj: D::Linear,
    /// Over `xBC`.
    pub conv: CausalConv<D>,
    /// `-exp(A_log)`, `D`, `dt_bias` per head.
    pub neg_a: D::Vector,
    pub d: D::Vector,
    pub dt_bias: D::Vector,
    /// The grouped norm of the output (`None`: `y · silu(z)` alone).
    pub norm: Option<OutNorm<D>>,
    pub out_proj: D::Linear,
    pub dims: MambaDims,
    pub eps: f64,
}

/// A Mamba-2 output norm: its weight `[inner]`, and whether it norms before the gate.
pub struct OutNorm<D: Device> {
    pub w: D::Vector,
    pub before_gate: bool,
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
            self.conv.state_floats(self.conv_dim()),
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
            ..Widths::default()
        }
    }

    pub(super) fn forward(
        &self,
        dev: &D,
        ctx: &mut Ctx<'_, '_, D>,
        s: &mut Scratch<D>,
    ) -> DevResult<()> {
        let (inner, cd, nh) = (self.inner(), self.conv_dim(), self.dims.heads);
        self.conv.project(dev, ctx, s, &self.in_proj, (inner, cd))?;
        let cols = |col, width| Cols::new(&s.wide, col, width);
        let params = MambaParams {
            dims: self.dims,
            neg_a: &self.neg_a,
            d: &self.d,
            dt_bias: &self.dt_bias,
        };
        let dt = cols(inner + cd, nh);
        let (step, l) = (ctx.step, self.conv.state_layer);
        dev.mamba2_scan(step, ctx.states()?, l, &s.conv, dt, &params, &mut s.mid)?;
        let gate = match &self.norm {
            None => MambaGate::GateOnly,
            Some(n) => {
                let (group_size, eps) = (inner / self.dims.groups, self.eps);
                let g = GroupNorm {
                    w: &n.w,
                    group_size,
                    eps,
                };
                match n.before_gate {
                    true => MambaGate::NormThenGate(g),
                    false => MambaGate::GateThenNorm(g),
                }
            }
        };
        dev.mamba2_gated_norm(&s.mid, cols(0, inner), gate, &mut s.act)?;
        dev.matmul(&s.act, &self.out_proj, &mut s.proj)
    }
}
