use serde_json::{Value, json};

use super::super::{Architecture, QkNorm, parse_config as parse};
use super::*;
use crate::kernels::device::RowNorm;

/// Shaped as Command R7B's config.json (the fields hsx and transformers read, and release fields
/// transformers ignores).
fn command_r7b() -> Value {
    json!({
        "architectures": ["Cohere2ForCausalLM"], "model_type": "cohere2",
        "attention_bias": false, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
        "intermediate_size": 14336, "layer_norm_eps": 1e-5, "logit_scale": 0.25,
        "max_position_embeddings": 132096, "num_attention_heads": 32, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "order_of_interleaved_layers": "local_attn_first",
        "position_embedding_type": "rope_gptj", "rope_scaling": null, "rope_theta": 50000,
        "rotary_pct": 1.0, "sliding_window": 4096, "sliding_window_pattern": 4,
        "torch_dtype": "bfloat16", "use_embedding_sharing": true, "vocab_size": 256000
    })
}

/// Shaped as Command R's (`c4ai-command-r-v01`) config.json.
fn command_r() -> Value {
    json!({
        "architectures": ["CohereForCausalLM"], "model_type": "cohere",
        "attention_bias": false, "hidden_act": "silu", "hidden_size": 8192,
        "intermediate_size": 22528, "layer_norm_eps": 1e-5, "logit_scale": 0.0625,
        "max_position_embeddings": 8192, "num_attention_heads": 64, "num_hidden_layers": 40,
        "num_key_value_heads": 64, "rope_theta": 8000000.0, "torch_dtype": "bfloat16",
        "use_qk_norm": false, "vocab_size": 256000
    })
}

#[test]
fn cohere_layer_norms_tied_interleaved_rope_every_layer() {
    let s = parse(&command_r()).unwrap();
    assert_eq!(s.architecture, Architecture::Cohere);
    assert_eq!(
        s.row_norm(),
        RowNorm {
            kind: NormKind::Layer,
            eps: 1e-5
        }
    );
    assert!(s.tie_word_embeddings && s.interleaved_rope && !s.qkv_bias && !s.mlp_bias);
    assert_eq!(
        (s.head_dim, s.rope_theta, s.qk_norm),
        (128, 8e6, QkNorm::None)
    );
    assert!(s.windows.is_none() && s.nope_layers.is_none() && s.sliding_window.is_none());
    // Command R+: q / k LayerNormed per head, each head with its own weights.
    let mut v = command_r();
    v["use_qk_norm"] = json!(true);
    assert_eq!(parse(&v).unwrap().qk_norm, QkNorm::HeadLayerNorm);
    // Cohere 2's classes read no such field.
    let mut v = command_r7b();
    v["use_qk_norm"] = json!(true);
    assert_eq!(parse(&v).unwrap().qk_norm, QkNorm::None);
}

#[test]
fn cohere2_sliding_layers_rotate_full_ones_do_not() {
    let s = parse(&command_r7b()).unwrap();
    assert_eq!(
        (s.norm, s.rms_norm_eps, s.head_dim),
        (NormKind::Layer, 1e-5, 128)
    );
    let w = s.windows.as_ref().unwrap();
    assert_eq!(w.window, 4096);
    let sliding: Vec<bool> = (0..32).map(|i| (i + 1) % 4 != 0).collect();
    assert_eq!(w.sliding, sliding);
    let nope: Vec<bool> = sliding.iter().map(|s| !s).collect();
    assert_eq!(s.nope_layers.as_ref(), Some(&nope));
    assert_eq!(w.local_rope, (50000.0, s.rope_scaling));
    // `layer_types` wins over the pattern; Cohere2Config's head_dim is hidden / heads.
    let mut v = command_r7b();
    v["num_hidden_layers"] = json!(3);
    v["head_dim"] = json!(64);
    v["layer_types"] = json!(["full_attention", "sliding_attention", "full_attention"]);
    let s = parse(&v).unwrap();
    assert_eq!(s.windows.unwrap().sliding, [false, true, false]);
    assert_eq!(s.nope_layers.unwrap(), [true, false, true]);
    assert_eq!(s.head_dim, 128);
    for (field, value) in [
        ("sliding_window", json!(null)),
        ("sliding_window", json!(0)),
        ("sliding_window_pattern", json!(0)),
    ] {
        let mut v = command_r7b();
        v[field] = value;
        let err = parse(&v).unwrap_err().to_string();
        assert!(err.contains(field), "{field}: {err}");
    }
}

/// Cohere2MoeConfig's defaults over a small geometry.
fn cohere2_moe(extra: Value) -> Value {
    let mut v = json!({
        "architectures": ["Cohere2MoeForCausalLM"], "model_type": "cohere2_moe",
        "hidden_size": 64, "intermediate_size": 32, "num_attention_heads": 4,
        "num_key_value_heads": 2, "num_hidden_layers": 6, "vocab_size": 100,
    });
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

#[test]
fn cohere2_moe_defaults_softmax_experts_in_every_layer() {
    let s = parse(&cohere2_moe(json!({}))).unwrap();
    assert_eq!(
        (s.norm, s.head_dim, s.intermediate_size),
        (NormKind::Layer, 128, 32)
    );
    let m = s.hybrid.as_ref().unwrap().moe.as_ref().unwrap();
    assert_eq!((m.num_experts, m.top_k, m.expert_intermediate), (8, 2, 32));
    assert_eq!((m.shared_intermediate, m.norm_topk_prob), (None, true));
    assert_eq!(m.sparse_layers, [true; 6]);
    let softmax = MoeRouter::Grouped {
        n_group: 1,
        topk_group: 1,
        scale: 1.0,
        softmax: true,
        bias: false,
        renorm_eps: DEFAULT_RENORM_EPS,
        group_rank: GroupRank::TopTwoSum,
    };
    assert_eq!(m.router, softmax);
    // No shared experts: nothing to average.
    assert_eq!(s.cohere, Some(CohereSpec { moe_average: false }));
    assert_eq!(
        s.windows.unwrap().sliding,
        [true, true, true, false, true, true]
    );
}

#[test]
fn cohere2_moe_dense_prefix_rotates_with_full_attention() {
    let v = cohere2_moe(
        json!({"first_k_dense_replace": 2, "prefix_dense_intermediate_size": 48,
        "num_shared_experts": 2, "rms_norm_eps": 1e-6}),
    );
    let s = parse(&v).unwrap();
    assert_eq!(s.row_norm(), RowNorm::rms(1e-6));
    assert_eq!(s.intermediate_size, 48);
    let m = s.hybrid.as_ref().unwrap().moe.as_ref().unwrap();
    assert_eq!(m.sparse_layers, [false, false, true, true, true, true]);
    assert_eq!(m.shared_intermediate, Some(64));
    assert_eq!(s.cohere, Some(CohereSpec { moe_average: true }));
    // The prefix: full, with RoPE; then the pattern counted after it.
    let w = s.windows.as_ref().unwrap();
    assert_eq!(w.sliding, [false, false, true, true, true, false]);
    assert_eq!(
        s.nope_layers.unwrap(),
        [false, false, false, false, false, true]
    );
    // A prefix pattern other than 1: the prefix follows it and no full layer rotates.
    let v = cohere2_moe(json!({"first_k_dense_replace": 2,
        "prefix_dense_sliding_window_pattern": 2}));
    let s = parse(&v).unwrap();
    assert_eq!(
        s.windows.unwrap().sliding,
        [true, false, true, true, true, false]
    );
    assert_eq!(
        s.nope_layers.unwrap(),
        [false, true, false, false, false, true]
    );
    // `mlp_layer_types` as saved by transformers.
    let kinds = json!(["dense", "sparse", "sparse", "sparse", "sparse", "sparse"]);
    let s = parse(&cohere2_moe(json!({"mlp_layer_types": kinds}))).unwrap();
    let m = s.hybrid.as_ref().unwrap().moe.as_ref().unwrap();
    assert_eq!(m.sparse_layers, [false, true, true, true, true, true]);
    // The layer pattern from `first_k_dense_replace` alone (0 here), as transformers.
    assert_eq!(
        s.windows.unwrap().sliding,
        [true, true, true, false, true, true]
    );
}

#[test]
fn cohere2_moe_sigmoid_router_and_refusals() {
    let v = cohere2_moe(
        json!({"expert_selection_fn": "sigmoid", "norm_topk_prob": false,
        "num_shared_experts": 1, "shared_expert_combination_strategy": "sum"}),
    );
    let s = parse(&v).unwrap();
    let m = s.hybrid.as_ref().unwrap().moe.as_ref().unwrap();
    assert!(!m.norm_topk_prob);
    assert!(matches!(
        m.router,
        MoeRouter::Grouped {
            softmax: false,
            bias: false,
            ..
        }
    ));
    assert_eq!(s.cohere, Some(CohereSpec { moe_average: false }));
    for (field, value) in [
        ("expert_selection_fn", json!("relu")),
        ("shared_expert_combination_strategy", json!("max")),
        ("mlp_layer_types", json!(["dense"])),
    ] {
        let err = parse(&cohere2_moe(json!({ field: value })))
            .unwrap_err()
            .to_string();
        assert!(err.contains(field), "{field}: {err}");
    }
}
