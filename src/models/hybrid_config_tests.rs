use std::path::Path;

use super::*;
use serde_json::json;

fn parse_json(v: &Value) -> Result<ModelSpec, ModelError> {
    ModelSpec::from_json(v, Path::new("config.json"), "m".into())
}

fn qwen() -> Value {
    json!({
        "architectures": ["Qwen3_5ForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 32, "vocab_size": 512, "linear_num_key_heads": 2,
        "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e7,
            "mrope_section": [11, 11, 10], "mrope_interleaved": true}
    })
}

#[test]
fn qwen_interval_and_partial_rotary_defaults() {
    let s = parse_json(&qwen()).unwrap();
    let h = s.hybrid.as_ref().unwrap();
    assert_eq!(h.layers[3], LayerKind::Attention);
    assert_eq!(h.layers[7], LayerKind::Attention);
    assert_eq!(h.layers[0], LayerKind::GatedDeltaNet);
    assert_eq!(h.rotary_dim, 8);
    assert!(s.has_recurrent_layers());
    assert_eq!(s.rope_theta, 1e7);
}

/// YaRN (the model cards' long-context setting) runs over the rotated dims; other
/// scalings are refused by name.
#[test]
fn qwen_yarn_accepted_other_scalings_refused() {
    let mut v = qwen();
    v["rope_parameters"] = json!({"rope_type": "yarn", "rope_theta": 1e7, "factor": 4.0,
        "original_max_position_embeddings": 262144});
    let s = parse_json(&v).unwrap();
    assert!(matches!(
        s.rope_scaling,
        RopeScaling::Yarn { factor: 4.0, .. }
    ));
    assert_eq!(s.hybrid.unwrap().rotary_dim, 8);
    v["rope_parameters"] = json!({"rope_type": "linear", "factor": 4.0});
    let err = parse_json(&v).unwrap_err().to_string();
    assert!(err.contains("other than yarn"), "{err}");
}

#[test]
fn nemotron_pattern_and_infinity() {
    let v = json!({
        "architectures": ["NemotronHForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512,
        "hybrid_override_pattern": "M-*-M-", "num_hidden_layers": 6, "mamba_num_heads": 8,
        "mamba_head_dim": 16, "ssm_state_size": 16, "n_groups": 2, "conv_kernel": 4,
        "time_step_limit": [0.0, {"__float__": "Infinity"}]
    });
    let s = parse_json(&v).unwrap();
    let h = s.hybrid.unwrap();
    assert_eq!(s.num_layers, 6);
    assert_eq!(h.layers[1], LayerKind::Mlp);
    assert_eq!(h.layers[2], LayerKind::Attention);
    assert_eq!(h.mamba.unwrap().time_step_min, 0.001);
    let mut moe = v.clone();
    moe["hybrid_override_pattern"] = json!("MX*-");
    let e = parse_json(&moe).unwrap_err().to_string();
    assert!(e.contains("block `X`"), "{e}");
}

/// A released Nemotron-H config.json carries Python's bare `Infinity`: read from a file.
#[test]
fn bare_infinity_in_config_json_loads() {
    let dir = tempfile::tempdir().unwrap();
    let text = r#"{"architectures": ["NemotronHForCausalLM"], "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "vocab_size": 512, "hybrid_override_pattern": "M*-",
        "num_hidden_layers": 3, "mamba_num_heads": 8, "mamba_head_dim": 16,
        "ssm_state_size": 16, "n_groups": 2, "conv_kernel": 4, "dtype": "bfloat16",
        "time_step_limit": [0.0, Infinity], "note": "Infinity stays a string"}"#;
    std::fs::write(dir.path().join("config.json"), text).unwrap();
    let s = ModelSpec::from_dir(dir.path()).unwrap();
    assert_eq!(s.num_layers, 3);
    assert_eq!(s.dtype, WeightDtype::Bf16);
}

#[test]
fn runs_the_text_config_of_a_multimodal_export_and_rejects_unknown_layers() {
    let export = json!({
        "architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": qwen(),
        "vision_config": {"depth": 2}
    });
    let s = parse_json(&export).unwrap();
    assert_eq!(s.architecture, Architecture::Qwen3_5);
    assert_eq!(s.hybrid, parse_json(&qwen()).unwrap().hybrid);
    let mut v = qwen();
    v["architectures"] = json!(["LlavaForConditionalGeneration"]);
    v["vision_config"] = json!({"depth": 2});
    let e = parse_json(&v).unwrap_err().to_string();
    assert!(e.contains("multimodal"), "{e}");
    let mut v = qwen();
    v["num_hidden_layers"] = json!(2);
    v["layer_types"] = json!(["linear_attention", "sliding_attention"]);
    let e = parse_json(&v).unwrap_err().to_string();
    assert!(e.contains("sliding_attention"), "{e}");
}
