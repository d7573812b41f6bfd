//! MiMo-V2-Flash (`MiMoV2FlashForCausalLM`, `model.*` checkpoint names).
//!
//! Per layer: `input_layernorm` -> attention -> `post_attention_layernorm` -> a SwiGLU MLP or
//! the MoE block (`mlp.gate` with `gate.e_score_correction_bias`, experts `mlp.experts.{e}.*`:
//! DeepSeek-V3's grouped sigmoid router, no shared expert), as [`super::dense`] reads them.
//!
//! The attention: q and k heads of `head_dim`, v heads of `v_head_dim` (192 / 128 released),
//! every value times `attention_value_scale`; the first `int(head_dim · 0.334)` dims of each
//! head rotated by its kind's RoPE; sliding layers with their window, twice the KV heads and
//! learned sinks (`self_attn.attention_sink_bias`, as released and as transformers saves them).
//! The attention kernels take one head size, so each KV head's `v_proj` rows are followed by
//! zero rows up to `head_dim` and `o_proj` has zero columns to match (a padded value dim is 0
//! in every output, and meets a zero weight); the KV cache holds the larger kind's KV heads,
//! the other kind's heads repeated to fill it (their projection rows read twice: the same
//! keys and values). The multi-token-prediction layers (`model.mtp.*`) are not read.

use super::config::MimoSpec;
use super::decoder::Decoder;
use super::layers::{Attention, Loader, SoftmaxVariant, Sublayer};
use super::{ModelError, ModelSpec};
use crate::kernels::Device;
use crate::kernels::device::HostMatrix;
use crate::kernels::rope::Rope;

pub fn load<D: Device>(ld: &Loader<'_, D>, spec: ModelSpec) -> Result<Decoder<D>, ModelError> {
    let m = spec.mimo.clone().ok_or_else(|| {
        ModelError::InvalidOptions("MiMoV2FlashForCausalLM spec without its MiMo fields".into())
    })?;
    super::dense::load_with(ld, spec, |ld, spec, i| {
        let p = format!("model.layers.{i}");
        let attention = Sublayer::Attention(load_attention(ld, spec, &m, i)?);
        let ffn = super::dense::load_ffn(ld, spec, &p, i)?;
        super::dense::attention_layer(ld, spec, &p, attention, ffn)
    })
}

fn load_attention<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    m: &MimoSpec,
    i: usize,
) -> Result<Attention<D>, ModelError> {
    let attn = |n: &str| format!("model.layers.{i}.self_attn.{n}");
    let (h, heads, hd, vd) = (
        spec.hidden_size,
        spec.num_heads,
        spec.head_dim,
        m.v_head_dim,
    );
    let kind = m.kind(i);
    let kv = m.kv_heads[kind];
    // The config parser checked that it divides.
    let repeat = spec.num_kv_heads / kv;
    let q = ld.matrix(&attn("q_proj.weight"), heads * hd, h)?;
    let mut bias = match spec.qkv_bias {
        true => ld.f32s(&attn("q_proj.bias"), &[heads * hd])?,
        false => Vec::new(),
    };
    let (k, k_bias) = ld.repeated_heads(&attn("k_proj"), (kv, hd, repeat), h, spec.qkv_bias)?;
    let (v, v_bias) = ld.repeated_heads(&attn("v_proj"), (kv, vd, repeat), h, spec.qkv_bias)?;
    // Each value head's rows (and bias) followed by zeros up to the q / k width.
    let v = v.pad_row_groups(kv * repeat, vd, hd);
    bias.extend(k_bias);
    bias.extend((v_bias.chunks(vd)).flat_map(|b| b.iter().copied().chain(vec![0.0; hd - vd])));
    let qkv = HostMatrix::stack(vec![q, k, v]).map_err(ModelError::Device)?;
    let qkv = ld.dev.linear(qkv, spec.qkv_bias.then_some(bias))?;
    let o = ld.matrix(&attn("o_proj.weight"), h, heads * vd)?;
    let (theta, scaling, rot) = m.rope[kind];
    let rope = Rope::new(rot, theta, scaling);
    let sinks = match m.sinks[kind] {
        true => Some(ld.vector(&attn("attention_sink_bias"), heads)?),
        false => None,
    };
    Ok(Attention {
        rope: Some((ld.dev.rope_table(&rope)?, rot)),
        heads,
        kv_heads: kv * repeat,
        head_dim: hd,
        variant: SoftmaxVariant {
            window: m.sliding[i].then_some(m.window),
            sinks,
            ..SoftmaxVariant::causal()
        },
        value_scale: Some(m.value_scale),
        ..Attention::plain(
            (qkv, ld.dev.linear(o.pad_col_groups(heads, vd, hd), None)?),
            spec,
            i,
        )
    })
}
