use std::path::Path;

use serde_json::{Value, json};

use super::super::{Architecture, ModelSpec};
use super::MimoSpec;
use crate::models::RopeScaling;
use crate::models::hybrid_config::MoeRouter;

fn parse(v: &Value) -> Result<ModelSpec, String> {
    ModelSpec::from_json(v, Path::new("config.json"), "m".into()).map_err(|e| e.to_string())
}

fn mimo(s: &ModelSpec) -> &MimoSpec {
    s.mimo.as_ref().unwrap()
}

/// Shaped as MiMo-V2-Flash's released config.json, in the field names vLLM's and SGLang's
/// MiMo-V2-Flash models read (the release's own; transformers reads only
/// `sliding_window_size` of them and takes its class defaults, the same values, for the rest).
fn released() -> Value {
    let pattern: Vec<u8> = (0..48)
        .map(|i| u8::from(i != 0 && (i + 1) % 6 != 0))
        .collect();
    let moe: Vec<u8> = (0..48).map(|i| u8::from(i != 0)).collect();
    let mut v = json!({
        "architectures": ["MiMoV2FlashForCausalLM"], "model_type": "mimo_v2_flash",
        "vocab_size": 152576, "hidden_size": 4096, "intermediate_size": 16384,
        "num_hidden_layers": 48, "num_attention_heads": 64, "num_key_value_heads": 4,
        "head_dim": 192, "v_head_dim": 128, "swa_num_attention_heads": 64,
        "swa_num_key_value_heads": 8, "swa_head_dim": 192, "swa_v_head_dim": 128,
        "hybrid_layer_pattern": pattern, "moe_layer_freq": moe, "sliding_window": 128,
        "sliding_window_size": 128, "add_swa_attention_sink_bias": true,
        "add_full_attention_sink_bias": false, "rope_theta": 5000000, "swa_rope_theta": 10000,
        "partial_rotary_factor": 0.334, "layernorm_epsilon": 1e-5, "attention_value_scale": 0.707,
        "n_routed_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
        "routed_scaling_factor": null, "n_group": 1, "topk_group": 1, "norm_topk_prob": true,
        "scoring_func": "sigmoid", "topk_method": "noaux_tc", "hidden_act": "silu",
        "max_position_embeddings": 262144, "tie_word_embeddings": false,
        "torch_dtype": "bfloat16"
    });
    v["quantization_config"] = json!({"quant_method": "fp8", "fmt": "e4m3",
        "activation_scheme": "dynamic", "weight_block_size": [128, 128]});
    v
}

#[test]
fn released_config_reads_its_own_field_names() {
    let s = parse(&released()).unwrap();
    assert_eq!(s.architecture, Architecture::MiMoV2Flash);
    assert_eq!((s.num_layers, s.num_heads, s.num_kv_heads), (48, 64, 8));
    assert_eq!(
        (s.head_dim, s.rms_norm_eps, s.rotated_dims()),
        (192, 1e-5, 64)
    );
    let m = mimo(&s);
    let full: Vec<usize> = (0..48).filter(|&i| !m.sliding[i]).collect();
    assert_eq!(full, [0, 5, 11, 17, 23, 29, 35, 41, 47]);
    assert_eq!(
        (m.kv_heads, m.window, m.sinks),
        ([4, 8], 129, [false, true])
    );
    assert_eq!(m.rope[0], (5e6, RopeScaling::None, 64));
    assert_eq!(m.rope[1], (1e4, RopeScaling::None, 64));
    assert_eq!((m.v_head_dim, m.value_scale), (128, 0.707));
    let moe = s.hybrid.as_ref().unwrap().moe.as_ref().unwrap();
    assert_eq!(
        (moe.num_experts, moe.top_k, moe.expert_intermediate),
        (256, 8, 2048)
    );
    assert_eq!(moe.shared_intermediate, None);
    assert!(!moe.sparse_layers[0] && moe.sparse_layers[1..].iter().all(|&x| x));
    let MoeRouter::Grouped { scale, softmax, .. } = moe.router else {
        panic!("{:?}", moe.router)
    };
    assert_eq!((scale, softmax), (1.0, false));
    assert!(s.fp8.is_some());
}

/// transformers' spelling of the same model (what its `save_pretrained` writes) and the class
/// defaults give the released config's spec.
#[test]
fn transformers_fields_and_class_defaults_give_the_same_model() {
    let want = parse(&released()).unwrap();
    let layer_types: Vec<&str> = (mimo(&want).sliding.iter())
        .map(|&s| {
            if s {
                "sliding_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    let mlp_types: Vec<&str> = (0..48)
        .map(|i| if i == 0 { "dense" } else { "sparse" })
        .collect();
    let saved = json!({
        "architectures": ["MiMoV2FlashForCausalLM"], "num_hidden_layers": 48,
        "num_key_value_heads": 4, "layer_types": layer_types, "mlp_layer_types": mlp_types,
        "sliding_window": 129, "rms_norm_eps": 1e-5,
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.334},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.334}
        }
    });
    let bare = json!({"architectures": ["MiMoV2FlashForCausalLM"], "num_hidden_layers": 48});
    for v in [saved, bare] {
        let s = parse(&v).unwrap();
        assert_eq!(mimo(&s), mimo(&want), "{v}");
        assert_eq!((s.num_kv_heads, s.rms_norm_eps), (8, 1e-5));
        let (a, b) = (
            s.hybrid.unwrap().moe.unwrap(),
            want.hybrid.clone().unwrap().moe.unwrap(),
        );
        assert_eq!(a.sparse_layers, b.sparse_layers);
        assert_eq!(a.shared_intermediate, None);
    }
}

/// `sliding_window_size` counts the keys before the query: one less than the window.
#[test]
fn sliding_window_size_is_one_less_than_the_window() {
    let mut v = released();
    v["sliding_window_size"] = json!(31);
    assert_eq!(mimo(&parse(&v).unwrap()).window, 32);
    v.as_object_mut().unwrap().remove("sliding_window_size");
    assert_eq!(mimo(&parse(&v).unwrap()).window, 128);
}

/// Geometry transformers would not build, or hsx cannot run, is refused by name.
#[test]
fn other_geometry_is_refused_by_name() {
    for (field, value, says) in [
        ("swa_head_dim", json!(128), "swa_head_dim 128"),
        (
            "swa_num_attention_heads",
            json!(32),
            "swa_num_attention_heads",
        ),
        (
            "swa_num_key_value_heads",
            json!(6),
            "KV heads 4 (full) and 6",
        ),
        ("v_head_dim", json!(256), "v_head_dim"),
        ("hybrid_layer_pattern", json!([0, 1]), "48 flags"),
        ("moe_layer_freq", json!(vec![2; 48]), "moe_layer_freq"),
        (
            "partial_rotary_factor",
            json!(0.001),
            "partial_rotary_factor",
        ),
        ("scoring_func", json!("softmax"), "scoring_func"),
        (
            "rope_parameters",
            json!({"rope_theta": 1e4}),
            "rope_parameters",
        ),
    ] {
        let mut v = released();
        v[field] = value;
        let e = parse(&v).unwrap_err();
        assert!(e.contains(says), "{field}: {e}");
    }
}
