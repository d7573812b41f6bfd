//! AFMoE (`AfmoeForCausalLM`: Arcee Trinity; `model.*` names). Per layer a sandwich around each
//! sublayer (`input_layernorm` / `post_attention_layernorm`, `pre_mlp_layernorm` /
//! `post_mlp_layernorm`); the attention with per-head q / k norms, its output times
//! `sigmoid(gate_proj(x))` (fused as `[q | gate | k | v]` rows, as Qwen3.5's gated form), RoPE
//! and a sliding window on the sliding layers, none on the full ones; the first layers a dense
//! MLP, the others sigmoid-routed experts beside shared ones ([`super::afmoe_config::moe`]).
//! With `mup_enabled` the embeddings are times √hidden.

use super::decoder::Decoder;
use super::dense::{load_ffn, load_with};
use super::layers::{Attention, Layer, Loader, Part, SoftmaxVariant, Sublayer};
use super::{ModelError, ModelSpec};
use crate::kernels::Device;
use crate::kernels::rope::Rope;

pub fn load<D: Device>(ld: &Loader<'_, D>, spec: ModelSpec) -> Result<Decoder<D>, ModelError> {
    let mup = spec.afmoe.as_ref().is_some_and(|a| a.mup);
    let hidden = spec.hidden_size;
    let mut decoder = load_with(ld, spec, load_layer)?;
    if mup {
        decoder.embed_scale = (hidden as f64).sqrt() as f32;
    }
    Ok(decoder)
}

fn load_layer<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    i: usize,
) -> Result<Layer<D>, ModelError> {
    let p = format!("model.layers.{i}");
    let norm = |n: &str| ld.vector(&format!("{p}.{n}.weight"), spec.hidden_size);
    let attention = Sublayer::Attention(load_attention(ld, spec, i)?);
    let ffn = load_ffn(ld, spec, &p, i)?;
    Ok(Layer {
        parts: vec![
            Part::sandwich(
                norm("input_layernorm")?,
                attention,
                norm("post_attention_layernorm")?,
            ),
            Part::sandwich(norm("pre_mlp_layernorm")?, ffn, norm("post_mlp_layernorm")?),
        ],
        scale: 1.0,
    })
}

fn load_attention<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    i: usize,
) -> Result<Attention<D>, ModelError> {
    let a = (spec.afmoe.as_ref())
        .ok_or_else(|| ModelError::InvalidOptions("an AFMoE spec without its windows".into()))?;
    let attn = |n: &str| format!("model.layers.{i}.self_attn.{n}");
    let (h, hd) = (spec.hidden_size, spec.head_dim);
    let (qd, kvd) = (spec.num_heads * hd, spec.num_kv_heads * hd);
    let qkv = ld.linear(
        &[
            (attn("q_proj"), qd),
            (attn("gate_proj"), qd),
            (attn("k_proj"), kvd),
            (attn("v_proj"), kvd),
        ],
        h,
        false,
    )?;
    let norm = |n: &str| ld.vector(&attn(&format!("{n}.weight")), hd);
    let sliding = a.sliding[i];
    let rope = match sliding {
        true => {
            let rope = Rope::new(hd, spec.rope_theta, spec.rope_scaling);
            Some((ld.dev.rope_table(&rope)?, hd))
        }
        false => None,
    };
    Ok(Attention {
        qk_norm: Some((norm("q_norm")?, Some(norm("k_norm")?))),
        rope,
        gated: true,
        variant: SoftmaxVariant {
            window: sliding.then_some(a.window),
            ..SoftmaxVariant::causal()
        },
        ..Attention::plain((qkv, ld.linear1(&attn("o_proj"), h, qd, false)?), spec, i)
    })
}
