//! Falcon-H1 (`FalconH1ForCausalLM`: Falcon-H1, Falcon-H1R). Per layer (`model.layers.{i}`),
//! after `input_layernorm`, a Mamba-2 mixer (`mamba.*`) and RoPE attention (`self_attn.*`)
//! read the same normed rows and their outputs are summed into the residual stream; then after
//! `pre_ff_layernorm` the SwiGLU `feed_forward.{gate,up,down}_proj`. The final norm is
//! `model.final_layernorm`.
//!
//! transformers multiplies activations by the µP multipliers ([`FalconH1Spec`]): the mixers'
//! inputs (`attention_in`, `ssm_in`), the keys, the Mamba-2 `in_proj` output per column group
//! (`mup_vector`), the gate projection's output, and the mixers' and the MLP's outputs. Each is
//! a factor on a projection's input or output rows, so hsx folds it into the weights at load
//! (`W' = in · out_row · W`, `b' = out_row · b`) and runs the layers as any hybrid's. In f32
//! the folded product rounds once where transformers rounds the scaled activation: the
//! fixtures agree to ~1e-6; bf16 / f16 weights are rounded back to their dtype after the fold.
//! The embedding multiplier scales the embedded rows (layer id 0, as `hidden_states[0]`); the
//! LM-head multiplier changes no greedy token and is not applied.

use super::decoder::{Decoder, FinalNorm};
use super::falcon_h1_config::FalconH1Spec;
use super::hybrid_config::MambaSpec;
use super::layers::mlp::Activation;
use super::layers::{Layer, Loader, Mlp, Part, SoftmaxVariant, Sublayer};
use super::nemotron_h::{attention_with, mamba_with};
use super::{ModelError, ModelSpec};
use crate::kernels::Device;
use crate::kernels::device::HostMatrix;

pub fn load<D: Device>(ld: &Loader<'_, D>, spec: ModelSpec) -> Result<Decoder<D>, ModelError> {
    let f = spec
        .falcon_h1
        .clone()
        .ok_or_else(|| missing("its multipliers"))?;
    let m = (spec.hybrid.as_ref()).and_then(|h| h.mamba.clone());
    let m = m.ok_or_else(|| missing("its Mamba-2 geometry"))?;
    let h = spec.hidden_size;
    let layers = (0..spec.num_layers)
        .map(|i| {
            let p = format!("model.layers.{i}");
            let mamba = Sublayer::Mamba2(load_mamba(ld, &spec, &f, &m, i)?);
            let attention = Sublayer::Attention(load_attention(ld, &spec, &f, i)?);
            let mixers = Sublayer::Parallel(Box::new([mamba, attention]));
            let norm = |n: &str| ld.vector(&format!("{p}.{n}.weight"), h);
            Ok(Layer {
                parts: vec![
                    Part::new(norm("input_layernorm")?, mixers),
                    Part::new(norm("pre_ff_layernorm")?, load_mlp(ld, &spec, &f, i)?),
                ],
                scale: 1.0,
            })
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    Ok(Decoder {
        vocab: ld.vocab(&spec, "model.embed_tokens")?,
        embed_scale: f.embedding,
        final_norm: FinalNorm::Norm(ld.vector("model.final_layernorm.weight", h)?),
        spec,
        layers,
        ple: None,
    })
}

fn missing(what: &str) -> ModelError {
    ModelError::InvalidOptions(format!("FalconH1ForCausalLM spec without {what}"))
}

/// Layer `i`'s attention: q, k, v read `attention_in · x`, k times `key`, the output times
/// `attention_out`.
fn load_attention<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    f: &FalconH1Spec,
    i: usize,
) -> Result<super::layers::Attention<D>, ModelError> {
    let (h, hd) = (spec.hidden_size, spec.head_dim);
    let (qd, kvd) = (spec.num_heads * hd, spec.num_kv_heads * hd);
    let n = |s: &str| format!("model.layers.{i}.self_attn.{s}");
    let parts = [(n("q_proj"), qd), (n("k_proj"), kvd), (n("v_proj"), kvd)];
    let key_rows = qd..qd + kvd;
    let qkv = Folded::new(f.attention_in, |r| match key_rows.contains(&r) {
        true => f.key,
        false => 1.0,
    });
    let qkv = qkv.linear(ld, &parts, h, spec.qkv_bias)?;
    let o =
        Folded::new(1.0, |_| f.attention_out).linear(ld, &[(n("o_proj"), h)], qd, spec.o_bias)?;
    attention_with(ld, spec, i, SoftmaxVariant::causal(), (qkv, o))
}

/// Layer `i`'s Mamba-2 mixer: `in_proj` reads `ssm_in · x` and its output columns are scaled
/// by group (z, x, B, C, dt: `ssm_multipliers`); `out_proj`'s output times `ssm_out`, its
/// bias `projectors_bias`.
fn load_mamba<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    f: &FalconH1Spec,
    m: &MambaSpec,
    i: usize,
) -> Result<super::layers::Mamba2<D>, ModelError> {
    let px = format!("model.layers.{i}.mamba");
    let (h, inner, bc) = (
        spec.hidden_size,
        m.intermediate(),
        m.n_groups * m.state_size,
    );
    // Where each multiplier's columns end: z, x, B, C, then dt.
    let ends = [inner, 2 * inner, 2 * inner + bc, 2 * inner + 2 * bc];
    let group = |r: usize| ends.iter().position(|&e| r < e).unwrap_or(4);
    let rows = 2 * inner + 2 * bc + m.num_heads;
    let in_proj = Folded::new(f.ssm_in, |r| f.ssm[group(r)]);
    let in_proj = in_proj.linear(ld, &[(format!("{px}.in_proj"), rows)], h, m.proj_bias)?;
    let out = [(format!("{px}.out_proj"), h)];
    let out_proj = Folded::new(1.0, |_| f.ssm_out).linear(ld, &out, inner, f.projectors_bias)?;
    mamba_with(ld, &px, spec, m, i, (in_proj, out_proj))
}

/// Layer `i`'s SwiGLU MLP: the gate projection's output times `mlp_gate`, the down
/// projection's times `mlp_down`.
fn load_mlp<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    f: &FalconH1Spec,
    i: usize,
) -> Result<Sublayer<D>, ModelError> {
    let (h, inter) = (spec.hidden_size, spec.intermediate_size);
    let n = |s: &str| format!("model.layers.{i}.feed_forward.{s}");
    let gate_up = [(n("gate_proj"), inter), (n("up_proj"), inter)];
    let gate = Folded::new(1.0, |r| if r < inter { f.mlp_gate } else { 1.0 });
    let down = Folded::new(1.0, |_| f.mlp_down);
    Ok(Sublayer::Mlp(Mlp {
        up: gate.linear(ld, &gate_up, h, spec.mlp_bias)?,
        down: down.linear(ld, &[(n("down_proj"), h)], inter, spec.mlp_bias)?,
        act: Activation::SwiGlu,
        inter,
    }))
}

/// Multipliers folded into a linear layer: `W'[r] = input · output(r) · W[r]` and
/// `b'[r] = output(r) · b[r]` (`r` over the stacked rows), so `x·W'ᵀ + b'` is
/// `output ⊙ ((input · x)·Wᵀ + b)`.
struct Folded<F: Fn(usize) -> f64> {
    input: f64,
    output: F,
}

impl<F: Fn(usize) -> f64> Folded<F> {
    fn new(input: f64, output: F) -> Self {
        Self { input, output }
    }

    /// The parts' `{name}.weight` `[rows, cols]` (and `{name}.bias`) stacked, the factors
    /// folded in (read as stored where every factor is 1).
    fn linear<D: Device>(
        &self,
        ld: &Loader<'_, D>,
        parts: &[(String, usize)],
        cols: usize,
        bias: bool,
    ) -> Result<D::Linear, ModelError> {
        let total: usize = parts.iter().map(|p| p.1).sum();
        if self.input == 1.0 && (0..total).all(|r| (self.output)(r) == 1.0) {
            return ld.linear(parts, cols, bias);
        }
        let (mut mats, mut biases, mut row0) = (Vec::new(), Vec::new(), 0);
        for (name, rows) in parts {
            let m = ld.matrix(&format!("{name}.weight"), *rows, cols)?;
            let mut w = m.to_f32();
            for (r, row) in w.chunks_exact_mut(cols.max(1)).enumerate() {
                let s = self.input * (self.output)(row0 + r);
                row.iter_mut().for_each(|v| *v = (*v as f64 * s) as f32);
            }
            let folded = HostMatrix::from_f32(&w, *rows, cols);
            mats.push(folded.to_dtype(m.dtype).into_owned());
            if bias {
                let b = ld.f32s(&format!("{name}.bias"), &[*rows])?;
                let out = |(r, &v): (usize, &f32)| (v as f64 * (self.output)(row0 + r)) as f32;
                biases.extend(b.iter().enumerate().map(out));
            }
            row0 += rows;
        }
        let m = HostMatrix::stack(mats).map_err(ModelError::Device)?;
        Ok(ld.dev.linear(m, bias.then_some(biases))?)
    }
}
