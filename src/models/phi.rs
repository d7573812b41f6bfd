//! Phi (`PhiForCausalLM`: phi-1, phi-1.5, phi-2; `model.*` names). Per layer one
//! `input_layernorm` (an `nn.LayerNorm` with bias) feeds the attention and the MLP in parallel,
//! `x += attn(n) + mlp(n)`: q / k / v and the output `dense` biased, RoPE on the first
//! `partial_rotary_factor` (½; phi-2: 0.4) of each head; the MLP `fc2(gelu_tanh(fc1(x)))`
//! biased. Then `model.final_layernorm`, and an LM head with a bias. Config (`PhiConfig`):
//! `layer_norm_eps` (1e-5), context 2048, untied; `qk_layernorm` (no release has it) and tied
//! embeddings (the head's bias would have no weight of its own) are refused by name.

use super::config::{Architecture, Cfg};
use super::decoder::{Decoder, Vocab};
use super::dense::{attention_layer, ungated_mlp};
use super::layers::mlp::Activation;
use super::layers::{Attention, Layer, Loader, SoftmaxVariant, Sublayer};
use super::{ModelError, ModelSpec};
use crate::kernels::Device;
use crate::kernels::device::NormKind;
use crate::kernels::rope::Rope;

pub(super) fn parse(cfg: &Cfg<'_>, name: String) -> Result<ModelSpec, ModelError> {
    for field in ["qk_layernorm", "tie_word_embeddings"] {
        if cfg.bool_or(field, false)? {
            return Err(ModelError::Unsupported {
                path: cfg.path_buf(),
                what: format!("Phi's {field} (no release has it)"),
            });
        }
    }
    let mut spec = super::dense_config::dense_spec(cfg, Architecture::Phi, name)?;
    (spec.qkv_bias, spec.o_bias, spec.mlp_bias) = (true, true, true);
    spec.norm = NormKind::LayerBias;
    spec.rms_norm_eps = cfg.f64_or("layer_norm_eps", 1e-5)?;
    spec.rotary_dim = Some(super::hybrid_config::rotary_dim(cfg, spec.head_dim, 0.5)?);
    spec.parallel_residual = true;
    Ok(spec)
}

pub fn load<D: Device>(ld: &Loader<'_, D>, spec: ModelSpec) -> Result<Decoder<D>, ModelError> {
    let (v, h) = (spec.vocab_size, spec.hidden_size);
    let vocab = Vocab::Untied {
        table: ld.table("model.embed_tokens", v, h)?,
        head: ld.linear1("lm_head", v, h, true)?,
    };
    let final_norm = ld.norm("model.final_layernorm", h, spec.norm)?;
    super::dense::load_around(ld, spec, (vocab, final_norm), load_layer)
}

fn load_layer<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    i: usize,
) -> Result<Layer<D>, ModelError> {
    let p = format!("model.layers.{i}");
    let (h, hd) = (spec.hidden_size, spec.head_dim);
    let (qd, kvd) = (spec.num_heads * hd, spec.num_kv_heads * hd);
    let attn = |n: &str| format!("{p}.self_attn.{n}");
    let parts = [
        (attn("q_proj"), qd),
        (attn("k_proj"), kvd),
        (attn("v_proj"), kvd),
    ];
    let qkv = ld.linear(&parts, h, true)?;
    let o = ld.linear1(&attn("dense"), h, qd, true)?;
    let rot = spec.rotated_dims();
    let rope = Rope::new(rot, spec.rope_theta, spec.rope_scaling);
    let attention = Attention {
        rope: Some((ld.dev.rope_table(&rope)?, rot)),
        variant: SoftmaxVariant::causal(),
        ..Attention::plain((qkv, o), spec, i)
    };
    let mlp = ungated_mlp(
        ld,
        spec,
        &format!("{p}.mlp"),
        ("fc1", "fc2"),
        Activation::GeluTanh,
    )?;
    attention_layer(
        ld,
        spec,
        &p,
        Sublayer::Attention(attention),
        Sublayer::Mlp(mlp),
    )
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::{Value, json};

    use super::super::{Architecture, ModelSpec};
    use crate::kernels::device::NormKind;

    fn parse(v: &Value) -> Result<ModelSpec, String> {
        ModelSpec::from_json(v, Path::new("config.json"), "m".into()).map_err(|e| e.to_string())
    }

    /// Shaped as phi-2's config: 32 heads of 80, 32 of each rotated, biased everywhere,
    /// parallel layers; `qk_layernorm` and tied embeddings refused by name.
    #[test]
    fn phi_2_partial_rotary_parallel_layers() {
        let mut v = json!({
            "architectures": ["PhiForCausalLM"], "model_type": "phi", "hidden_act": "gelu_new",
            "hidden_size": 2560, "intermediate_size": 10240, "layer_norm_eps": 1e-5,
            "max_position_embeddings": 2048, "num_attention_heads": 32,
            "num_hidden_layers": 32, "partial_rotary_factor": 0.4, "qk_layernorm": false,
            "rope_theta": 10000.0, "tie_word_embeddings": false, "vocab_size": 51200
        });
        let s = parse(&v).unwrap();
        assert_eq!(s.architecture, Architecture::Phi);
        assert_eq!((s.head_dim, s.rotated_dims(), s.num_kv_heads), (80, 32, 32));
        assert!(s.qkv_bias && s.o_bias && s.mlp_bias && s.parallel_residual);
        assert_eq!((s.norm, s.rms_norm_eps), (NormKind::LayerBias, 1e-5));
        for field in ["qk_layernorm", "tie_word_embeddings"] {
            let mut bad = v.clone();
            bad[field] = json!(true);
            assert!(parse(&bad).unwrap_err().contains(field), "{field}");
        }
        v["hidden_act"] = json!("gelu");
        assert!(parse(&v).unwrap_err().contains("hidden_act `gelu`"));
    }
}
