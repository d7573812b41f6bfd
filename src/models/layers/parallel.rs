//! Two sublayers side by side, each after its own norm of the same residual rows, their
//! outputs summed: GPT-NeoX's `use_parallel_residual` layer,
//! `x + attention(ln1(x)) + mlp(ln2(x))`. (One norm feeding both is [`super::Sublayer::Parallel`].)

use super::{Ctx, Scratch, Sublayer};
use crate::kernels::Device;
use crate::kernels::device::{DevResult, DeviceError, RowNorm};

pub struct ParallelNormed<D: Device> {
    /// Reads the part's normed rows.
    pub first: Sublayer<D>,
    /// The second sublayer's norm of the layer's input rows.
    pub norm: D::Vector,
    pub row: RowNorm,
    pub second: Sublayer<D>,
}

impl<D: Device> ParallelNormed<D> {
    /// `s.proj` = second(norm(s.x)) + first(s.normed): `s.x` still holds the layer's input (the
    /// stream is updated after the whole part). transformers sums `mlp + attention + x`: the
    /// two outputs first, as here (f32 addition commutes bit for bit).
    pub fn forward(&self, dev: &D, ctx: &mut Ctx<'_, '_, D>, s: &mut Scratch<D>) -> DevResult<()> {
        self.first.forward(dev, ctx, s)?;
        let mut side = s.side.take().ok_or_else(|| {
            DeviceError::Invalid("parallel sublayers without a side buffer".into())
        })?;
        std::mem::swap(&mut s.proj, &mut side);
        let second = dev
            .norm(&s.x, &self.norm, self.row, &mut s.normed)
            .and_then(|()| self.second.forward(dev, ctx, s));
        let sum = second.and_then(|()| dev.add(&mut s.proj, &side));
        s.side = Some(side);
        sum
    }
}
