//! The element-wise activations between an MLP's two projections ([`UnaryAct`]).

use rayon::prelude::*;

use super::exp::gelu_tanh_mul_into;
use crate::kernels::device::UnaryAct;

/// The unit gate the tanh GELU multiplies by (a chunk's width of ones).
static UNIT_GATE: [f32; 4096] = [1.0; 4096];

/// `out = f(x)` element by element.
pub fn unary(x: &[f32], f: UnaryAct, out: &mut Vec<f32>) {
    // Every element is written below: resizing zeroes only growth. In parallel: one
    // thread over `[T, intermediate]` was ~2% of a Nemotron-H-8B-shaped run.
    out.resize(x.len(), 0.0);
    let chunks = (out.par_chunks_mut(UNIT_GATE.len())).zip(x.par_chunks(UNIT_GATE.len()));
    match f {
        UnaryAct::Relu2 => chunks.for_each(|(o, x)| {
            for (o, &v) in o.iter_mut().zip(x) {
                let r = v.max(0.0);
                *o = r * r;
            }
        }),
        UnaryAct::Xielu(p) => chunks.for_each(|(o, x)| {
            for (o, &v) in o.iter_mut().zip(x) {
                *o = p.apply(v);
            }
        }),
        // The GeGLU's lanes with a unit gate (times 1 is exact: the same bits).
        UnaryAct::GeluTanh => chunks.for_each(|(o, x)| {
            gelu_tanh_mul_into(x, &UNIT_GATE[..x.len()], o);
        }),
        // Per element (the same bits however rows are batched); not vectorised: the
        // activation is a small share of a step beside its two GEMMs.
        UnaryAct::Gelu => chunks.for_each(|(o, x)| {
            for (o, &v) in o.iter_mut().zip(x) {
                *o = super::ops::gelu_erf(v);
            }
        }),
    }
}
