//! Jamba (`JambaForCausalLM`: Jamba-v0.1, Jamba 1.5 / 1.6 / 1.7 Mini and Large, Jamba
//! Reasoning 3B): per layer (`model.layers.{i}`) a mixer after `input_layernorm` — attention
//! (`self_attn.*`: no RoPE, no bias) where `i % attn_layer_period == attn_layer_offset`, else
//! Mamba-1 (`mamba.*`, with weighted RMS norms of dt, B and C: [`super::mamba::load_mixer`]) —
//! then after `pre_ff_layernorm` the `feed_forward`: a sparse MoE block (`router`, softmax
//! top-k left unnormalised, SwiGLU experts) where `i % expert_layer_period ==
//! expert_layer_offset`, else a SwiGLU MLP. The final norm is `model.final_layernorm`.

use super::config::{Architecture, Cfg, default_max_pos};
use super::decoder::{Decoder, FinalNorm};
use super::dense::load_mlp;
use super::hybrid_config::{HybridSpec, LayerKind, MoeRouter, MoeSpec};
use super::layers::mlp::Activation;
use super::layers::{Layer, Loader, Part, SoftmaxVariant, Sublayer};
use super::mamba::{Mamba1Spec, dt_rank, load_mixer};
use super::moe_weights::{GATE_BIAS, QWEN_EXPERTS};
use super::{ModelError, ModelSpec, QkNorm, RopeScaling, WeightDtype};
use crate::kernels::Device;

/// The spec of a `JambaConfig`, with the class's defaults.
pub(super) fn parse(cfg: &Cfg<'_>, name: String) -> Result<ModelSpec, ModelError> {
    let arch = Architecture::Jamba;
    // The MLPs' and experts' activation, and the Mamba mixers' conv and gate.
    cfg.check_activation()?;
    let hidden = cfg.usize_or("hidden_size", 4096)?;
    let n = cfg.num_layers_or(32)?;
    let heads = cfg.positive_or("num_attention_heads", 32)?;
    let eps = cfg.f64_or("rms_norm_eps", 1e-6)?;
    let attn = periodic(cfg, "attn_layer", (8, 4), n)?;
    let layers = attn
        .iter()
        .map(|&a| {
            if a {
                LayerKind::Attention
            } else {
                LayerKind::Mamba1
            }
        })
        .collect::<Vec<_>>();
    let experts = cfg.usize_or("num_experts", 16)?;
    let sparse = periodic(cfg, "expert_layer", (2, 1), n)?;
    let moe = (experts > 1).then(|| -> Result<MoeSpec, ModelError> {
        Ok(MoeSpec {
            num_experts: experts,
            top_k: cfg.usize_or("num_experts_per_tok", 2)?,
            expert_intermediate: cfg.usize_or("intermediate_size", 14336)?,
            shared_intermediate: None,
            norm_topk_prob: false,
            sparse_layers: sparse,
            router: MoeRouter::Softmax,
        })
    });
    Ok(ModelSpec {
        vocab_size: cfg.usize_or("vocab_size", 65536)?,
        hidden_size: hidden,
        num_layers: n,
        num_heads: heads,
        // The class's default is 8; `null` means one per query head.
        num_kv_heads: match cfg.has("num_key_value_heads")
            && cfg.get("num_key_value_heads").is_none()
        {
            true => heads,
            false => cfg.usize_or("num_key_value_heads", 8)?,
        },
        head_dim: cfg.usize_or("head_dim", hidden / heads)?,
        intermediate_size: cfg.usize_or("intermediate_size", 14336)?,
        rms_norm_eps: eps,
        rope_theta: 10000.0,
        rope_scaling: RopeScaling::None,
        qkv_bias: false,
        o_bias: false,
        mlp_bias: false,
        qk_norm: QkNorm::None,
        tie_word_embeddings: cfg.bool_or("tie_word_embeddings", false)?,
        max_position_embeddings: cfg.usize_or("max_position_embeddings", default_max_pos(arch))?,
        dtype: cfg.dtype()?.unwrap_or(WeightDtype::F32),
        hybrid: Some(HybridSpec {
            rotary_dim: 0,
            gdn: None,
            moe: moe.transpose()?,
            mamba: None,
            mamba1: Some(mixer(cfg, hidden, eps)?),
            nemotron_moe: None,
            mla: None,
            layers,
        }),
        ..ModelSpec::base(name, arch)
    })
}

/// Per layer: `i % {prefix}_period == {prefix}_offset` (the offset below the period, as the
/// class checks).
fn periodic(
    cfg: &Cfg<'_>,
    prefix: &str,
    (period, offset): (usize, usize),
    n: usize,
) -> Result<Vec<bool>, ModelError> {
    let p = cfg.usize_or(&format!("{prefix}_period"), period)?;
    let o = cfg.usize_or(&format!("{prefix}_offset"), offset)?;
    if o >= p {
        let m = format!("{o} (must be below {prefix}_period = {p})");
        return Err(cfg.err(&format!("{prefix}_offset"), m));
    }
    Ok((0..n).map(|i| i % p == o).collect())
}

/// The Mamba mixers' geometry (`mamba_*` fields); their norms' epsilon is `rms_norm_eps`.
fn mixer(cfg: &Cfg<'_>, hidden: usize, eps: f64) -> Result<Mamba1Spec, ModelError> {
    Ok(Mamba1Spec {
        inner: cfg.positive_or("mamba_expand", 2)?.saturating_mul(hidden),
        state_size: cfg.positive_or("mamba_d_state", 16)?,
        dt_rank: dt_rank(cfg, "mamba_dt_rank", hidden)?,
        conv_kernel: cfg.positive_or("mamba_d_conv", 4)?,
        conv_bias: cfg.bool_or("mamba_conv_bias", true)?,
        proj_bias: cfg.bool_or("mamba_proj_bias", false)?,
        mixer_rms_eps: Some(eps),
        weighted_norms: true,
    })
}

pub fn load<D: Device>(ld: &Loader<'_, D>, spec: ModelSpec) -> Result<Decoder<D>, ModelError> {
    let hybrid = spec.hybrid.clone().ok_or_else(|| {
        ModelError::InvalidOptions("JambaForCausalLM spec without its layers".into())
    })?;
    let mamba = hybrid.mamba1.clone().ok_or_else(|| {
        ModelError::InvalidOptions("JambaForCausalLM spec without its Mamba geometry".into())
    })?;
    let h = spec.hidden_size;
    let vocab = ld.vocab(&spec, "model.embed_tokens")?;
    let (mut kv, mut rec) = (0, 0);
    let mut layers = Vec::with_capacity(hybrid.layers.len());
    for (i, &kind) in hybrid.layers.iter().enumerate() {
        let p = format!("model.layers.{i}");
        let mixer = match kind {
            LayerKind::Attention => {
                kv += 1;
                let px = format!("{p}.self_attn");
                let causal = SoftmaxVariant::causal();
                Sublayer::Attention(super::nemotron_h::load_attention(
                    ld,
                    &px,
                    &spec,
                    kv - 1,
                    causal,
                )?)
            }
            _ => {
                rec += 1;
                Sublayer::Mamba1(load_mixer(ld, &format!("{p}.mamba"), h, &mamba, rec - 1)?)
            }
        };
        let ff = format!("{p}.feed_forward");
        let ffn = match &hybrid.moe {
            Some(m) if m.sparse_layers[i] => {
                let names = (QWEN_EXPERTS, GATE_BIAS);
                Sublayer::Moe(super::moe_weights::load(ld, &ff, h, m, names)?)
            }
            _ => Sublayer::Mlp(load_mlp(ld, &spec, &ff, Activation::SwiGlu)?),
        };
        let norm = |n: &str| ld.vector(&format!("{p}.{n}.weight"), h);
        layers.push(Layer {
            parts: vec![
                Part::new(norm("input_layernorm")?, mixer),
                Part::new(norm("pre_ff_layernorm")?, ffn),
            ],
            scale: 1.0,
        });
    }
    Ok(Decoder {
        embed_scale: 1.0,
        final_norm: FinalNorm::Norm(ld.vector("model.final_layernorm.weight", h)?),
        spec,
        vocab,
        layers,
        ple: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use std::path::Path;

    fn parse_json(v: &Value) -> Result<ModelSpec, ModelError> {
        parse(&Cfg::new(v, Path::new("config.json"))?, "m".into())
    }

    /// Jamba-v0.1's layout is the class's defaults: attention at 4 and 12 (period 8), experts
    /// in every odd layer, the Mamba mixers' dt rank ⌈4096 / 16⌉.
    #[test]
    fn reads_the_layouts_with_the_class_defaults() {
        let s = parse_json(&json!({"architectures": ["JambaForCausalLM"],
                                    "num_hidden_layers": 16}))
        .unwrap();
        let h = s.hybrid.as_ref().unwrap();
        let attn: Vec<usize> = (0..16)
            .filter(|&i| h.layers[i] == LayerKind::Attention)
            .collect();
        assert_eq!(attn, vec![4, 12]);
        assert!(
            h.layers
                .iter()
                .all(|&k| k == LayerKind::Attention || k == LayerKind::Mamba1)
        );
        let m = h.moe.as_ref().unwrap();
        assert_eq!((m.num_experts, m.top_k, m.norm_topk_prob), (16, 2, false));
        let sparse: Vec<usize> = (0..16).filter(|&i| m.sparse_layers[i]).collect();
        assert_eq!(sparse, (0..8).map(|i| 2 * i + 1).collect::<Vec<_>>());
        let mx = h.mamba1.as_ref().unwrap();
        assert_eq!((mx.inner, mx.dt_rank, mx.state_size), (8192, 256, 16));
        assert_eq!((mx.mixer_rms_eps, mx.weighted_norms), (Some(1e-6), true));
        assert_eq!(
            (
                s.num_kv_heads,
                s.head_dim,
                s.hybrid.as_ref().unwrap().rotary_dim
            ),
            (8, 128, 0)
        );
        // One expert: every feed-forward is the dense MLP; `null` KV heads: one per head.
        let dense = parse_json(&json!({"num_experts": 1, "num_key_value_heads": null})).unwrap();
        assert_eq!(dense.num_kv_heads, 32);
        assert!(dense.hybrid.unwrap().moe.is_none());
    }

    #[test]
    fn refuses_what_it_cannot_run_by_name() {
        let cases = [
            ("hidden_act", json!("gelu"), "hidden_act `gelu`"),
            ("attn_layer_offset", json!(8), "attn_layer_offset"),
            ("expert_layer_offset", json!(2), "expert_layer_offset"),
            ("mamba_dt_rank", json!(0), "mamba_dt_rank"),
            ("mamba_d_state", json!(0), "mamba_d_state"),
        ];
        for (field, value, want) in cases {
            let mut v = json!({"architectures": ["JambaForCausalLM"], "hidden_size": 64,
                               "num_attention_heads": 4});
            v[field] = value;
            let e = parse_json(&v).unwrap_err().to_string();
            assert!(e.contains(want), "{field}: `{e}` should name `{want}`");
        }
    }
}
