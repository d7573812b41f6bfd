use std::path::Path;

use serde_json::{Value, json};

use super::super::{Architecture, ModelSpec, QkNorm};
use super::MoeRouter;

fn parse(v: &Value) -> ModelSpec {
    ModelSpec::from_json(v, Path::new("config.json"), "m".into()).unwrap()
}

/// Shaped as Qwen3-30B-A3B's config.json (transformers 4.51 field names).
fn qwen3_30b_a3b() -> Value {
    json!({
        "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false,
        "decoder_sparse_step": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
        "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
        "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
        "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128,
        "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
        "rms_norm_eps": 1e-6, "rope_scaling": null, "rope_theta": 1000000.0,
        "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
        "use_sliding_window": false, "vocab_size": 151936
    })
}

#[test]
fn qwen3_moe_geometry_and_sparse_layers() {
    let s = parse(&qwen3_30b_a3b());
    let h = s.hybrid.as_ref().unwrap();
    let m = h.moe.as_ref().unwrap();
    assert_eq!(
        (m.num_experts, m.top_k, m.expert_intermediate),
        (128, 8, 768)
    );
    assert!(m.norm_topk_prob && m.shared_intermediate.is_none());
    assert!(m.sparse_layers.iter().all(|&s| s) && m.sparse_layers.len() == 48);
    assert!(s.qk_norm == QkNorm::PerHead && !s.has_recurrent_layers());
    assert_eq!((s.head_dim, h.rotary_dim), (128, 128));
    // transformers 5 saves `num_experts` as `num_local_experts`; sparse step 2 and
    // mlp_only_layers make layers 1 and 5 of 0..6 the MoE ones.
    let mut v = qwen3_30b_a3b();
    let o = v.as_object_mut().unwrap();
    o.remove("num_experts");
    o.remove("norm_topk_prob");
    o.insert("num_local_experts".into(), json!(16));
    o.insert("num_hidden_layers".into(), json!(6));
    o.insert("decoder_sparse_step".into(), json!(2));
    o.insert("mlp_only_layers".into(), json!([3]));
    let s = parse(&v);
    let m = s.hybrid.unwrap().moe.unwrap();
    assert_eq!(m.num_experts, 16);
    assert!(!m.norm_topk_prob, "Qwen3MoeConfig's default");
    let sparse = vec![false, true, false, false, false, true];
    assert_eq!(m.sparse_layers, sparse);
}

/// Shaped as Mixtral-8x7B-v0.1's config.json.
#[test]
fn mixtral_geometry() {
    let v = json!({
        "architectures": ["MixtralForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
        "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
        "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "num_local_experts": 8, "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.02, "sliding_window": null, "tie_word_embeddings": false,
        "torch_dtype": "bfloat16", "vocab_size": 32000
    });
    let s = parse(&v);
    assert_eq!(s.architecture, Architecture::Mixtral);
    assert_eq!((s.head_dim, s.rms_norm_eps), (128, 1e-5));
    let m = s.hybrid.unwrap().moe.unwrap();
    assert_eq!(
        (m.num_experts, m.top_k, m.expert_intermediate),
        (8, 2, 14336)
    );
    assert!(m.norm_topk_prob && m.shared_intermediate.is_none());
    let mut windowed = v.clone();
    windowed["sliding_window"] = json!(4096);
    let w = ModelSpec::from_json(&windowed, Path::new("config.json"), "m".into());
    assert_eq!(w.unwrap().sliding_window, Some(4096));
}

/// Shaped as Qwen3.5-35B-A3B's export: `Qwen3_5MoeForConditionalGeneration`, the language
/// model under `text_config` (no `intermediate_size`: every layer is sparse).
#[test]
fn qwen3_5_moe_export_runs_its_text_config() {
    let layer_types: Vec<&str> = (0..40)
        .map(|i| match (i + 1) % 4 {
            0 => "full_attention",
            _ => "linear_attention",
        })
        .collect();
    let v = json!({
        "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
        "tie_word_embeddings": false,
        "text_config": {
            "attn_output_gate": true, "dtype": "bfloat16", "head_dim": 256,
            "hidden_act": "silu", "hidden_size": 2048, "layer_types": layer_types,
            "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
            "linear_num_key_heads": 16, "linear_num_value_heads": 32,
            "linear_value_head_dim": 128, "max_position_embeddings": 262144,
            "model_type": "qwen3_5_moe_text", "moe_intermediate_size": 512,
            "num_attention_heads": 16, "num_experts": 256, "num_experts_per_tok": 8,
            "num_hidden_layers": 40, "num_key_value_heads": 2,
            "rope_parameters": {"mrope_interleaved": true, "mrope_section": [11, 11, 10],
                "partial_rotary_factor": 0.25, "rope_theta": 10000000, "rope_type": "default"},
            "shared_expert_intermediate_size": 512, "vocab_size": 248320
        },
        "vision_config": {"depth": 27, "hidden_size": 1152, "out_hidden_size": 2048}
    });
    let s = parse(&v);
    assert_eq!(s.architecture, Architecture::Qwen3_5Moe);
    let h = s.hybrid.as_ref().unwrap();
    let m = h.moe.as_ref().unwrap();
    assert_eq!(
        (m.num_experts, m.top_k, m.shared_intermediate),
        (256, 8, Some(512))
    );
    assert!(m.norm_topk_prob && m.sparse_layers.iter().all(|&s| s));
    assert_eq!((s.intermediate_size, h.rotary_dim), (512, 64));
    assert!(s.has_recurrent_layers());
}

/// GLM-4.5-Air as released (tests/fixtures/released_configs): every field hsx reads.
#[test]
fn glm_4_5_air_geometry_router_and_attention() {
    let s = parse(&super::super::released_config("glm-4.5-air.json"));
    assert_eq!(s.architecture, Architecture::Glm4Moe);
    assert_eq!(
        (s.num_layers, s.head_dim, s.intermediate_size),
        (46, 128, 10944)
    );
    assert_eq!((s.qkv_bias, s.o_bias), (true, false));
    assert_eq!(s.qk_norm, QkNorm::None);
    assert_eq!((s.rms_norm_eps, s.rope_theta), (1e-5, 1e6));
    let h = s.hybrid.as_ref().unwrap();
    assert_eq!(h.rotary_dim, 64);
    let m = h.moe.as_ref().unwrap();
    assert_eq!(
        (
            m.num_experts,
            m.top_k,
            m.expert_intermediate,
            m.shared_intermediate
        ),
        (128, 8, 1408, Some(1408))
    );
    assert!(!m.sparse_layers[0] && m.sparse_layers[1..].iter().all(|&s| s));
    let g = m.grouped().unwrap();
    assert_eq!(
        (g.n_group, g.topk_group, g.renorm, g.scale),
        (1, 1, true, 1.0)
    );
    assert!(!s.has_recurrent_layers());
}

/// GLM-4.5's fields and Glm4MoeConfig's defaults; a router transformers could not run and
/// a non-positive scale are refused, naming the field.
#[test]
fn glm_4_5_fields_defaults_and_refusals() {
    let mut v = json!({
        "architectures": ["Glm4MoeForCausalLM"], "hidden_size": 5120, "head_dim": 128,
        "intermediate_size": 12288, "num_attention_heads": 96, "num_key_value_heads": 8,
        "num_hidden_layers": 92, "vocab_size": 151552, "first_k_dense_replace": 3,
        "n_routed_experts": 160, "n_shared_experts": 2, "moe_intermediate_size": 1536,
        "routed_scaling_factor": 2.5, "use_qk_norm": true, "n_group": 8, "topk_group": 4,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
            "partial_rotary_factor": 0.25}
    });
    let s = parse(&v);
    assert_eq!(s.qk_norm, QkNorm::PerHead);
    let h = s.hybrid.as_ref().unwrap();
    let m = h.moe.as_ref().unwrap();
    assert_eq!(
        (h.rotary_dim, m.top_k, m.shared_intermediate),
        (32, 8, Some(3072))
    );
    assert_eq!(m.sparse_layers.iter().filter(|&&s| !s).count(), 3);
    let g = m.grouped().unwrap();
    assert_eq!(
        (g.n_group, g.topk_group, g.renorm, g.scale),
        (8, 4, true, 2.5)
    );
    let refused = |v: &Value| {
        let e = ModelSpec::from_json(v, Path::new("config.json"), "m".into()).unwrap_err();
        e.to_string()
    };
    v["n_group"] = json!(7);
    assert!(refused(&v).contains("n_group"), "{}", refused(&v));
    v["n_group"] = json!(8);
    v["routed_scaling_factor"] = json!(0.0);
    assert!(
        refused(&v).contains("routed_scaling_factor"),
        "{}",
        refused(&v)
    );
    v["routed_scaling_factor"] = json!(1.0);
    v["n_shared_experts"] = json!(0);
    let s = parse(&v);
    assert_eq!(s.hybrid.unwrap().moe.unwrap().shared_intermediate, None);
}

/// Shaped as Qwen2-57B-A14B's config.json: Qwen2's biased q / k / v, 64 experts top-8 (not
/// renormalised) beside a gated shared expert of 20480; its sliding window off.
#[test]
fn qwen2_moe_geometry_and_refusal() {
    let mut v = json!({
        "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
        "hidden_act": "silu", "hidden_size": 3584, "intermediate_size": 18944,
        "max_position_embeddings": 32768, "max_window_layers": 28,
        "moe_intermediate_size": 2560, "norm_topk_prob": false, "num_attention_heads": 28,
        "num_experts": 64, "num_experts_per_tok": 8, "num_hidden_layers": 28,
        "num_key_value_heads": 4, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "shared_expert_intermediate_size": 20480, "sliding_window": 65536,
        "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_sliding_window": false,
        "vocab_size": 151936
    });
    let s = parse(&v);
    assert_eq!(s.architecture, Architecture::Qwen2Moe);
    assert_eq!(
        (s.qkv_bias, s.o_bias, s.qk_norm),
        (true, false, QkNorm::None)
    );
    let m = s.hybrid.unwrap().moe.unwrap();
    assert_eq!(
        (
            m.num_experts,
            m.top_k,
            m.expert_intermediate,
            m.shared_intermediate
        ),
        (64, 8, 2560, Some(20480))
    );
    assert!(!m.norm_topk_prob && m.sparse_layers.iter().all(|&s| s));
    assert_eq!(m.router, MoeRouter::Softmax);
    v["use_sliding_window"] = json!(true);
    v["sliding_window"] = json!(4096);
    let err = super::super::parse_config(&v).unwrap_err();
    assert!(err.to_string().contains("sliding-window"), "{err}");
}

/// Shaped as OLMoE-1B-7B-0924's config.json: q / k norms over the whole projection, 64
/// experts of `intermediate_size` top-8, not renormalised; `clip_qkv` refused.
#[test]
fn olmoe_geometry_and_clip_refusal() {
    let mut v = json!({
        "architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "clip_qkv": null,
        "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 1024,
        "max_position_embeddings": 4096, "norm_topk_prob": false, "num_attention_heads": 16,
        "num_experts": 64, "num_experts_per_tok": 8, "num_hidden_layers": 16,
        "num_key_value_heads": 16, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 50304
    });
    let s = parse(&v);
    assert_eq!(s.architecture, Architecture::Olmoe);
    assert_eq!(s.qk_norm, QkNorm::Whole);
    let m = s.hybrid.unwrap().moe.unwrap();
    assert_eq!(
        (
            m.num_experts,
            m.top_k,
            m.expert_intermediate,
            m.shared_intermediate
        ),
        (64, 8, 1024, None)
    );
    assert!(!m.norm_topk_prob);
    v["clip_qkv"] = json!(8.0);
    let err = super::super::parse_config(&v).unwrap_err();
    assert!(err.to_string().contains("clip_qkv"), "{err}");
}

/// FlexOlmo with `FlexOlmoConfig`'s defaults: OLMo 2's layers (theta 5e5, eps 1e-6), 7
/// experts of `intermediate_size`, top-5.
#[test]
fn flex_olmo_defaults() {
    let v = json!({
        "architectures": ["FlexOlmoForCausalLM"], "model_type": "flex_olmo",
        "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
        "num_attention_heads": 32, "vocab_size": 100352
    });
    let s = parse(&v);
    assert_eq!(s.architecture, Architecture::FlexOlmo);
    assert_eq!((s.rope_theta, s.rms_norm_eps), (5e5, 1e-6));
    assert_eq!(s.qk_norm, QkNorm::Whole);
    assert!(
        s.windows
            .as_ref()
            .is_some_and(|o| o.sliding.iter().all(|s| !s))
    );
    let m = s.hybrid.unwrap().moe.unwrap();
    assert_eq!(
        (m.num_experts, m.top_k, m.expert_intermediate),
        (7, 5, 11008)
    );
}

/// SolarOpenConfig's defaults: Llama's attention (o_proj unbiased, whole heads rotated, theta
/// 1e6), GLM-4.5's router with experts in every layer (a `first_k_dense_replace`, which the
/// class does not have, changes nothing); a partial rotary factor refused.
#[test]
fn solar_open_defaults_every_layer_sparse() {
    let mut v = json!({
        "architectures": ["SolarOpenForCausalLM"], "hidden_size": 4096,
        "num_attention_heads": 64, "num_key_value_heads": 8, "num_hidden_layers": 48,
        "vocab_size": 196608, "attention_bias": true, "first_k_dense_replace": 2
    });
    let s = parse(&v);
    assert_eq!(s.architecture, Architecture::SolarOpen);
    assert_eq!((s.head_dim, s.rope_theta, s.rms_norm_eps), (128, 1e6, 1e-5));
    assert_eq!(
        (s.qkv_bias, s.o_bias, s.qk_norm),
        (true, false, QkNorm::None)
    );
    assert!(!s.tie_word_embeddings);
    let h = s.hybrid.as_ref().unwrap();
    assert_eq!(h.rotary_dim, 128);
    let m = h.moe.as_ref().unwrap();
    assert_eq!(
        (
            m.num_experts,
            m.top_k,
            m.expert_intermediate,
            m.shared_intermediate
        ),
        (128, 8, 1280, Some(1280))
    );
    assert_eq!(m.sparse_layers, vec![true; 48]);
    let g = m.grouped().unwrap();
    assert_eq!(
        (g.n_group, g.topk_group, g.renorm, g.scale),
        (1, 1, true, 1.0)
    );
    v["partial_rotary_factor"] = json!(0.5);
    let e = ModelSpec::from_json(&v, Path::new("config.json"), "m".into()).unwrap_err();
    assert!(e.to_string().contains("partial_rotary_factor"), "{e}");
}
