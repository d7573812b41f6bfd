use serde_json::{Value, json};

use super::super::{Architecture, QkNorm, parse_config as parse};
use super::*;

/// Shaped as Hunyuan-A13B-Instruct's config.json (the fields hsx and transformers read, and
/// release fields transformers ignores).
fn hunyuan_a13b() -> Value {
    json!({
        "architectures": ["HunYuanMoEV1ForCausalLM"], "model_type": "hunyuan_v1_moe",
        "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 3072,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "num_hidden_layers": 32, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "rope_scaling": {"alpha": 1000.0, "beta_fast": 32,
            "beta_slow": 1, "factor": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
            "type": "dynamic"},
        "num_experts": 64, "moe_topk": vec![8; 32], "moe_intermediate_size": vec![3072; 32],
        "num_shared_expert": vec![1; 32], "use_mixed_mlp_moe": true, "use_qk_norm": true,
        "use_cla": false, "cla_share_factor": 2, "attention_bias": false,
        "tie_word_embeddings": true, "torch_dtype": "bfloat16", "vocab_size": 128167
    })
}

#[test]
fn hunyuan_moe_geometry_rope_and_router() {
    let s = parse(&hunyuan_a13b()).unwrap();
    assert_eq!(s.architecture, Architecture::HunYuanMoEV1);
    assert_eq!(s.qk_norm, QkNorm::PerHeadAfterRope);
    assert_eq!((s.head_dim, s.num_kv_heads), (128, 8));
    // 1e4 · 1000^(128 / 126), NTK-alpha's fixed base.
    let base = 1e4 * 1000f64.powf(128.0 / 126.0);
    assert!(
        (s.rope_theta - base).abs() < 1e-6 * base,
        "{}",
        s.rope_theta
    );
    assert_eq!(s.rope_scaling, RopeScaling::None);
    let m = s.hybrid.as_ref().unwrap().moe.as_ref().unwrap();
    assert_eq!(
        (
            m.num_experts,
            m.top_k,
            m.expert_intermediate,
            m.shared_intermediate
        ),
        (64, 8, 3072, Some(3072))
    );
    assert!(m.norm_topk_prob && m.sparse_layers.iter().all(|&s| s));
    assert_eq!(m.router, MoeRouter::HunYuan);
}

#[test]
fn hunyuan_refusals_name_the_field() {
    let refused = |k: &str, x: Value| {
        let mut v = hunyuan_a13b();
        v[k] = x;
        parse(&v).unwrap_err().to_string()
    };
    assert!(refused("use_cla", json!(true)).contains("use_cla"));
    let mut topk = vec![8; 32];
    topk[3] = 4;
    assert!(refused("moe_topk", json!(topk)).contains("moe_topk"));
    // `dynamic` without alpha is length-dependent NTK scaling.
    let err = refused("rope_scaling", json!({"type": "dynamic", "factor": 2.0}));
    assert!(err.contains("dynamic"), "{err}");
}

/// Shaped as Hunyuan-7B-Instruct's config.json: the dense class, the same attention and RoPE.
#[test]
fn hunyuan_dense_reads_llama_fields_with_its_attention() {
    let mut v = hunyuan_a13b();
    let o = v.as_object_mut().unwrap();
    for k in [
        "num_experts",
        "moe_topk",
        "moe_intermediate_size",
        "num_shared_expert",
    ] {
        o.remove(k);
    }
    v["architectures"] = json!(["HunYuanDenseV1ForCausalLM"]);
    v["model_type"] = json!("hunyuan_v1_dense");
    v["rope_scaling"] = json!({"alpha": 50.0, "type": "dynamic", "factor": 1.0});
    v["intermediate_size"] = json!(14336);
    let s = parse(&v).unwrap();
    assert_eq!(s.architecture, Architecture::HunYuanDenseV1);
    assert!(s.hybrid.is_none() && s.tie_word_embeddings);
    assert_eq!(
        (s.qk_norm, s.intermediate_size),
        (QkNorm::PerHeadAfterRope, 14336)
    );
    let base = 1e4 * 50f64.powf(128.0 / 126.0);
    assert!((s.rope_theta - base).abs() < 1e-6 * base);
}

/// HY V3 with `HYV3Config`'s defaults: heads of 128, RoPE theta 11158840, layer 0 dense, 192
/// experts top-8 of the sigmoid router with its bias, renormalised, × 2.826, one shared expert.
#[test]
fn hy_v3_defaults_and_refusal() {
    let mut v = json!({
        "architectures": ["HYV3ForCausalLM"], "model_type": "hy_v3", "hidden_size": 4096,
        "intermediate_size": 13312, "num_hidden_layers": 80, "num_attention_heads": 64,
        "num_key_value_heads": 8, "vocab_size": 120832, "torch_dtype": "bfloat16"
    });
    let s = parse(&v).unwrap();
    assert_eq!(s.architecture, Architecture::HyV3);
    assert_eq!(
        (s.head_dim, s.rope_theta, s.rms_norm_eps),
        (128, 11_158_840.0, 1e-5)
    );
    assert_eq!(s.qk_norm, QkNorm::PerHead);
    let m = s.hybrid.as_ref().unwrap().moe.as_ref().unwrap();
    assert_eq!(
        (
            m.num_experts,
            m.top_k,
            m.expert_intermediate,
            m.shared_intermediate
        ),
        (192, 8, 1536, Some(1536))
    );
    assert!(m.norm_topk_prob && !m.sparse_layers[0] && m.sparse_layers[1..].iter().all(|&s| s));
    assert_eq!(m.router, MoeRouter::sigmoid(2.826));
    v["mlp_bias"] = json!(true);
    assert!(parse(&v).unwrap_err().to_string().contains("mlp_bias"));
}
