//! LFM2 (`Lfm2ForCausalLM`) and LFM2-MoE (`Lfm2MoeForCausalLM`), `model.*` names: per layer
//! `operator_norm` -> a gated short convolution (`conv.in_proj`, `conv.conv`, `conv.out_proj`)
//! or attention (`self_attn.{q,k,v}_proj`, per-head `q_layernorm` / `k_layernorm`, RoPE,
//! `out_proj`), then `ffn_norm` -> `feed_forward`: a SwiGLU MLP (`w1` gate, `w3` up, `w2`
//! down) or LFM2-MoE's experts (`gate`, `expert_bias`, experts `w1` / `w3` / `w2` as released
//! or transformers' fused `gate_up_proj` / `down_proj`); the final norm is
//! `model.embedding_norm`.

use super::decoder::{Decoder, FinalNorm};
use super::hybrid_config::{HybridSpec, LayerKind};
use super::layers::{
    Attention, CausalConv, Layer, Loader, Part, ShortConv, SoftmaxVariant, Sublayer,
};
use super::moe_weights::{self, MIXTRAL_EXPERTS, swiglu};
use super::{ModelError, ModelSpec};
use crate::kernels::Device;
use crate::kernels::rope::Rope;

pub fn load<D: Device>(ld: &Loader<'_, D>, spec: ModelSpec) -> Result<Decoder<D>, ModelError> {
    let invalid = || {
        ModelError::InvalidOptions(format!(
            "{:?} spec without its layer kinds",
            spec.architecture
        ))
    };
    let hybrid = spec.hybrid.clone().ok_or_else(invalid)?;
    let lfm2 = spec.lfm2.ok_or_else(invalid)?;
    let h = spec.hidden_size;
    let vocab = ld.vocab(&spec, "model.embed_tokens")?;
    let mut layers = Vec::with_capacity(spec.num_layers);
    for i in 0..spec.num_layers {
        let p = format!("model.layers.{i}");
        let index = hybrid.index_in_kind(i);
        let mixer = match hybrid.layers[i] {
            LayerKind::ShortConv => Sublayer::ShortConv(load_short_conv(ld, &p, h, lfm2, index)?),
            _ => Sublayer::Attention(load_attention(ld, &spec, &p, index)?),
        };
        let norm = |n: &str| ld.vector(&format!("{p}.{n}.weight"), h);
        layers.push(Layer {
            parts: vec![
                Part::new(norm("operator_norm")?, mixer),
                Part::new(norm("ffn_norm")?, load_ffn(ld, &spec, &hybrid, &p, i)?),
            ],
            scale: 1.0,
        });
    }
    Ok(Decoder {
        embed_scale: 1.0,
        final_norm: FinalNorm::Norm(ld.vector("model.embedding_norm.weight", h)?),
        spec,
        vocab,
        layers,
        ple: None,
    })
}

/// Layer `p`'s short convolution, its window in recurrent layer `state_layer`.
fn load_short_conv<D: Device>(
    ld: &Loader<'_, D>,
    p: &str,
    h: usize,
    lfm2: super::lfm2_config::Lfm2Spec,
    state_layer: usize,
) -> Result<ShortConv<D>, ModelError> {
    let n = |s: &str| format!("{p}.conv.{s}");
    let (k, bias) = (lfm2.conv_kernel, lfm2.conv_bias);
    let conv_bias = match bias {
        true => Some(ld.vector(&n("conv.bias"), h)?),
        false => None,
    };
    Ok(ShortConv {
        in_proj: ld.linear1(&n("in_proj"), 3 * h, h, bias)?,
        conv: CausalConv {
            weight: ld.dev.vector(&ld.f32s(&n("conv.weight"), &[h, 1, k])?)?,
            bias: conv_bias,
            kernel: k,
            state_layer,
            silu: false,
        },
        out_proj: ld.linear1(&n("out_proj"), h, h, bias)?,
        hidden: h,
    })
}

/// Layer `p`'s attention, its cache in KV layer `kv_layer`.
fn load_attention<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    p: &str,
    kv_layer: usize,
) -> Result<Attention<D>, ModelError> {
    let n = |s: &str| format!("{p}.self_attn.{s}");
    let (h, hd) = (spec.hidden_size, spec.head_dim);
    let (qd, kvd) = (spec.num_heads * hd, spec.num_kv_heads * hd);
    let qkv = [(n("q_proj"), qd), (n("k_proj"), kvd), (n("v_proj"), kvd)];
    let norm = |s: &str| ld.vector(&n(&format!("{s}.weight")), hd);
    let rope = Rope::new(hd, spec.rope_theta, spec.rope_scaling);
    Ok(Attention {
        qkv: ld.linear(&qkv, h, false)?,
        o: ld.linear1(&n("out_proj"), h, qd, false)?,
        qk_norm: Some((norm("q_layernorm")?, Some(norm("k_layernorm")?))),
        v_norm: None,
        rope: Some((ld.dev.rope_table(&rope)?, hd)),
        gated: false,
        heads: spec.num_heads,
        kv_heads: spec.num_kv_heads,
        head_dim: hd,
        eps: spec.rms_norm_eps,
        kv_layer,
        shared_kv: false,
        variant: SoftmaxVariant::causal(),
        qsa: None,
        value_scale: None,
        qk_norm_after_rope: false,
    })
}

/// Layer `i`'s (`p`) `feed_forward`: LFM2-MoE's experts where its layer is sparse, else the
/// SwiGLU MLP.
fn load_ffn<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    hybrid: &HybridSpec,
    p: &str,
    i: usize,
) -> Result<Sublayer<D>, ModelError> {
    let (h, px) = (spec.hidden_size, format!("{p}.feed_forward"));
    Ok(match &hybrid.moe {
        Some(m) if m.sparse_layers[i] => Sublayer::Moe(moe_weights::load(
            ld,
            &px,
            h,
            m,
            (MIXTRAL_EXPERTS, "expert_bias"),
        )?),
        _ => Sublayer::Mlp(swiglu(ld, &px, h, spec.intermediate_size, MIXTRAL_EXPERTS)?),
    })
}
