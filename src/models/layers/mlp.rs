//! The dense MLPs: SwiGLU `down(silu(gate(x)) · up(x))` and Gemma's GeGLU
//! `down(gelu_tanh(gate(x)) · up(x))` (gate and up stacked into one projection), and the
//! ungated `down(f(up(x)))`: Nemotron-H's relu², Apertus' xIELU, StarCoder2's tanh GELU.

use super::{Scratch, Widths};
use crate::kernels::Device;
use crate::kernels::device::{DevResult, UnaryAct, Xielu};

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    /// The first projection is `[gate | up]`.
    SwiGlu,
    /// The first projection is `[gate | up]`.
    GeluTanhGlu,
    Relu2,
    /// Apertus' xIELU with the layer's learned scalars.
    Xielu(Xielu),
    /// StarCoder2's tanh GELU, without a gate.
    GeluTanh,
    /// GPT-NeoX's exact (erf) GELU, without a gate.
    Gelu,
}

pub struct Mlp<D: Device> {
    pub up: D::Linear,
    pub down: D::Linear,
    pub act: Activation,
    pub inter: usize,
}

impl<D: Device> Mlp<D> {
    fn wide(&self) -> usize {
        match self.act {
            Activation::SwiGlu | Activation::GeluTanhGlu => 2 * self.inter,
            Activation::Relu2 | Activation::Xielu(_) | Activation::GeluTanh | Activation::Gelu => {
                self.inter
            }
        }
    }

    pub(super) fn widths(&self) -> Widths {
        Widths {
            wide: self.wide(),
            act: self.inter,
            ..Widths::default()
        }
    }

    /// `out = mlp(x)` through the `wide` and `act` buffers.
    pub(super) fn run(
        &self,
        dev: &D,
        x: &D::Buf,
        (wide, act): (&mut D::Buf, &mut D::Buf),
        out: &mut D::Buf,
    ) -> DevResult<()> {
        match self.act {
            Activation::SwiGlu => dev.swiglu_mlp(x, (&self.up, &self.down), (wide, act), out),
            Activation::GeluTanhGlu => {
                dev.matmul(x, &self.up, wide)?;
                dev.gelu_tanh_mul(wide, act)?;
                dev.matmul(act, &self.down, out)
            }
            Activation::Relu2 | Activation::Xielu(_) | Activation::GeluTanh | Activation::Gelu => {
                let f = match self.act {
                    Activation::Xielu(p) => UnaryAct::Xielu(p),
                    Activation::GeluTanh => UnaryAct::GeluTanh,
                    Activation::Gelu => UnaryAct::Gelu,
                    _ => UnaryAct::Relu2,
                };
                dev.matmul(x, &self.up, wide)?;
                dev.unary(wide, f, act)?;
                dev.matmul(act, &self.down, out)
            }
        }
    }

    pub(super) fn forward(&self, dev: &D, s: &mut Scratch<D>) -> DevResult<()> {
        self.run(dev, &s.normed, (&mut s.wide, &mut s.act), &mut s.proj)
    }
}
