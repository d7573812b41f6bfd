//! StarCoder2's config (`Starcoder2Config`; `Starcoder2ForCausalLM`: StarCoder2 3B / 7B / 15B,
//! run by [`super::dense`]): Mistral's attention (a `sliding_window` below the context windows
//! every layer) with q / k / v / o biased, `nn.LayerNorm`s with biases (`input_layernorm`,
//! `post_attention_layernorm`, `model.norm`), and an ungated MLP `c_proj(gelu_tanh(c_fc(x)))`,
//! both biased. `use_bias` (true) for every projection, `norm_epsilon` (1e-5), tied by default,
//! context 4096 where the config names none; `hidden_act` the tanh GELU.

use super::config::{Architecture, Cfg};
use super::{ModelError, ModelSpec};
use crate::kernels::device::NormKind;

pub(super) fn parse(cfg: &Cfg<'_>, name: String) -> Result<ModelSpec, ModelError> {
    let mut spec = super::dense_config::dense_spec(cfg, Architecture::Starcoder2, name)?;
    let bias = cfg.bool_or("use_bias", true)?;
    (spec.qkv_bias, spec.o_bias, spec.mlp_bias) = (bias, bias, bias);
    spec.norm = NormKind::LayerBias;
    spec.rms_norm_eps = cfg.f64_or("norm_epsilon", 1e-5)?;
    spec.tie_word_embeddings = cfg.bool_or("tie_word_embeddings", true)?;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::{Value, json};

    use super::super::{Architecture, ModelSpec, RopeScaling};
    use crate::kernels::device::{NormKind, RowNorm};

    fn parse(v: &Value) -> Result<ModelSpec, String> {
        ModelSpec::from_json(v, Path::new("config.json"), "m".into()).map_err(|e| e.to_string())
    }

    /// StarCoder2-3B's fields (`tests/fixtures/released_configs/starcoder2-3b.json` in full).
    #[test]
    fn starcoder2_biases_layer_norms_window_and_tanh_gelu() {
        let mut v = json!({
            "architectures": ["Starcoder2ForCausalLM"], "model_type": "starcoder2",
            "hidden_act": "gelu_pytorch_tanh", "hidden_size": 3072, "intermediate_size": 12288,
            "max_position_embeddings": 16384, "norm_epsilon": 1e-5, "num_attention_heads": 24,
            "num_hidden_layers": 30, "num_key_value_heads": 2,
            "rope_theta": 999999.4420358813, "sliding_window": 4096, "use_bias": true,
            "vocab_size": 49152
        });
        let s = parse(&v).unwrap();
        assert_eq!(s.architecture, Architecture::Starcoder2);
        assert_eq!(
            (s.head_dim, s.num_kv_heads, s.sliding_window),
            (128, 2, Some(4096))
        );
        assert_eq!(
            (s.rope_theta, s.rope_scaling),
            (999999.4420358813, RopeScaling::None)
        );
        assert!(s.qkv_bias && s.o_bias && s.mlp_bias && s.tie_word_embeddings);
        let norm = RowNorm {
            kind: NormKind::LayerBias,
            eps: 1e-5,
        };
        assert_eq!(s.row_norm(), norm);
        v["use_bias"] = json!(false);
        v["tie_word_embeddings"] = json!(false);
        let s = parse(&v).unwrap();
        assert!(!s.qkv_bias && !s.o_bias && !s.mlp_bias && !s.tie_word_embeddings);
        // A window as wide as the context is none.
        v["sliding_window"] = json!(16384);
        assert_eq!(parse(&v).unwrap().sliding_window, None);
        // The exact GELU is another function.
        v["hidden_act"] = json!("gelu");
        let err = parse(&v).unwrap_err();
        assert!(err.contains("hidden_act `gelu`"), "{err}");
    }
}
