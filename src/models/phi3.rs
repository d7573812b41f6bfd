//! Phi-3 (`Phi3ForCausalLM`: Phi-3 mini / medium, Phi-4): Llama's decoder with the attention's
//! q, k and v rows in one `self_attn.qkv_proj` (`[q | k | v]`, hsx's fused layout) and the MLP's
//! gate and up rows in one `mlp.gate_up_proj` (`[gate | up]`); every layer windowed where
//! `sliding_window` is below the context, as Mistral's. LongRoPE (the 128k Phi-3s, Phi-3.5-mini,
//! Phi-4-mini with a partial rotary factor) on its short factors, so up to
//! `original_max_position_embeddings` (`config::LongRope`).

use super::decoder::Decoder;
use super::dense::{self, attention_layer, attention_of};
use super::layers::mlp::Activation;
use super::layers::{Layer, Loader, Mlp, SoftmaxVariant, Sublayer};
use super::{ModelError, ModelSpec};
use crate::kernels::Device;
use crate::kernels::rope::Rope;

pub fn load<D: Device>(ld: &Loader<'_, D>, spec: ModelSpec) -> Result<Decoder<D>, ModelError> {
    dense::load_with(ld, spec, load_layer)
}

fn load_layer<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    i: usize,
) -> Result<Layer<D>, ModelError> {
    let p = format!("model.layers.{i}");
    let (h, hd) = (spec.hidden_size, spec.head_dim);
    let rows = (spec.num_heads + 2 * spec.num_kv_heads) * hd;
    let qkv = ld.linear1(&format!("{p}.self_attn.qkv_proj"), rows, h, false)?;
    let (rope, rot) = match &spec.longrope {
        Some(l) => {
            let (theta, scale) = (spec.rope_theta, l.attention_factor);
            let rot = l.rotary_dim;
            (Rope::with_factors(rot, theta, &l.short_factor, scale), rot)
        }
        None => (Rope::new(hd, spec.rope_theta, spec.rope_scaling), hd),
    };
    let rope = Some((ld.dev.rope_table(&rope)?, rot));
    let variant = SoftmaxVariant {
        window: spec.sliding_window,
        ..SoftmaxVariant::causal()
    };
    let attention = attention_of(ld, spec, i, (qkv, None, rope), variant)?;
    let inter = spec.intermediate_size;
    let mlp = Mlp {
        up: ld.linear1(&format!("{p}.mlp.gate_up_proj"), 2 * inter, h, false)?,
        down: ld.linear1(&format!("{p}.mlp.down_proj"), h, inter, false)?,
        act: Activation::SwiGlu,
        inter,
    };
    attention_layer(
        ld,
        spec,
        &p,
        Sublayer::Attention(attention),
        Sublayer::Mlp(mlp),
    )
}
