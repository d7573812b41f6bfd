//! Apertus (`ApertusForCausalLM`; `model.*` names): Llama's layers with per-head q / k RMSNorms
//! before RoPE, the norms renamed (`attention_layernorm`, `feedforward_layernorm`) and a
//! non-gated MLP `down(xielu(up(x)))` (or relu²), xIELU's learned scalars per layer
//! (`mlp.act_fn.alpha_p`, `alpha_n`, and the buffers `beta`, `eps` where saved). Config:
//! `ApertusConfig`'s defaults (eps 1e-5, untied), its llama3 RoPE (theta 1.2·10⁷, factor 8 over
//! 8192 positions) where the config names none (`mistral_config::with_class_rope`).

use super::decoder::Decoder;
use super::dense::{load_attention, load_mlp, load_with};
use super::layers::mlp::Activation;
use super::layers::{Layer, Loader, Part, SoftmaxVariant, Sublayer};
use super::{ModelError, ModelSpec, WeightDtype};
use crate::kernels::Device;
use crate::kernels::device::Xielu;

pub fn load<D: Device>(ld: &Loader<'_, D>, spec: ModelSpec) -> Result<Decoder<D>, ModelError> {
    load_with(ld, spec, load_layer)
}

fn load_layer<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    i: usize,
) -> Result<Layer<D>, ModelError> {
    let p = format!("model.layers.{i}");
    let norm = |n: &str| ld.vector(&format!("{p}.{n}.weight"), spec.hidden_size);
    let attention = load_attention(ld, spec, i, SoftmaxVariant::causal())?;
    let px = format!("{p}.mlp");
    let act = match ld.w.contains(&format!("{px}.act_fn.alpha_p")) {
        true => Activation::Xielu(xielu(ld, &px, spec.dtype)?),
        // A relu² model (`hidden_act` relu2) has no activation parameters.
        false => Activation::Relu2,
    };
    Ok(Layer {
        parts: vec![
            Part::new(norm("attention_layernorm")?, Sublayer::Attention(attention)),
            Part::new(
                norm("feedforward_layernorm")?,
                Sublayer::Mlp(load_mlp(ld, spec, &px, act)?),
            ),
        ],
        scale: 1.0,
    })
}

/// The layer's xIELU: `softplus(alpha_p)` and `beta + softplus(alpha_n)` in f32 (the
/// reference's compute, whatever the weights' dtype); `beta` 0.5 and `eps` -10⁻⁶ where the
/// checkpoint has no buffers (as transformers makes them: in the weights' dtype).
fn xielu<D: Device>(ld: &Loader<'_, D>, px: &str, dtype: WeightDtype) -> Result<Xielu, ModelError> {
    let read = |n: &str, shape: &[usize]| -> Result<f32, ModelError> {
        Ok(ld.f32s(&format!("{px}.act_fn.{n}"), shape)?[0])
    };
    let buffer = |n: &str, default: f64| match ld.w.contains(&format!("{px}.act_fn.{n}")) {
        true => read(n, &[]),
        false => Ok(match dtype {
            WeightDtype::Bf16 => half::bf16::from_f64(default).to_f32(),
            WeightDtype::F16 => half::f16::from_f64(default).to_f32(),
            _ => default as f32,
        }),
    };
    let beta = buffer("beta", 0.5)?;
    Ok(Xielu {
        alpha_p: softplus(read("alpha_p", &[1])?) as f32,
        alpha_n: beta + softplus(read("alpha_n", &[1])?) as f32,
        beta,
        eps: buffer("eps", -1e-6)?,
    })
}

/// torch's `softplus` (threshold 20: the input itself above it).
fn softplus(x: f32) -> f64 {
    let x = x as f64;
    if x > 20.0 { x } else { x.exp().ln_1p() }
}
