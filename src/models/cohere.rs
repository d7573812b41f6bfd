//! Cohere (`CohereForCausalLM`: Command R, Aya Expanse), Cohere 2 (`Cohere2ForCausalLM`:
//! Command R7B, Command A) and Cohere 2 MoE (`Cohere2MoeForCausalLM`), `model.*` names. Per
//! layer one `input_layernorm` (a LayerNorm without bias; Cohere 2 MoE's an RMSNorm where its
//! config says so) feeds the attention and the MLP in parallel, `x += attn(n) + mlp(n)`; RoPE
//! on interleaved pairs (loaded de-interleaved, as GLM-4's), Cohere 2's sliding layers with
//! RoPE and a window, its full layers without RoPE ([`super::cohere_config`]); Cohere 2 MoE's
//! experts under `mlp` beside `shared_experts`, their sum halved where the config averages them.

use super::decoder::Decoder;
use super::dense::{attention_layer, load_attention, load_ffn, load_windowed_attention, load_with};
use super::layers::{Layer, Loader, SoftmaxVariant, Sublayer};
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
    let attention = match spec.architecture {
        Architecture::Cohere => load_attention(ld, spec, i, SoftmaxVariant::causal())?,
        _ => load_windowed_attention(ld, spec, i, SoftmaxVariant::causal())?,
    };
    let mut ffn = load_ffn(ld, spec, &p, i)?;
    if let (Sublayer::Moe(moe), Some(c)) = (&mut ffn, &spec.cohere)
        && c.moe_average
    {
        moe.out_scale = 0.5;
    }
    // Parallel: the spec's residual is (`cohere_config`).
    attention_layer(ld, spec, &p, Sublayer::Attention(attention), ffn)
}
