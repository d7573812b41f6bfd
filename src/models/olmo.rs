//! OLMo 2 / 3 and EXAONE 4.0 (`Olmo2ForCausalLM`, `Olmo3ForCausalLM`, `Exaone4ForCausalLM`;
//! `model.*` names as Llama's). Per
//! layer, each sublayer reads the residual stream itself and its output is RMS-normed before
//! the add: `x += post_attention_layernorm(attention(x))`,
//! `x += post_feedforward_layernorm(mlp(x))` (no `input_layernorm`). The attention: q / k
//! RMSNorm over the whole projection (EXAONE: per head) before RoPE, biases where
//! `attention_bias`; OLMo 3's and EXAONE's sliding layers with their window and RoPE (EXAONE's
//! full layers without RoPE: the spec's `nope_layers`).

use super::decoder::Decoder;
use super::dense::{load_attention_roped, load_mlp, load_with};
use super::layers::mlp::Activation;
use super::layers::{AttnVariant, Layer, Loader, Part, Sublayer};
use super::{ModelError, ModelSpec};
use crate::kernels::Device;

pub fn load<D: Device>(ld: &Loader<'_, D>, spec: ModelSpec) -> Result<Decoder<D>, ModelError> {
    load_with(ld, spec, load_layer)
}

fn load_layer<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    i: usize,
) -> Result<Layer<D>, ModelError> {
    let o = spec.olmo.as_ref().ok_or_else(|| {
        ModelError::InvalidOptions("an OLMo spec without its layer windows".into())
    })?;
    let p = format!("model.layers.{i}");
    let post = |n: &str| ld.vector(&format!("{p}.{n}.weight"), spec.hidden_size);
    let part = |sublayer, post_norm| Part {
        norm: None,
        sublayer,
        post_norm: Some(post_norm),
        residual_scale: 1.0,
    };
    let sliding = o.sliding[i];
    let variant = AttnVariant {
        window: sliding.then_some(o.window),
        ..AttnVariant::causal()
    };
    let rope = match sliding {
        true => o.local_rope,
        false => (spec.rope_theta, spec.rope_scaling),
    };
    let attention = load_attention_roped(ld, spec, i, variant, rope)?;
    let mlp = load_mlp(ld, spec, &format!("{p}.mlp"), Activation::SwiGlu)?;
    Ok(Layer {
        parts: vec![
            part(
                Sublayer::Attention(attention),
                post("post_attention_layernorm")?,
            ),
            part(Sublayer::Mlp(mlp), post("post_feedforward_layernorm")?),
        ],
        scale: 1.0,
    })
}
