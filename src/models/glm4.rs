//! GLM-4 (`Glm4ForCausalLM`: GLM-4-0414 9B / 32B, GLM-Z1; `model.*` names): Llama's attention
//! with q / k / v biases and RoPE on the first `partial_rotary_factor` (½) of each head in
//! interleaved pairs `(2i, 2i + 1)`, and a sandwich: each sublayer's input normed
//! (`input_layernorm`, `post_attention_layernorm`) and its output too
//! (`post_self_attn_layernorm`, `post_mlp_layernorm`) before the add; a fused
//! `mlp.gate_up_proj`.
//!
//! hsx rotates halves: each q and k head's rotated rows are loaded in the order
//! `0, 2, 4, …, 1, 3, 5, …`, which makes GLM's interleaved pairs rotate-half pairs at the same
//! frequencies; q · k sums the same products in another order, and v and the output are
//! untouched.

use super::decoder::Decoder;
use super::dense::{attention_of, load_with};
use super::layers::mlp::Activation;
use super::layers::{Attention, Layer, Loader, Mlp, Part, SoftmaxVariant, Sublayer};
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
    let p = format!("model.layers.{i}");
    let (h, inter) = (spec.hidden_size, spec.intermediate_size);
    let norm = |n: &str| ld.vector(&format!("{p}.{n}.weight"), h);
    let part = |pre: &str, sublayer, post: &str| {
        Ok::<_, ModelError>(Part::sandwich(norm(pre)?, sublayer, norm(post)?))
    };
    let mlp = Mlp {
        up: ld.linear1(&format!("{p}.mlp.gate_up_proj"), 2 * inter, h, false)?,
        down: ld.linear1(&format!("{p}.mlp.down_proj"), h, inter, false)?,
        act: Activation::SwiGlu,
        inter,
    };
    let attention = Sublayer::Attention(load_attention(ld, spec, i)?);
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

/// The rows of `heads` heads of `hd` with each head's first `rot` rows de-interleaved.
fn deinterleaved(heads: usize, hd: usize, rot: usize) -> Vec<(usize, usize)> {
    let order = (0..rot / 2)
        .map(|j| 2 * j)
        .chain((0..rot / 2).map(|j| 2 * j + 1))
        .chain(rot..hd);
    let order: Vec<usize> = order.collect();
    (0..heads)
        .flat_map(|head| order.iter().map(move |&r| (head * hd + r, 1)))
        .collect()
}

fn load_attention<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    i: usize,
) -> Result<Attention<D>, ModelError> {
    let attn = |n: &str| format!("model.layers.{i}.self_attn.{n}");
    let (h, hd) = (spec.hidden_size, spec.head_dim);
    let rot = spec.rotated_dims();
    let (q_rows, k_rows) = (
        deinterleaved(spec.num_heads, hd, rot),
        deinterleaved(spec.num_kv_heads, hd, rot),
    );
    let (qd, kvd) = (spec.num_heads * hd, spec.num_kv_heads * hd);
    let matrix = |n: &str, rows| ld.matrix(&attn(&format!("{n}.weight")), rows, h);
    let qkv = HostMatrix::stack(vec![
        matrix("q_proj", qd)?.select_rows(&q_rows),
        matrix("k_proj", kvd)?.select_rows(&k_rows),
        matrix("v_proj", kvd)?,
    ])
    .map_err(ModelError::Device)?;
    let bias = match spec.qkv_bias {
        true => {
            let pick = |b: Vec<f32>, rows: &[(usize, usize)]| -> Vec<f32> {
                rows.iter().map(|&(r, _)| b[r]).collect()
            };
            let mut b = pick(ld.f32s(&attn("q_proj.bias"), &[qd])?, &q_rows);
            b.extend(pick(ld.f32s(&attn("k_proj.bias"), &[kvd])?, &k_rows));
            b.extend(ld.f32s(&attn("v_proj.bias"), &[kvd])?);
            Some(b)
        }
        false => None,
    };
    let qkv = ld.dev.linear(qkv, bias)?;
    let rope = Rope::new(rot, spec.rope_theta, spec.rope_scaling);
    let rope = Some((ld.dev.rope_table(&rope)?, rot));
    attention_of(ld, spec, i, (qkv, None, rope), SoftmaxVariant::causal())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two heads of 6 with 4 rotated dims: rows 0, 2, 1, 3 then the passed-through 4, 5.
    #[test]
    fn rotated_rows_are_deinterleaved_per_head() {
        let rows: Vec<usize> = deinterleaved(2, 6, 4).iter().map(|r| r.0).collect();
        assert_eq!(rows, [0, 2, 1, 3, 4, 5, 6, 8, 7, 9, 10, 11]);
    }
}
