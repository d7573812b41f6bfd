//! Gemma 4 E2B / E4B's per-layer embeddings (PLE): once per step, every token gets
//! `layers · dim` values, `(norm(proj(embedded) · hidden^-½) + table[token] · √dim) · 2^-½`
//! (transformers' `project_per_layer_inputs` of `get_per_layer_inputs`), kept in the scratch;
//! each layer then adds `post_norm(proj(gelu_tanh(gate(x)) · its piece))` to the stream (the
//! post-norm is its [`super::Part`]'s).

use super::Scratch;
use crate::kernels::Device;
use crate::kernels::device::{Cols, DevResult, DeviceError, GateFn, RowNorm};

/// The model-level half: the per-layer inputs of a step's tokens.
pub struct PerLayerEmbedding<D: Device> {
    /// `embed_tokens_per_layer` `[vocab, layers · dim]`, its rows times `table_scale` (`√dim`
    /// in the weights' dtype); gathered from, never multiplied: a [`Device::table`] (on the
    /// CPU, read where the checkpoint maps it).
    pub table: D::Table,
    pub table_scale: f32,
    /// `per_layer_model_projection` `[layers · dim, hidden]`, its output times `proj_scale`
    /// (`hidden^-½`).
    pub proj: D::Linear,
    pub proj_scale: f32,
    /// `per_layer_projection_norm` `[dim]`: one RMSNorm per layer's piece.
    pub norm: D::Vector,
    pub eps: f64,
    /// Values per token: `layers · dim`.
    pub width: usize,
}

/// The per-layer inputs `[T, layers · dim]` and the buffer they are made in.
pub struct PleScratch<D: Device> {
    pub inputs: D::Buf,
    pub tmp: D::Buf,
}

fn ple_scratch<D: Device>(s: &mut Option<PleScratch<D>>) -> DevResult<&mut PleScratch<D>> {
    s.as_mut()
        .ok_or_else(|| DeviceError::Invalid("per-layer embeddings without their buffers".into()))
}

impl<D: Device> PerLayerEmbedding<D> {
    /// The per-layer inputs of the embedded rows `s.x` into `s.ple.inputs` (clobbers
    /// `s.normed`).
    pub fn forward(&self, dev: &D, step: &D::Step<'_>, s: &mut Scratch<D>) -> DevResult<()> {
        let ple = ple_scratch(&mut s.ple)?;
        dev.cast(&s.x, &mut s.normed)?;
        dev.matmul(&s.normed, &self.proj, &mut ple.tmp)?;
        dev.scale(&mut ple.tmp, self.proj_scale)?;
        dev.norm(
            &ple.tmp,
            &self.norm,
            RowNorm::rms(self.eps),
            &mut ple.inputs,
        )?;
        dev.embed_table(step, &self.table, self.table_scale, &mut ple.tmp)?;
        dev.add(&mut ple.inputs, &ple.tmp)?;
        // transformers' `per_layer_input_scale`, 2^-½ (f32).
        dev.scale(&mut ple.inputs, std::f32::consts::FRAC_1_SQRT_2)
    }
}

/// One layer's half: `proj(gelu_tanh(gate(x)) · inputs[:, layer · dim..][..dim])`.
pub struct PerLayerInput<D: Device> {
    /// `per_layer_input_gate` `[dim, hidden]`.
    pub gate: D::Linear,
    /// `per_layer_projection` `[hidden, dim]`.
    pub proj: D::Linear,
    pub layer: usize,
    pub dim: usize,
}

impl<D: Device> PerLayerInput<D> {
    pub(super) fn widths(&self) -> super::Widths {
        super::Widths {
            mid: self.dim,
            act: self.dim,
            ..super::Widths::default()
        }
    }

    pub(super) fn forward(&self, dev: &D, s: &mut Scratch<D>) -> DevResult<()> {
        dev.matmul(&s.normed, &self.gate, &mut s.mid)?;
        let ple = ple_scratch(&mut s.ple)?;
        let piece = Cols::new(&ple.inputs, self.layer * self.dim, self.dim);
        let x = Cols::new(&s.mid, 0, self.dim);
        dev.gate(x, piece, GateFn::GeluTanh, &mut s.act)?;
        dev.matmul(&s.act, &self.proj, &mut s.proj)
    }
}
