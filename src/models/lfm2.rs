//! LFM2 (`Lfm2ForCausalLM`) and LFM2-MoE (`Lfm2MoeForCausalLM`), `model.*` names: per layer
//! `operator_norm` -> a gated short convolution (`conv.in_proj`, `conv.conv`, `conv.out_proj`)
//! or attention (`self_attn.{q,k,v}_proj`, per-head `q_layernorm` / `k_layernorm`, RoPE,
//! `out_proj`), then `ffn_norm` -> `feed_forward`: a SwiGLU MLP (`w1` gate, `w3` up, `w2`
//! down) or LFM2-MoE's experts (`gate`, `expert_bias`, experts `w1` / `w3` / `w2` as released
//! or transformers' fused `gate_up_proj` / `down_proj`); the final norm is
//! `model.embedding_norm`. LFM3 (`Lfm3ForCausalLM`): Qwen3's attention names (`o_proj`,
//! `q_norm` / `k_norm`, biases where `attention_bias`) with `gate_proj` (a sigmoid gate per head,
//! its row repeated over the head's values: Qwen3.5's gated attention layout), sliding layers,
//! each kind's RoPE, and `post_operator_norm` / `post_ffn_norm` on the sublayers' outputs.

use super::decoder::{Decoder, FinalNorm};
use super::hybrid_config::{HybridSpec, LayerKind};
use super::layers::{
    Attention, CausalConv, Layer, Loader, Part, ShortConv, SoftmaxVariant, Sublayer,
};
use super::lfm2_config::{Lfm2Spec, Lfm3Attention};
use super::moe_weights::{self, MIXTRAL_EXPERTS, swiglu};
use super::{ModelError, ModelSpec};
use crate::kernels::Device;
use crate::kernels::device::HostMatrix;
use crate::kernels::rope::Rope;

pub fn load<D: Device>(ld: &Loader<'_, D>, spec: ModelSpec) -> Result<Decoder<D>, ModelError> {
    let invalid = || {
        ModelError::InvalidOptions(format!(
            "{:?} spec without its layer kinds",
            spec.architecture
        ))
    };
    let hybrid = spec.hybrid.clone().ok_or_else(invalid)?;
    let lfm2 = spec.lfm2.clone().ok_or_else(invalid)?;
    let h = spec.hidden_size;
    let vocab = ld.vocab(&spec, "model.embed_tokens")?;
    let layers = (0..spec.num_layers)
        .map(|i| load_layer(ld, &spec, (&hybrid, &lfm2), i))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Decoder {
        embed_scale: 1.0,
        final_norm: FinalNorm::Norm(ld.vector("model.embedding_norm.weight", h)?),
        spec,
        vocab,
        layers,
        ple: None,
    })
}

/// Layer `i`: its short convolution or attention, then its MLP or experts, each after its
/// norm (and, LFM3's sandwich, before its post-norm).
fn load_layer<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    (hybrid, lfm2): (&HybridSpec, &Lfm2Spec),
    i: usize,
) -> Result<Layer<D>, ModelError> {
    let (p, h) = (format!("model.layers.{i}"), spec.hidden_size);
    let index = hybrid.index_in_kind(i);
    let mixer = match hybrid.layers[i] {
        LayerKind::ShortConv => Sublayer::ShortConv(load_short_conv(ld, &p, h, lfm2, index)?),
        _ => Sublayer::Attention(load_attention(ld, spec, lfm2.lfm3.as_ref(), (i, index))?),
    };
    let norm = |n: &str| ld.vector(&format!("{p}.{n}.weight"), h);
    let ffn = load_ffn(ld, spec, hybrid, &p, i)?;
    let parts = match lfm2.lfm3.as_ref().is_some_and(|a| a.sandwich) {
        true => vec![
            Part::sandwich(norm("operator_norm")?, mixer, norm("post_operator_norm")?),
            Part::sandwich(norm("ffn_norm")?, ffn, norm("post_ffn_norm")?),
        ],
        false => vec![
            Part::new(norm("operator_norm")?, mixer),
            Part::new(norm("ffn_norm")?, ffn),
        ],
    };
    Ok(Layer { parts, scale: 1.0 })
}

/// Layer `p`'s short convolution, its window in recurrent layer `state_layer`.
fn load_short_conv<D: Device>(
    ld: &Loader<'_, D>,
    p: &str,
    h: usize,
    lfm2: &Lfm2Spec,
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

/// Layer `i`'s attention, its cache in KV layer `kv_layer`: LFM2's (`out_proj`,
/// `q_layernorm` / `k_layernorm`, full, one RoPE), or LFM3's (`a`: `o_proj`, `q_norm` /
/// `k_norm`, biases where `attention_bias`; `[q | gate | k | v]` with the gate's row of each head
/// repeated `head_dim` times where it is gated; the window and RoPE of its kind).
fn load_attention<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    lfm3: Option<&Lfm3Attention>,
    (i, kv_layer): (usize, usize),
) -> Result<Attention<D>, ModelError> {
    let n = |s: &str| format!("model.layers.{i}.self_attn.{s}");
    let (h, hd, nh) = (spec.hidden_size, spec.head_dim, spec.num_heads);
    let (qd, kvd, bias) = (nh * hd, spec.num_kv_heads * hd, spec.qkv_bias);
    let gated = lfm3.is_some_and(|a| a.gate);
    let mut mats = vec![ld.matrix(&n("q_proj.weight"), qd, h)?];
    let mut b = match bias {
        true => ld.f32s(&n("q_proj.bias"), &[qd])?,
        false => Vec::new(),
    };
    if gated {
        // Released (and saved by transformers) as `gate_proj`, `g_proj` in its memory; no bias
        // of its own: zeros beside the others'.
        let g = match ld.w.contains(&n("g_proj.weight")) {
            true => n("g_proj"),
            false => n("gate_proj"),
        };
        mats.push(ld.repeated_heads(&g, (nh, 1, hd), h, false)?.0);
        b.extend(std::iter::repeat_n(0.0, if bias { qd } else { 0 }));
    }
    for (x, rows) in [("k_proj", kvd), ("v_proj", kvd)] {
        mats.push(ld.matrix(&n(&format!("{x}.weight")), rows, h)?);
        if bias {
            b.extend(ld.f32s(&n(&format!("{x}.bias")), &[rows])?);
        }
    }
    let qkv = HostMatrix::stack(mats).map_err(ModelError::Device)?;
    let (o, q_norm, k_norm) = match lfm3 {
        Some(_) => ("o_proj", "q_norm", "k_norm"),
        None => ("out_proj", "q_layernorm", "k_layernorm"),
    };
    let sliding = lfm3.is_some_and(|a| a.sliding[i]);
    let rope = match lfm3 {
        Some(a) => (if sliding { a.ropes.0 } else { a.ropes.1 }).table(hd),
        None => Rope::new(hd, spec.rope_theta, spec.rope_scaling),
    };
    let norm = |s: &str| ld.vector(&n(&format!("{s}.weight")), hd);
    Ok(Attention {
        qk_norm: Some((norm(q_norm)?, Some(norm(k_norm)?))),
        rope: Some((ld.dev.rope_table(&rope)?, hd)),
        gated,
        variant: SoftmaxVariant {
            window: lfm3.filter(|_| sliding).map(|a| a.window),
            ..SoftmaxVariant::causal()
        },
        ..Attention::plain(
            (
                ld.dev.linear(qkv, bias.then_some(b))?,
                ld.linear1(&n(o), h, qd, spec.o_bias)?,
            ),
            spec,
            kv_layer,
        )
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
