//! Bamba (`BambaForCausalLM`): per layer (`model.layers.{i}`) a mixer after `input_layernorm` —
//! Mamba-2 (`mamba.*`) or attention (`self_attn.*`, RoPE on the first half of each head), as
//! Granite 4.0's ([`super::granite::mixer`]) — then after `pre_ff_layernorm` the SwiGLU
//! `feed_forward.{gate,up,down}_proj`; the final norm is `model.final_layernorm`.

use super::decoder::{Decoder, FinalNorm};
use super::dense::load_mlp;
use super::granite::mixer;
use super::layers::mlp::Activation;
use super::layers::{Layer, Loader, Part, SoftmaxVariant, Sublayer};
use super::{ModelError, ModelSpec};
use crate::kernels::Device;

pub fn load<D: Device>(ld: &Loader<'_, D>, spec: ModelSpec) -> Result<Decoder<D>, ModelError> {
    let kinds = spec.hybrid.as_ref().map(|h| h.layers.clone());
    let kinds = kinds.ok_or_else(|| {
        ModelError::InvalidOptions("BambaForCausalLM spec without its layers".into())
    })?;
    let h = spec.hidden_size;
    let vocab = ld.vocab(&spec, "model.embed_tokens")?;
    let layers = (0..kinds.len())
        .map(|i| {
            let p = format!("model.layers.{i}");
            let mixer = mixer(ld, &spec, &kinds, i, SoftmaxVariant::causal())?;
            let ffn = load_mlp(ld, &spec, &format!("{p}.feed_forward"), Activation::SwiGlu)?;
            let norm = |n: &str| ld.vector(&format!("{p}.{n}.weight"), h);
            Ok(Layer {
                parts: vec![
                    Part::new(norm("input_layernorm")?, mixer),
                    Part::new(norm("pre_ff_layernorm")?, Sublayer::Mlp(ffn)),
                ],
                scale: 1.0,
            })
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    Ok(Decoder {
        embed_scale: 1.0,
        final_norm: FinalNorm::Norm(ld.vector("model.final_layernorm.weight", h)?),
        spec,
        vocab,
        layers,
        ple: None,
    })
}
