//! LFM2's gated short convolution: `in_proj` -> `[B | C | x]` (hidden each), the causal
//! depthwise conv (kernel `conv_L_cache`, no activation) of `B · x` with the request slot's
//! conv state, `C · conv`, then `out_proj`. A recurrent layer whose only state is the conv's
//! window (no recurrence state).

use super::{CausalConv, Ctx, Scratch, Widths};
use crate::kernels::Device;
use crate::kernels::device::{Cols, DevResult, GateFn};

pub struct ShortConv<D: Device> {
    /// `[B | C | x]` rows.
    pub in_proj: D::Linear,
    /// Over `B · x`, without SiLU.
    pub conv: CausalConv<D>,
    pub out_proj: D::Linear,
    pub hidden: usize,
}

impl<D: Device> ShortConv<D> {
    /// (conv floats, state floats) per slot.
    pub fn state_shape(&self) -> (usize, usize) {
        (self.conv.state_floats(self.hidden), 0)
    }

    pub(super) fn widths(&self) -> Widths {
        let h = self.hidden;
        Widths {
            wide: 3 * h,
            conv: h,
            mid: h,
            act: h,
            ..Widths::default()
        }
    }

    pub(super) fn forward(
        &self,
        dev: &D,
        ctx: &mut Ctx<'_, '_, D>,
        s: &mut Scratch<D>,
    ) -> DevResult<()> {
        let h = self.hidden;
        dev.matmul(&s.normed, &self.in_proj, &mut s.wide)?;
        let (b, c, x) = (
            Cols::new(&s.wide, 0, h),
            Cols::new(&s.wide, h, h),
            Cols::new(&s.wide, 2 * h, h),
        );
        // Each product is one rounding, the same whichever factor comes first.
        dev.gate(x, b, GateFn::Product, &mut s.mid)?;
        self.conv
            .run(dev, ctx, Cols::new(&s.mid, 0, h), &mut s.conv)?;
        dev.gate(Cols::new(&s.conv, 0, h), c, GateFn::Product, &mut s.act)?;
        dev.matmul(&s.act, &self.out_proj, &mut s.proj)
    }
}
