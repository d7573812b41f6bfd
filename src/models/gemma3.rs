//! Gemma-3, Gemma-2 (`Gemma2ForCausalLM`: no q/k norms, soft-capped scores; RoPE and windows
//! from its config as parsed), VaultGemma (`VaultGemmaForCausalLM`: Gemma-2's without the
//! sublayers' output norms) and Gemma 1 (`GemmaForCausalLM`: the same, every layer full, no
//! cap). Gemma-3 (`Gemma3ForCausalLM`; the language model of `Gemma3ForConditionalGeneration`
//! exports, whose `language_model.model.*` / `model.language_model.*` answer to `model.*`:
//! `Weights`). Per layer, each sublayer between two `(1 + w)` RMSNorms (Gemma's sandwich):
//! `x += post_attention_layernorm(attention(input_layernorm(x)))`, then
//! `x += post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x)))`. The attention has
//! per-head `(1 + w)` q/k norms, scores scaled by `query_pre_attn_scalar^-½`, and per layer a
//! sliding window with the local RoPE or full attention with the global one (scores
//! soft-capped where the config says); the MLP is a GeGLU. The embedding rows are scaled by
//! `√hidden` rounded to the weights' dtype (the LM head is the unscaled, tied embedding).

use super::decoder::{Decoder, FinalNorm};
use super::dense::{attention_of, load_mlp};
use super::layers::mlp::Activation;
use super::layers::{Layer, Loader, Part, SoftmaxVariant, Sublayer};
use super::{Architecture, Gemma3Spec, ModelError, ModelSpec, QkNorm, WeightDtype};
use crate::kernels::Device;
use crate::kernels::rope::Rope;

pub fn load<D: Device>(ld: &Loader<'_, D>, spec: ModelSpec) -> Result<Decoder<D>, ModelError> {
    let g = spec.gemma3.clone().ok_or_else(|| {
        ModelError::InvalidOptions("Gemma3ForCausalLM spec without its layer kinds".into())
    })?;
    let h = spec.hidden_size;
    let vocab = ld.vocab(&spec, "model.embed_tokens")?;
    let layers = (0..spec.num_layers)
        .map(|i| load_layer(ld, &spec, &g, i))
        .collect::<Result<Vec<_>, _>>()?;
    let final_norm = FinalNorm::Norm(ld.norm_one_plus("model.norm", h)?);
    Ok(Decoder {
        embed_scale: embed_scale(h, spec.dtype),
        spec,
        vocab,
        layers,
        ple: None,
        final_norm,
    })
}

/// transformers' `Gemma3TextScaledWordEmbedding`: `hidden ** 0.5` as an f32 tensor, cast to the
/// embedding's dtype before it multiplies the rows.
pub fn embed_scale(hidden: usize, dtype: WeightDtype) -> f32 {
    let scale = (hidden as f64).sqrt() as f32;
    match dtype {
        WeightDtype::F32 => scale,
        WeightDtype::Bf16 => half::bf16::from_f32(scale).to_f32(),
        WeightDtype::F16 => half::f16::from_f32(scale).to_f32(),
    }
}

fn load_layer<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    g: &Gemma3Spec,
    i: usize,
) -> Result<Layer<D>, ModelError> {
    let p = format!("model.layers.{i}");
    let h = spec.hidden_size;
    let norm = |n: &str| ld.norm_one_plus(&format!("{p}.{n}"), h);
    let attention = Sublayer::Attention(load_attention(ld, spec, g, i)?);
    let mlp = load_mlp(ld, spec, &format!("{p}.mlp"), Activation::GeluTanhGlu)?;
    let mlp = Sublayer::Mlp(mlp);
    let parts = match g.sandwich {
        true => vec![
            Part::sandwich(
                norm("input_layernorm")?,
                attention,
                norm("post_attention_layernorm")?,
            ),
            Part::sandwich(
                norm("pre_feedforward_layernorm")?,
                mlp,
                norm("post_feedforward_layernorm")?,
            ),
        ],
        // Gemma (1)'s MLP input norm is its `post_attention_layernorm`, VaultGemma's keeps
        // Gemma-2's name.
        false => vec![
            Part::new(norm("input_layernorm")?, attention),
            Part::new(norm(mlp_input_norm(spec.architecture))?, mlp),
        ],
    };
    Ok(Layer { parts, scale: 1.0 })
}

/// The name of the MLP's input norm in a layer without post-norms.
fn mlp_input_norm(arch: Architecture) -> &'static str {
    match arch {
        Architecture::VaultGemma => "pre_feedforward_layernorm",
        _ => "post_attention_layernorm",
    }
}

/// Layer `i`'s attention: a sliding window and the local RoPE, or full with the global one.
fn load_attention<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    g: &Gemma3Spec,
    i: usize,
) -> Result<super::layers::Attention<D>, ModelError> {
    let attn = |n: &str| format!("model.layers.{i}.self_attn.{n}");
    let (h, hd) = (spec.hidden_size, spec.head_dim);
    let (qd, kvd) = (spec.num_heads * hd, spec.num_kv_heads * hd);
    let parts = [
        (attn("q_proj"), qd),
        (attn("k_proj"), kvd),
        (attn("v_proj"), kvd),
    ];
    let qkv = ld.linear(&parts, h, spec.qkv_bias)?;
    let qk_norm = match spec.qk_norm {
        // Gemma-2 has none.
        QkNorm::None => None,
        _ => Some((
            ld.norm_one_plus(&attn("q_norm"), hd)?,
            Some(ld.norm_one_plus(&attn("k_norm"), hd)?),
        )),
    };
    let sliding = g.sliding[i];
    let (theta, scaling) = match sliding {
        true => g.local_rope,
        false => (spec.rope_theta, spec.rope_scaling),
    };
    let rope = Some((ld.dev.rope_table(&Rope::new(hd, theta, scaling))?, hd));
    let variant = SoftmaxVariant {
        window: sliding.then_some(g.window),
        score_factor: g.score_factor,
        softcap: g.softcap,
        ..SoftmaxVariant::causal()
    };
    attention_of(ld, spec, i, (qkv, qk_norm, rope), variant)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// √hidden as transformers' buffer holds it: f32, then the weights' dtype.
    #[test]
    fn embed_scale_is_rounded_to_the_weights_dtype() {
        assert_eq!(embed_scale(1152, WeightDtype::F32), 33.941124);
        assert_eq!(embed_scale(1152, WeightDtype::Bf16), 34.0);
        assert_eq!(embed_scale(2560, WeightDtype::Bf16), 50.5);
        assert_eq!(embed_scale(2560, WeightDtype::F16), 50.59375);
        assert_eq!(embed_scale(64, WeightDtype::Bf16), 8.0);
    }
}
