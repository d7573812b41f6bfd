//! Llama-4's language model (`Llama4ForCausalLM`; `Llama4ForConditionalGeneration` exports
//! run text-only, their `language_model.model.*` answering to `model.*`).
//!
//! Per layer: `input_layernorm` -> attention -> `post_attention_layernorm` -> `feed_forward`:
//! - attention (`self_attn.{q,k,v,o}_proj`): on a RoPE layer ([`Llama4Spec::rope_layers`])
//!   RoPE (llama3 scaling), then with `use_qk_norm` q and k RMS-normed per head without a weight
//!   (`Llama4TextL2Norm`; after RoPE there, before it here: a rotation keeps a head's norm), and
//!   keys in chunks where the layer type is `chunked_attention`; on a NoPE layer the query
//!   temperature. transformers rotates interleaved pairs `(x0, x1), (x2, x3), …` (complex
//!   RoPE); the q and k rows of each head are reordered at load to `x0, x2, …, x1, x3, …`,
//!   whose half-split rotation is the same (q·k and the norms do not see the order; v and o
//!   are untouched);
//! - `feed_forward`: the MoE block ([`MoeRouter::Llama4`]: `router`, experts
//!   `experts.gate_up_proj` `[E, H, 2I]` / `experts.down_proj` `[E, I, H]`, `shared_expert`)
//!   in the sparse layers, else a SwiGLU MLP (`{gate,up,down}_proj`, `intermediate_size_mlp`).
//!
//! [`MoeRouter::Llama4`]: super::hybrid_config::MoeRouter::Llama4

use super::decoder::Decoder;
use super::dense::{attention_layer, attention_of, load_with};
use super::layers::{Attention, Layer, Loader, SoftmaxVariant, Sublayer};
use super::llama4_config::Llama4Spec;
use super::moe_weights::{self, GATE_BIAS, QWEN_EXPERTS};
use super::{ModelError, ModelSpec};
use crate::kernels::Device;
use crate::kernels::device::HostMatrix;
use crate::kernels::rope::Rope;

pub fn load<D: Device>(ld: &Loader<'_, D>, spec: ModelSpec) -> Result<Decoder<D>, ModelError> {
    load_with(ld, spec, load_layer)
}

fn load_layer<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    i: usize,
) -> Result<Layer<D>, ModelError> {
    let l4 = spec
        .llama4
        .as_ref()
        .ok_or_else(|| ModelError::Unsupported {
            path: "config.json".into(),
            what: "a Llama-4 model without its Llama-4 fields".into(),
        })?;
    let p = format!("model.layers.{i}");
    let attention = load_attention(ld, spec, l4, i)?;
    let moe = spec.hybrid.as_ref().and_then(|h| h.moe.as_ref());
    let ff = format!("{p}.feed_forward");
    let ffn = match moe {
        Some(m) if m.sparse_layers[i] => {
            let names = (QWEN_EXPERTS, GATE_BIAS);
            Sublayer::Moe(moe_weights::load(ld, &ff, spec.hidden_size, m, names)?)
        }
        _ => {
            let (h, inter) = (spec.hidden_size, spec.intermediate_size);
            Sublayer::Mlp(moe_weights::swiglu(ld, &ff, h, inter, QWEN_EXPERTS)?)
        }
    };
    attention_layer(ld, spec, &p, Sublayer::Attention(attention), ffn)
}

/// Layer `i`'s attention: q and k rows de-interleaved per head on its RoPE layers.
fn load_attention<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    l4: &Llama4Spec,
    i: usize,
) -> Result<Attention<D>, ModelError> {
    let attn = |n: &str| format!("model.layers.{i}.self_attn.{n}");
    let (h, hd) = (spec.hidden_size, spec.head_dim);
    let (qd, kvd) = (spec.num_heads * hd, spec.num_kv_heads * hd);
    let rope = l4.rope_layers[i];
    let mut mats = Vec::with_capacity(3);
    let mut bias = Vec::new();
    for (name, rows, heads) in [
        ("q_proj", qd, spec.num_heads),
        ("k_proj", kvd, spec.num_kv_heads),
        ("v_proj", kvd, 0),
    ] {
        let m = ld.matrix(&attn(&format!("{name}.weight")), rows, h)?;
        let b = match spec.qkv_bias {
            true => ld.f32s(&attn(&format!("{name}.bias")), &[rows])?,
            false => Vec::new(),
        };
        // Only rotated heads are reordered (a NoPE layer's order is the checkpoint's).
        let order = half_split_rows(if rope { heads } else { 0 }, hd, rows);
        let ranges: Vec<(usize, usize)> = order.iter().map(|&r| (r, 1)).collect();
        mats.push(m.select_rows(&ranges));
        if !b.is_empty() {
            bias.extend(order.iter().map(|&r| b[r]));
        }
    }
    let qkv = HostMatrix::stack(mats).map_err(ModelError::Device)?;
    // Weightless: a weight of ones (`x · 1` is `x`).
    let ones = || ld.dev.vector(&vec![1.0; hd]);
    let norm = match rope && l4.qk_norm {
        true => Some((ones()?, Some(ones()?))),
        false => None,
    };
    let table = match rope {
        true => {
            let r = Rope::new(hd, spec.rope_theta, spec.rope_scaling);
            Some((ld.dev.rope_table(&r)?, hd))
        }
        false => None,
    };
    let variant = SoftmaxVariant {
        chunk: l4.chunks[i],
        temperature: l4.temperature.filter(|_| !rope),
        ..SoftmaxVariant::causal()
    };
    let qkv = ld.dev.linear(qkv, spec.qkv_bias.then_some(bias))?;
    attention_of(ld, spec, i, (qkv, norm, table), variant)
}

/// Row order of a projection of `rows` rows whose first `heads` heads of `hd` rows hold
/// interleaved pairs: each of those heads' even rows, then its odd rows; the other rows as
/// they are.
fn half_split_rows(heads: usize, hd: usize, rows: usize) -> Vec<usize> {
    let mut order = Vec::with_capacity(rows);
    for head in 0..heads {
        let base = head * hd;
        order.extend((0..hd).step_by(2).map(|j| base + j));
        order.extend((1..hd).step_by(2).map(|j| base + j));
    }
    order.extend(heads * hd..rows);
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotated_heads_are_split_into_even_then_odd_rows() {
        // Two heads of 4 rotated, then 3 rows left as they are.
        assert_eq!(
            half_split_rows(2, 4, 11),
            vec![0, 2, 1, 3, 4, 6, 5, 7, 8, 9, 10]
        );
        assert_eq!(half_split_rows(0, 4, 3), vec![0, 1, 2]);
    }
}
