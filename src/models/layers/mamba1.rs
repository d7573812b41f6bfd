//! Mamba-1 (Mamba, Falcon-Mamba, Jamba): `in_proj` -> `[x | z]` (inner each); causal conv +
//! SiLU over x with the request slot's conv state; `x_proj` -> `dt_low` (`dt_rank`), `B`, `C`
//! (`d_state` each) — Falcon-Mamba RMS-norms each of the three without a weight, Jamba with
//! one — and
//! `dt = dt_proj(dt_low)`; the selective scan token by token, every state entry with its own
//! decay; `y · silu(z)`; `out_proj`.

use super::{CausalConv, Ctx, Scratch, Widths};
use crate::kernels::Device;
use crate::kernels::device::{Cols, DevResult, Mamba1Params, MambaGate, RowNorm};

pub struct Mamba1<D: Device> {
    pub in_proj: D::Linear,
    /// Over x.
    pub conv: CausalConv<D>,
    /// `x_proj`'s rows `[0, dt_rank)`.
    pub x_proj_dt: D::Linear,
    /// `x_proj`'s rows `[dt_rank, dt_rank + 2 · d_state)`: B then C.
    pub x_proj_bc: D::Linear,
    /// `dt_proj` without its bias (added in the scan, before the softplus).
    pub dt_proj: D::Linear,
    /// `-exp(A_log)` (`[inner, d_state]`), `D`, `dt_proj.bias`.
    pub neg_a: D::Vector,
    pub d: D::Vector,
    pub dt_bias: D::Vector,
    /// B's and C's norm weights (`[2 · d_state]`, applied in the scan; ones without them).
    pub bc_weight: D::Vector,
    pub out_proj: D::Linear,
    pub dims: Mamba1Dims,
    /// The RMS norms of dt_low, B and C (Falcon-Mamba, Jamba).
    pub mixer_norm: Option<MixerNorm<D>>,
}

#[derive(Debug, Clone, Copy)]
pub struct Mamba1Dims {
    pub inner: usize,
    pub d_state: usize,
    pub dt_rank: usize,
}

/// The norms of dt_low, B and C: `w · (x · rsqrt(mean(x²) + eps))`. B's and C's are normed
/// times ones (times 1 is exact) and meet their weights in the scan
/// ([`Mamba1::bc_weight`]); Falcon-Mamba's weights are ones.
pub struct MixerNorm<D: Device> {
    /// dt_low's weight (`dt_rank`), `d_state` ones.
    pub dt_weight: D::Vector,
    pub ones_state: D::Vector,
    pub eps: f64,
}

impl<D: Device> Mamba1<D> {
    /// (conv floats, state floats) per slot.
    pub fn state_shape(&self) -> (usize, usize) {
        let d = self.dims;
        (self.conv.state_floats(d.inner), d.inner * d.d_state)
    }

    pub(super) fn widths(&self) -> Widths {
        let d = self.dims;
        Widths {
            wide: 2 * d.inner,
            conv: d.inner,
            mid: d.inner.max(d.dt_rank),
            act: d.inner.max(d.dt_rank),
            aux: 2 * d.d_state,
            dt: d.inner.max(2 * d.d_state),
            ..Widths::default()
        }
    }

    /// The buffers: `wide` `[x | z]`, `conv` the conv of x, `act` x as the GEMMs' input, then
    /// dt_low, then the gated output; `mid` dt_low, then y; `aux` `[B | C]`; `dt` dt (and
    /// Falcon-Mamba's B and C before their norm).
    pub(super) fn forward(
        &self,
        dev: &D,
        ctx: &mut Ctx<'_, '_, D>,
        s: &mut Scratch<D>,
    ) -> DevResult<()> {
        let (inner, n) = (self.dims.inner, self.dims.d_state);
        self.conv.project(dev, ctx, s, &self.in_proj, (0, inner))?;
        dev.cast(&s.conv, &mut s.act)?;
        dev.matmul(&s.act, &self.x_proj_dt, &mut s.mid)?;
        match &self.mixer_norm {
            None => {
                dev.matmul(&s.act, &self.x_proj_bc, &mut s.aux)?;
                dev.cast(&s.mid, &mut s.act)?;
            }
            Some(m) => {
                dev.matmul(&s.act, &self.x_proj_bc, &mut s.dt)?;
                // One norm per d_state-wide piece: B's, then C's.
                dev.norm(&s.dt, &m.ones_state, RowNorm::rms(m.eps), &mut s.aux)?;
                dev.norm(&s.mid, &m.dt_weight, RowNorm::rms(m.eps), &mut s.act)?;
            }
        }
        dev.matmul(&s.act, &self.dt_proj, &mut s.dt)?;
        let params = Mamba1Params {
            d_state: n,
            neg_a: &self.neg_a,
            d: &self.d,
            dt_bias: &self.dt_bias,
            bc_weight: &self.bc_weight,
        };
        let (step, l) = (ctx.step, self.conv.state_layer);
        let bc = Cols::new(&s.aux, 0, 2 * n);
        let x_dt = (&s.conv, &s.dt);
        dev.mamba1_scan(step, ctx.states()?, l, x_dt, bc, &params, &mut s.mid)?;
        let z = Cols::new(&s.wide, inner, inner);
        dev.mamba2_gated_norm(&s.mid, z, MambaGate::GateOnly, &mut s.act)?;
        dev.matmul(&s.act, &self.out_proj, &mut s.proj)
    }
}
