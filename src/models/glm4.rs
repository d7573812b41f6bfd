//! GLM-4 (`Glm4ForCausalLM`: GLM-4-0414 9B / 32B, GLM-Z1; `model.*` names): Llama's attention
//! with q / k / v biases and RoPE on the first `partial_rotary_factor` (½) of each head in
//! interleaved pairs `(2i, 2i + 1)`, and a sandwich: each sublayer's input normed
//! (`input_layernorm`, `post_attention_layernorm`) and its output too
//! (`post_self_attn_layernorm`, `post_mlp_layernorm`) before the add; a fused
//! `mlp.gate_up_proj`. GLM-4-9B (`GlmForCausalLM`, the 2024 release) is the same without the
//! output norms.
//!
//! The interleaved pairs are loaded de-interleaved (`ModelSpec::interleaved_rope`, read by
//! `dense::load_attention`).

use super::decoder::Decoder;
use super::dense::{load_attention, load_with};
use super::layers::mlp::Activation;
use super::layers::{Layer, Loader, Mlp, Part, SoftmaxVariant, Sublayer};
use super::{Architecture, ModelError, ModelSpec};
use crate::kernels::Device;

pub fn load<D: Device>(ld: &Loader<'_, D>, spec: ModelSpec) -> Result<Decoder<D>, ModelError> {
    load_with(ld, spec, load_layer)
}

fn load_layer<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    i: usize,
) -> Result<Layer<D>, ModelError> {
    let p = format!("model.layers.{i}");
    let (h, inter) = (spec.hidden_size, spec.intermediate_size);
    let norm = |n: &str| ld.vector(&format!("{p}.{n}.weight"), h);
    // GLM-4-9B (`GlmForCausalLM`) norms each sublayer's input only.
    let part = |pre: &str, sublayer, post: &str| {
        Ok::<_, ModelError>(match spec.architecture {
            Architecture::Glm => Part::new(norm(pre)?, sublayer),
            _ => Part::sandwich(norm(pre)?, sublayer, norm(post)?),
        })
    };
    let mlp = Mlp {
        up: ld.linear1(&format!("{p}.mlp.gate_up_proj"), 2 * inter, h, false)?,
        down: ld.linear1(&format!("{p}.mlp.down_proj"), h, inter, false)?,
        act: Activation::SwiGlu,
        inter,
    };
    let attention = Sublayer::Attention(load_attention(ld, spec, i, SoftmaxVariant::causal())?);
    Ok(Layer {
        parts: vec![
            part("input_layernorm", attention, "post_self_attn_layernorm")?,
            part(
                "post_attention_layernorm",
                Sublayer::Mlp(mlp),
                "post_mlp_layernorm",
            )?,
        ],
        scale: 1.0,
    })
}
