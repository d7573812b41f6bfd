use std::path::Path;

use serde_json::{Value, json};

use super::super::ModelSpec;
use super::*;

fn spec(v: &Value) -> Result<ModelSpec, ModelError> {
    ModelSpec::from_json(v, Path::new("c.json"), "m".into())
}

/// A small `Gemma4ForCausalLM` config in the released form (`global_head_dim`).
fn small(extra: Value) -> Value {
    let mut v = json!({
        "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text",
        "hidden_size": 64, "num_hidden_layers": 6, "num_attention_heads": 8,
        "num_key_value_heads": 4, "head_dim": 16, "global_head_dim": 32,
        "hidden_size_per_layer_input": 0, "vocab_size": 100, "intermediate_size": 128,
    });
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

/// gemma-4-31B-it as released: a Gemma4ForConditionalGeneration export of 60 layers, every
/// 6th full with 4 KV heads of 512 (values from the keys' projection), the others 16 of 256;
/// the cache as wide as the sliding layers' KV, the full layers' heads repeated twice.
#[test]
fn gemma4_31b_as_released() {
    let s = spec(&super::super::released_config("gemma-4-31b-it.json")).unwrap();
    assert_eq!(s.architecture, Architecture::Gemma4);
    assert_eq!((s.num_layers, s.hidden_size, s.num_heads), (60, 5376, 32));
    assert_eq!((s.head_dim, s.num_kv_heads), (256, 16));
    assert!(s.tie_word_embeddings && s.dtype == WeightDtype::Bf16);
    let g = s.gemma4.unwrap();
    let full: Vec<usize> = (0..60).filter(|&i| !g.sliding[i]).collect();
    assert_eq!(full, (5..60).step_by(6).collect::<Vec<_>>());
    assert_eq!((g.geometry[0], g.geometry[5]), ((256, 16), (512, 4)));
    assert_eq!((g.kv_dim(), g.kv_repeat(0), g.kv_repeat(5)), (4096, 1, 2));
    assert_eq!((g.window, g.k_eq_v, g.moe), (1024, true, None));
    assert_eq!(g.local_rope, Gemma4Rope::Default { theta: 1e4 });
    assert_eq!(
        g.global_rope,
        Gemma4Rope::Proportional {
            theta: 1e6,
            partial: 0.25,
            factor: 1.0
        }
    );
    assert_eq!(g.max_head_dim(), 512);
}

/// transformers' saves name the full layers' geometry per layer; without `attention_k_eq_v`
/// `num_global_key_value_heads` is not read (the class ignores it).
#[test]
fn per_layer_config_and_global_kv_heads() {
    let saved = small(json!({"per_layer_config": {
        "2": {"head_dim": 32, "num_key_value_heads": 1},
        "5": {"head_dim": 32, "num_key_value_heads": 1}},
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention",
                        "sliding_attention", "sliding_attention", "full_attention"]}));
    let g = spec(&saved).unwrap().gemma4.unwrap();
    assert_eq!((g.geometry[1], g.geometry[2]), ((16, 4), (32, 1)));
    assert_eq!((g.kv_dim(), g.kv_repeat(2)), (64, 2));
    let no_share = small(json!({"num_global_key_value_heads": 1}));
    let s = spec(&no_share).unwrap();
    let g = s.gemma4.unwrap();
    // Default pattern: layer 5 full (every 6th), 4 KV heads of 32 — wider than the others.
    assert_eq!(g.geometry[5], (32, 4));
    assert_eq!((g.kv_dim(), g.kv_repeat(0), s.num_kv_heads), (128, 2, 8));
    let shared = small(json!({"num_global_key_value_heads": 1, "attention_k_eq_v": true}));
    assert_eq!(spec(&shared).unwrap().gemma4.unwrap().geometry[5], (32, 1));
}

/// `Gemma4TextConfig` forces its last layer full.
#[test]
fn last_layer_is_full() {
    let v = small(json!({"layer_types": vec!["sliding_attention"; 6]}));
    let g = spec(&v).unwrap().gemma4.unwrap();
    assert_eq!(g.sliding, [true, true, true, true, true, false]);
}

#[test]
fn moe_block() {
    let v = small(
        json!({"enable_moe_block": true, "num_experts": 128, "top_k_experts": 8,
        "moe_intermediate_size": 704}),
    );
    let m = spec(&v).unwrap().gemma4.unwrap().moe.unwrap();
    assert_eq!((m.experts, m.top_k, m.inter), (128, 8, 704));
    let v = small(
        json!({"enable_moe_block": true, "num_experts": 4, "top_k_experts": 8,
        "moe_intermediate_size": 704}),
    );
    assert!(spec(&v).unwrap_err().to_string().contains("top_k_experts"));
}

/// Full layers 2 and 5.
const LAYER_TYPES: [&str; 6] = [
    "sliding_attention",
    "sliding_attention",
    "full_attention",
    "sliding_attention",
    "sliding_attention",
    "full_attention",
];

/// What hsx does not run is refused by name, never run otherwise.
#[test]
fn refusals_name_the_option() {
    let cases = [
        (
            json!({"hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 99}),
            "99 rows for a vocabulary of 100",
        ),
        (
            json!({"hidden_size_per_layer_input": 1u64 << 60, "vocab_size_per_layer_input": 100}),
            "overflow",
        ),
        (json!({"num_kv_shared_layers": 6}), "6 of 6 layers"),
        (json!({"num_kv_shared_layers": 7}), "7 of 6 layers"),
        // Every 6th layer full: the only full layer (5) shared, none of its kind produces.
        (
            json!({"num_kv_shared_layers": 1}),
            "layer 5: no unshared full_attention layer before it",
        ),
        (
            json!({"use_bidirectional_attention": "all"}),
            "bidirectional",
        ),
        (json!({"hidden_activation": "silu"}), "hidden_activation"),
        (
            json!({"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 2.0}}}),
            "rope type `yarn`",
        ),
        (
            json!({"per_layer_config": {"5": {"sliding_window": 4}}}),
            "per-layer `sliding_window`",
        ),
        (
            json!({"per_layer_config": {"5": {"num_key_value_heads": 3}}}),
            "layer 5: 3 KV heads",
        ),
        (
            json!({"per_layer_config": {"9": {"head_dim": 32}}}),
            "layer `9`",
        ),
        (json!({"sliding_window": null}), "sliding_window"),
    ];
    for (extra, want) in cases {
        let e = spec(&small(extra.clone())).unwrap_err().to_string();
        assert!(e.contains(want), "{extra}: {e}");
    }
    // A sharing layer's geometry must be its producer's (per_layer_config could differ).
    let v = small(
        json!({"num_kv_shared_layers": 1, "layer_types": LAYER_TYPES, "per_layer_config": {
        "2": {"head_dim": 32, "num_key_value_heads": 1},
        "5": {"head_dim": 32, "num_key_value_heads": 2}}}),
    );
    let e = spec(&v).unwrap_err().to_string();
    assert!(
        e.contains("layer 5: 2 KV heads of 32 sharing layer 2's 1 of 32"),
        "{e}"
    );
    // Bidirectional attention over image tokens only leaves text causal.
    assert!(spec(&small(json!({"use_bidirectional_attention": "vision"}))).is_ok());
}

/// E2B's shape (35 layers, every 5th full, the last 20 sharing KV, per-layer embeddings of
/// 256, double-wide MLPs; values from the class's documentation, not a released file): the
/// sharing layers read the last unshared layer of their kind (13 sliding, 14 full), 15 cache
/// layers; the class's default per-layer width (256) where the config names none.
#[test]
fn e2b_per_layer_embeddings_and_kv_sharing() {
    let types: Vec<&str> = (0..35)
        .map(|i| match (i + 1) % 5 {
            0 => "full_attention",
            _ => "sliding_attention",
        })
        .collect();
    let mut v = small(json!({
        "num_hidden_layers": 35, "layer_types": types, "num_kv_shared_layers": 20,
        "use_double_wide_mlp": true, "vocab_size_per_layer_input": 100}));
    v.as_object_mut()
        .unwrap()
        .remove("hidden_size_per_layer_input");
    let g = spec(&v).unwrap().gemma4.unwrap();
    assert_eq!(
        g.ple,
        Some(Gemma4Ple {
            dim: 256,
            vocab: 100
        })
    );
    assert!((0..15).all(|i| g.kv_from[i].is_none() && g.kv_layer(i) == i));
    for i in 15..35 {
        let want = if g.sliding[i] { 13 } else { 14 };
        assert_eq!(
            (g.kv_from[i], g.kv_layer(i)),
            (Some(want), want),
            "layer {i}"
        );
        assert_eq!(g.mlp_width(i, 128), 256);
    }
    assert_eq!(g.mlp_width(14, 128), 128);
    // Width 0 or null: none (the 31B's, the 26B-A4B's).
    for none in [json!(0), Value::Null] {
        let g = spec(&small(json!({"hidden_size_per_layer_input": none})));
        assert_eq!(g.unwrap().gemma4.unwrap().ple, None);
    }
}

/// Gemma 4 12B's class (`Gemma4UnifiedForCausalLM`): Gemma 4's layers, no per-layer
/// embeddings or MoE block whatever the config says (its model builds neither), windows of
/// 1024 and a context of 262,144 where the config names none; its multimodal export read
/// text-only and tied, as Gemma 4's.
#[test]
fn unified_is_gemma4_without_ple_or_experts() {
    let mut v = small(json!({
        "architectures": ["Gemma4UnifiedForCausalLM"], "model_type": "gemma4_unified_text",
        "hidden_size_per_layer_input": 256, "enable_moe_block": true, "num_kv_shared_layers": 1,
        "layer_types": LAYER_TYPES}));
    v.as_object_mut().unwrap().remove("sliding_window");
    let s = spec(&v).unwrap();
    assert_eq!(s.architecture, Architecture::Gemma4Unified);
    assert_eq!(s.max_position_embeddings, 262_144);
    let g = s.gemma4.unwrap();
    assert_eq!((g.window, g.ple, g.moe), (1024, None, None));
    assert_eq!(g.kv_from[5], Some(2));
    let export = json!({
        "architectures": ["Gemma4UnifiedForConditionalGeneration"], "model_type": "gemma4_unified",
        "text_config": small(json!({"model_type": "gemma4_unified_text"})),
        "vision_config": {"model_type": "gemma4_unified_vision"}});
    let s = spec(&export).unwrap();
    assert_eq!(s.architecture, Architecture::Gemma4Unified);
    assert!(s.tie_word_embeddings);
}
