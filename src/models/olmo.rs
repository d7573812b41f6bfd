//! OLMo 2 / 3 and EXAONE 4.0 (`Olmo2ForCausalLM`, `Olmo3ForCausalLM`, `Exaone4ForCausalLM`;
//! `model.*` names as Llama's). Per
//! layer, each sublayer reads the residual stream itself and its output is RMS-normed before
//! the add: `x += post_attention_layernorm(attention(x))`,
//! `x += post_feedforward_layernorm(mlp(x))` (no `input_layernorm`). The attention: q / k
//! RMSNorm over the whole projection (EXAONE: per head) before RoPE, biases where
//! `attention_bias`; OLMo 3's and EXAONE's sliding layers with their window and RoPE (EXAONE's
//! full layers without RoPE: the spec's `nope_layers`). OLMo Hybrid's attention layers are
//! these, between pre-norm Gated DeltaNet layers ([`load_hybrid`]). K-EXAONE
//! (`ExaoneMoeForCausalLM`): EXAONE 4.0's attention in Llama's pre-norm layers
//! (`input_layernorm`, `post_attention_layernorm`), DeepSeek-V3's experts where sparse.
//! FlexOlmo (`FlexOlmoForCausalLM`): OLMo 2's layers with OLMoE's experts in place of the MLP.

use super::decoder::Decoder;
use super::dense::{
    attention_layer, load_attention, load_ffn, load_mlp, load_windowed_attention, load_with,
};
use super::hybrid_config::LayerKind;
use super::layers::mlp::Activation;
use super::layers::{Layer, Loader, Part, SoftmaxVariant, Sublayer};
use super::{Architecture, ModelError, ModelSpec};
use crate::kernels::Device;

pub fn load<D: Device>(ld: &Loader<'_, D>, spec: ModelSpec) -> Result<Decoder<D>, ModelError> {
    load_with(ld, spec, load_layer)
}

/// OLMo Hybrid (`OlmoHybridForCausalLM`): its `full_attention` layers are OLMo's post-norm
/// layers (above; RoPE unless the spec's NoPE), its `linear_attention` layers Llama's pre-norm
/// layers around a Gated DeltaNet (`linear_attn`, [`super::qwen3_5::load_gdn`]) and the MLP.
pub fn load_hybrid<D: Device>(
    ld: &Loader<'_, D>,
    spec: ModelSpec,
) -> Result<Decoder<D>, ModelError> {
    load_with(ld, spec, load_hybrid_layer)
}

fn load_hybrid_layer<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    i: usize,
) -> Result<Layer<D>, ModelError> {
    let hybrid = spec.hybrid.as_ref();
    let Some((hybrid, gdn)) = hybrid.and_then(|h| Some((h, h.gdn.as_ref()?))) else {
        return Err(ModelError::InvalidOptions(
            "an OLMo Hybrid spec without its layer kinds".into(),
        ));
    };
    let p = format!("model.layers.{i}");
    let mlp = Sublayer::Mlp(load_mlp(ld, spec, &format!("{p}.mlp"), Activation::SwiGlu)?);
    let norm = |n: &str| {
        let name = |n: &str| format!("{p}.{n}.weight");
        let on_disk = name(released_norm_name(n));
        match ld.w.contains(&on_disk) {
            true => ld.vector(&on_disk, spec.hidden_size),
            false => ld.vector(&name(n), spec.hidden_size),
        }
    };
    if hybrid.layers[i] == LayerKind::Attention {
        let mut attention = load_attention(ld, spec, i, SoftmaxVariant::causal())?;
        attention.kv_layer = hybrid.index_in_kind(i);
        return Ok(Layer {
            parts: vec![
                post_normed(
                    Sublayer::Attention(attention),
                    norm("post_attention_layernorm")?,
                ),
                post_normed(mlp, norm("post_feedforward_layernorm")?),
            ],
            scale: 1.0,
        });
    }
    let state_layer = hybrid.index_in_kind(i);
    let linear = super::qwen3_5::load_gdn(ld, &format!("{p}.linear_attn"), spec, gdn, state_layer)?;
    Ok(Layer {
        parts: vec![
            Part::new(norm("input_layernorm")?, Sublayer::GatedDeltaNet(linear)),
            Part::new(norm("post_attention_layernorm")?, mlp),
        ],
        scale: 1.0,
    })
}

/// Where the releases keep transformers' norm `name` (`OlmoHybridForCausalLM`'s conversion
/// mapping; a checkpoint under transformers' own names loads too).
fn released_norm_name(name: &str) -> &str {
    match name {
        "input_layernorm" => "attention_layer_norm",
        "post_attention_layernorm" => "feedforward_layer_norm",
        other => other,
    }
}

/// `x += post_norm(sublayer(x))`: OLMo's parts.
fn post_normed<D: Device>(sublayer: Sublayer<D>, post_norm: D::Vector) -> Part<D> {
    Part {
        norm: None,
        sublayer,
        post_norm: Some(post_norm),
        residual_scale: 1.0,
        hyper: None,
    }
}

fn load_layer<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    i: usize,
) -> Result<Layer<D>, ModelError> {
    let p = format!("model.layers.{i}");
    let post = |n: &str| ld.vector(&format!("{p}.{n}.weight"), spec.hidden_size);
    let attention = load_windowed_attention(ld, spec, i, SoftmaxVariant::causal())?;
    // K-EXAONE's and FlexOlmo's experts where the spec makes the layer sparse, else the MLP.
    let ffn = load_ffn(ld, spec, &p, i)?;
    if spec.architecture == Architecture::ExaoneMoe {
        // K-EXAONE: EXAONE 4.0's attention in pre-norm layers.
        return attention_layer(ld, spec, &p, Sublayer::Attention(attention), ffn);
    }
    Ok(Layer {
        parts: vec![
            post_normed(
                Sublayer::Attention(attention),
                post("post_attention_layernorm")?,
            ),
            post_normed(ffn, post("post_feedforward_layernorm")?),
        ],
        scale: 1.0,
    })
}
