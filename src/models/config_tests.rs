//! `ModelSpec` from config.json: architectures, defaults, errors.

use super::*;
use serde_json::json;

fn base() -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
        "rms_norm_eps": 1e-5, "max_position_embeddings": 2048, "torch_dtype": "bfloat16",
        "some_unrelated": {"__float__": "Infinity"}
    })
}

fn parse(v: &Value) -> Result<ModelSpec, ModelError> {
    ModelSpec::from_json(v, Path::new("config.json"), "m".into())
}

#[test]
fn llama_defaults_and_old_rope_fields() {
    let mut v = base();
    v["rope_theta"] = json!(500000.0);
    v["rope_scaling"] = json!({"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
    let s = parse(&v).unwrap();
    assert_eq!(s.head_dim, 16);
    assert_eq!(s.dtype, WeightDtype::Bf16);
    assert_eq!(s.rope_theta, 500000.0);
    assert!(matches!(
        s.rope_scaling,
        RopeScaling::Llama3 { factor: 8.0, .. }
    ));
    assert!(!s.qkv_bias && s.qk_norm == QkNorm::None && !s.tie_word_embeddings);
}

/// A config naming no `rope_theta` takes its config class's `default_theta` (MixtralConfig's
/// is 1e6, not 1e4), also where `rope_parameters` leaves it out.
#[test]
fn rope_theta_defaults_per_config_class() {
    let theta = |arch: &str, params: Option<Value>| {
        let mut v = base();
        v["architectures"] = json!([arch]);
        if let Some(p) = params {
            v["rope_parameters"] = p;
        }
        parse(&v).unwrap().rope_theta
    };
    assert_eq!(theta("LlamaForCausalLM", None), 1e4);
    assert_eq!(theta("MixtralForCausalLM", None), 1e6);
    let default = json!({"rope_type": "default"});
    assert_eq!(theta("MixtralForCausalLM", Some(default.clone())), 1e6);
    assert_eq!(theta("MiniMaxM2ForCausalLM", Some(default)), 5e6);
}

#[test]
fn new_rope_parameters_and_qwen_flags() {
    let mut v = base();
    v["architectures"] = json!(["Qwen2ForCausalLM"]);
    v["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 1e6});
    let s = parse(&v).unwrap();
    assert_eq!(s.rope_theta, 1e6);
    assert!(s.qkv_bias && !s.o_bias);
    v["architectures"] = json!(["Qwen3ForCausalLM"]);
    let s = parse(&v).unwrap();
    assert!(s.qk_norm == QkNorm::PerHead && !s.qkv_bias);
    assert_eq!(s.head_dim, 128);
}

#[test]
fn rejects_unknown_rope_arch_and_window() {
    let mut v = base();
    v["rope_scaling"] = json!({"rope_type": "longrope", "factor": 4.0});
    let e = parse(&v).unwrap_err().to_string();
    assert!(e.contains("longrope"), "{e}");
    v["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0});
    let e = parse(&v).unwrap_err().to_string();
    assert!(e.contains("original_max_position_embeddings"), "{e}");
    let mut v = base();
    v["architectures"] = json!(["GPT2LMHeadModel"]);
    let e = parse(&v).unwrap_err().to_string();
    assert!(e.contains("GPT2LMHeadModel"), "{e}");
    let mut v = base();
    v["architectures"] = json!(["MistralForCausalLM"]);
    v["sliding_window"] = json!(1024);
    assert_eq!(parse(&v).unwrap().sliding_window, Some(1024));
    v["sliding_window"] = json!(4096);
    assert_eq!(parse(&v).unwrap().sliding_window, None);
    v["sliding_window"] = json!(0);
    assert!(
        parse(&v)
            .unwrap_err()
            .to_string()
            .contains("sliding_window")
    );
    v["architectures"] = json!(["Qwen2ForCausalLM"]);
    v["sliding_window"] = json!(1024);
    v["use_sliding_window"] = json!(true);
    assert!(matches!(parse(&v), Err(ModelError::Unsupported { .. })));
    let mut v = base();
    v.as_object_mut().unwrap().remove("hidden_size");
    let e = parse(&v).unwrap_err().to_string();
    assert!(e.contains("hidden_size"), "{e}");
}

/// Llama's one-change relatives: Arcee's relu² MLP (its default `hidden_act`; SiLU refused, as
/// the class has no gate), Helium's defaults (heads of 128, eps 1e-8, theta 1e5, interleaved
/// RoPE, o_proj unbiased).
#[test]
fn arcee_and_helium_defaults() {
    let mut v = base();
    v["architectures"] = json!(["ArceeForCausalLM"]);
    let s = parse(&v).unwrap();
    assert_eq!(s.architecture, Architecture::Arcee);
    v["hidden_act"] = json!("relu2");
    assert!(parse(&v).is_ok());
    v["hidden_act"] = json!("silu");
    let e = parse(&v).unwrap_err().to_string();
    assert!(e.contains("relu2"), "{e}");
    let v = json!({"architectures": ["HeliumForCausalLM"], "hidden_size": 256,
        "intermediate_size": 512, "num_attention_heads": 2, "num_hidden_layers": 2,
        "vocab_size": 100, "attention_bias": true});
    let s = parse(&v).unwrap();
    assert_eq!((s.head_dim, s.rms_norm_eps, s.rope_theta), (128, 1e-8, 1e5));
    assert_eq!(
        (s.qkv_bias, s.o_bias, s.interleaved_rope),
        (true, false, true)
    );
    assert!(!s.tie_word_embeddings);
}

/// ApertusConfig: per-head q / k norms, its llama3 RoPE where the config names none, xIELU or
/// relu² only.
#[test]
fn apertus_defaults() {
    let mut v = base();
    v["architectures"] = json!(["ApertusForCausalLM"]);
    v.as_object_mut().unwrap().remove("rms_norm_eps");
    let s = parse(&v).unwrap();
    assert_eq!(
        (s.qk_norm, s.rms_norm_eps, s.rope_theta),
        (QkNorm::PerHead, 1e-5, 1.2e7)
    );
    assert!(matches!(s.rope_scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0));
    // A `rope_theta` alone leaves the class's RoPE, as ApertusConfig does.
    v["rope_theta"] = json!(5e5);
    assert_eq!(parse(&v).unwrap().rope_theta, 1.2e7);
    v["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 5e5});
    let s = parse(&v).unwrap();
    assert_eq!((s.rope_theta, s.rope_scaling), (5e5, RopeScaling::None));
    v["hidden_act"] = json!("relu2");
    assert!(parse(&v).is_ok());
    v["hidden_act"] = json!("silu");
    assert!(parse(&v).unwrap_err().to_string().contains("xielu"));
}
