//! StableLM's config (`StableLmConfig`; `StableLmForCausalLM`: StableLM 2 1.6B / 12B, StableLM
//! 3B 4E1T, Stable Code 3B, run by [`super::dense`]): Llama's attention and SwiGLU MLP with
//! `nn.LayerNorm`s with biases (`layer_norm_eps`), RoPE on the first `partial_rotary_factor`
//! (¼) of each head, q / k / v biased where `use_qkv_bias`, each q and k head LayerNormed (no
//! bias) by its own module where `qk_layernorm` (`self_attn.q_layernorm.norms.{h}`, before
//! RoPE), and where `use_parallel_residual` one `input_layernorm` feeding the attention and the
//! MLP in parallel.

use super::config::{Architecture, Cfg};
use super::{ModelError, ModelSpec, QkNorm};
use crate::kernels::device::NormKind;

pub(super) fn parse(cfg: &Cfg<'_>, name: String) -> Result<ModelSpec, ModelError> {
    let mut spec = super::dense_config::dense_spec(cfg, Architecture::StableLm, name)?;
    spec.qkv_bias = cfg.bool_or("use_qkv_bias", false)?;
    (spec.o_bias, spec.mlp_bias) = (false, false);
    spec.norm = NormKind::LayerBias;
    spec.rms_norm_eps = cfg.f64_or("layer_norm_eps", 1e-5)?;
    spec.rotary_dim = Some(super::hybrid_config::rotary_dim(cfg, spec.head_dim, 0.25)?);
    if cfg.bool_or("qk_layernorm", false)? {
        spec.qk_norm = QkNorm::HeadLayerNorm;
    }
    spec.parallel_residual = cfg.bool_or("use_parallel_residual", false)?;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::{Value, json};

    use super::super::{Architecture, ModelSpec, QkNorm};
    use crate::kernels::device::NormKind;

    fn parse(v: &Value) -> Result<ModelSpec, String> {
        ModelSpec::from_json(v, Path::new("config.json"), "m".into()).map_err(|e| e.to_string())
    }

    /// Shaped as stablelm-2-12b's config (q / k LayerNorms, parallel residual) and, without
    /// those, stablelm-2-1_6b's (q / k / v biased); a quarter of each head rotated.
    #[test]
    fn stablelm_2_norms_rotary_and_residual_forms() {
        let mut v = json!({
            "architectures": ["StableLmForCausalLM"], "model_type": "stablelm",
            "hidden_act": "silu", "hidden_size": 5120, "intermediate_size": 13824,
            "layer_norm_eps": 1e-5, "max_position_embeddings": 4096,
            "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8,
            "partial_rotary_factor": 0.25, "qk_layernorm": true, "rope_theta": 10000,
            "use_parallel_residual": true, "use_qkv_bias": false, "vocab_size": 100352
        });
        let s = parse(&v).unwrap();
        assert_eq!(s.architecture, Architecture::StableLm);
        assert_eq!((s.head_dim, s.rotated_dims(), s.num_kv_heads), (160, 40, 8));
        assert_eq!(
            (s.qk_norm, s.parallel_residual),
            (QkNorm::HeadLayerNorm, true)
        );
        assert_eq!((s.norm, s.rms_norm_eps), (NormKind::LayerBias, 1e-5));
        assert!(!s.qkv_bias && !s.o_bias && !s.tie_word_embeddings);
        for k in ["qk_layernorm", "use_parallel_residual"] {
            v.as_object_mut().unwrap().remove(k);
        }
        v["use_qkv_bias"] = json!(true);
        let s = parse(&v).unwrap();
        assert_eq!(
            (s.qk_norm, s.parallel_residual, s.qkv_bias),
            (QkNorm::None, false, true)
        );
        v["partial_rotary_factor"] = json!(0.02);
        assert!(parse(&v).unwrap_err().contains("partial_rotary_factor"));
    }
}
