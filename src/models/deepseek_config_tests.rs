use std::path::Path;

use serde_json::{Value, json};

use super::super::hybrid_config::GroupRank;
use super::super::{Architecture, ModelSpec, WeightDtype};
use super::MlaSpec;
use crate::kernels::routing::RouterScore;

fn parse(v: &Value) -> Result<ModelSpec, String> {
    ModelSpec::from_json(v, Path::new("config.json"), "m".into()).map_err(|e| e.to_string())
}

/// DeepSeek-V3's published geometry (`DeepseekV3Config`'s defaults are its values) and its
/// FP8 blocks, as its config.json names them.
fn deepseek_v3() -> Value {
    json!({
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
        "n_shared_experts": 1, "n_routed_experts": 256, "routed_scaling_factor": 2.5,
        "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
        "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4,
        "num_experts_per_tok": 8, "first_k_dense_replace": 3, "norm_topk_prob": true,
        "scoring_func": "sigmoid", "topk_method": "noaux_tc", "hidden_act": "silu",
        "max_position_embeddings": 163840, "rms_norm_eps": 1e-6, "rope_theta": 10000,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
            "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
            "type": "yarn"},
        "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 129280,
        "num_nextn_predict_layers": 1,
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
            "quant_method": "fp8", "weight_block_size": [128, 128]}
    })
}

#[test]
fn deepseek_v3_heads_latents_router_and_scale() {
    let s = parse(&deepseek_v3()).unwrap();
    assert_eq!(s.architecture, Architecture::DeepseekV3);
    assert_eq!((s.num_heads, s.num_kv_heads, s.head_dim), (128, 128, 192));
    let h = s.hybrid.as_ref().unwrap();
    let mla = h.mla.as_ref().unwrap();
    assert_eq!((mla.q_lora, mla.kv_lora), (Some(1536), 512));
    assert_eq!((mla.dims.nope, mla.dims.rope, mla.dims.v), (128, 64, 128));
    assert!(mla.dims.interleave);
    assert_eq!(h.rotary_dim, 64);
    // transformers: (0.1 · 1.0 · ln 40 + 1)².
    let m = 0.1 * 40f64.ln() + 1.0;
    assert!(
        (mla.score_factor - m * m).abs() < 1e-12,
        "{}",
        mla.score_factor
    );
    let moe = h.moe.as_ref().unwrap();
    assert_eq!(
        (moe.num_experts, moe.top_k, moe.shared_intermediate),
        (256, 8, Some(2048))
    );
    assert_eq!(moe.sparse_layers.iter().filter(|&&s| !s).count(), 3);
    let g = moe.grouped().unwrap();
    assert_eq!((g.n_group, g.topk_group, g.scale), (8, 4, 2.5));
    let fp8 = s.fp8.unwrap();
    assert_eq!((fp8.rows, fp8.cols, s.dtype), (128, 128, WeightDtype::Bf16));
}

#[test]
fn defaults_plain_rope_and_refusals_name_the_field() {
    let mut v = json!({"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 4,
        "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 512,
        "q_lora_rank": null, "rope_interleave": false});
    let s = parse(&v).unwrap();
    let mla = s.hybrid.as_ref().unwrap().mla.clone().unwrap();
    assert_eq!((mla.q_lora, mla.score_factor), (None, 1.0));
    assert!(!mla.dims.interleave);
    v["v_head_dim"] = json!(193);
    assert!(parse(&v).unwrap_err().contains("v_head_dim"));
    v["v_head_dim"] = json!(128);
    v["qk_rope_head_dim"] = json!(7);
    assert!(parse(&v).unwrap_err().contains("qk_rope_head_dim"));
    v["qk_rope_head_dim"] = json!(64);
    v["attention_bias"] = json!(true);
    assert!(parse(&v).unwrap_err().contains("attention_bias"));
    v["attention_bias"] = json!(false);
    v["kv_lora_rank"] = json!(0);
    assert!(parse(&v).unwrap_err().contains("kv_lora_rank"));
    v["kv_lora_rank"] = json!(512);
    v["n_group"] = json!(7);
    assert!(parse(&v).unwrap_err().contains("n_group"));
}

fn mla(v: &Value) -> MlaSpec {
    parse(v).unwrap().hybrid.unwrap().mla.unwrap()
}

/// `Glm4MoeLiteConfig`'s defaults are GLM-4.7-Flash's geometry; `mlp_layer_types` alone
/// says which layers are dense (the class ignores `first_k_dense_replace`).
#[test]
fn glm_4_moe_lite_defaults_and_layer_types() {
    let mut v = json!({"architectures": ["Glm4MoeLiteForCausalLM"], "num_hidden_layers": 47});
    let s = parse(&v).unwrap();
    assert_eq!(s.architecture, Architecture::Glm4MoeLite);
    assert_eq!(
        (s.vocab_size, s.hidden_size, s.intermediate_size),
        (154880, 2048, 10240)
    );
    assert_eq!((s.num_heads, s.head_dim, s.rms_norm_eps), (20, 256, 1e-5));
    assert_eq!(s.max_position_embeddings, 202752);
    let h = s.hybrid.as_ref().unwrap();
    let m = h.mla.as_ref().unwrap();
    assert_eq!((m.q_lora, m.kv_lora), (Some(768), 512));
    assert_eq!((m.dims.nope, m.dims.rope, m.dims.v), (192, 64, 256));
    let moe = h.moe.as_ref().unwrap();
    assert_eq!(
        (moe.num_experts, moe.top_k, moe.expert_intermediate),
        (64, 4, 1536)
    );
    assert_eq!(moe.shared_intermediate, Some(1536));
    let g = moe.grouped().unwrap();
    assert_eq!((g.n_group, g.topk_group, g.scale), (1, 1, 1.8));
    assert!(!moe.sparse_layers[0] && moe.sparse_layers[1..].iter().all(|&s| s));
    v["num_hidden_layers"] = json!(3);
    v["first_k_dense_replace"] = json!(2);
    v["mlp_layer_types"] = json!(["sparse", "dense", "sparse"]);
    let moe = parse(&v).unwrap().hybrid.unwrap().moe.unwrap();
    assert_eq!(moe.sparse_layers, [true, false, true]);
    for bad in [
        json!(["sparse", "dense"]),
        json!(["sparse", "moe", "dense"]),
    ] {
        v["mlp_layer_types"] = bad;
        assert!(parse(&v).unwrap_err().contains("mlp_layer_types"));
    }
}

/// An absent `q_lora_rank` is the class default (q through its latent), a null one means
/// `q_proj`. Fewer kv heads than q heads, and a partial rotary factor, are refused: the
/// expanded heads and the rotated dims would not line up (transformers fails on both).
#[test]
fn q_latent_default_kv_heads_and_rotary_factor() {
    let mut v = json!({"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 4});
    assert_eq!(mla(&v).q_lora, Some(1536));
    v["q_lora_rank"] = Value::Null;
    assert_eq!(mla(&v).q_lora, None);
    v["num_key_value_heads"] = json!(8);
    assert!(parse(&v).unwrap_err().contains("num_key_value_heads"));
    v["num_key_value_heads"] = json!(128);
    v["partial_rotary_factor"] = json!(0.5);
    assert!(parse(&v).unwrap_err().contains("partial_rotary_factor"));
    v["partial_rotary_factor"] = json!(1.0);
    assert_eq!(mla(&v).dims.rope, 64);
}

/// DeepSeek-V3.2 and GLM-5 (DeepSeek Sparse Attention): the classes' geometry, interleaved
/// pairs whatever `rope_interleave` says, their whole context (the indexer's selection runs
/// past `index_topk`); a null q latent is refused by name (the indexer's own fields:
/// dsa_config_tests.rs).
#[test]
fn sparse_attention_families_parse_with_their_indexer() {
    let mut v = json!({"architectures": ["DeepseekV32ForCausalLM"], "num_hidden_layers": 5,
        "rope_interleave": false});
    let s = parse(&v).unwrap();
    assert_eq!(
        (s.architecture, s.num_heads, s.head_dim),
        (Architecture::DeepseekV32, 128, 192)
    );
    assert_eq!(s.max_position_embeddings, 163840);
    let m = s.hybrid.as_ref().unwrap().mla.clone().unwrap();
    let dsa = m.dsa.unwrap();
    assert_eq!((m.q_lora, dsa.topk, dsa.heads), (Some(1536), 2048, 64));
    assert!(m.dims.interleave && !dsa.interleave);
    let moe = s.hybrid.unwrap().moe.unwrap();
    assert_eq!(moe.sparse_layers, [false, false, false, true, true]);
    v["mlp_layer_types"] = json!(["dense", "sparse", "sparse", "sparse", "dense"]);
    v["index_topk"] = json!(64);
    v["max_position_embeddings"] = json!(4096);
    let s = parse(&v).unwrap();
    assert_eq!(s.max_position_embeddings, 4096);
    let moe = s.hybrid.unwrap().moe.unwrap();
    assert_eq!(moe.sparse_layers, [false, true, true, true, false]);
    v["q_lora_rank"] = Value::Null;
    assert!(parse(&v).unwrap_err().contains("q_lora_rank"));

    let glm = json!({"architectures": ["GlmMoeDsaForCausalLM"], "num_hidden_layers": 78});
    let s = parse(&glm).unwrap();
    assert_eq!(
        (s.vocab_size, s.hidden_size, s.num_heads, s.rms_norm_eps),
        (154880, 6144, 64, 1e-5)
    );
    assert_eq!(s.max_position_embeddings, 202752);
    let m = s.hybrid.as_ref().unwrap().mla.clone().unwrap();
    let dsa = m.dsa.unwrap();
    assert_eq!((m.q_lora, m.kv_lora, dsa.topk), (Some(2048), 512, 2048));
    assert!(dsa.interleave && dsa.heads == 32);
    assert_eq!((m.dims.nope, m.dims.rope, m.dims.v), (192, 64, 256));
    let moe = s.hybrid.unwrap().moe.unwrap();
    assert_eq!(
        (moe.num_experts, moe.top_k, moe.expert_intermediate),
        (256, 8, 2048)
    );
    assert_eq!(moe.grouped().unwrap().scale, 2.5);
    assert_eq!(moe.sparse_layers.iter().filter(|&&s| !s).count(), 3);
    // DeepSeek-V3 itself has no indexer.
    let v3 = json!({"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 4,
        "index_topk": 8});
    assert_eq!(mla(&v3).dsa, None);
}

/// AXK1Config's geometry; its MoE layers from `mlp_layer_types`, else from the legacy
/// `first_k_dense_replace` (1) and `moe_layer_freq` (1); q always through its latent.
#[test]
fn axk1_defaults_layer_pattern_and_q_latent() {
    let mut v = json!({"architectures": ["AXK1ForCausalLM"], "num_hidden_layers": 6});
    let s = parse(&v).unwrap();
    assert_eq!(s.architecture, Architecture::Axk1);
    assert_eq!((s.vocab_size, s.num_heads, s.head_dim), (163840, 64, 192));
    assert_eq!(s.max_position_embeddings, 32768);
    let h = s.hybrid.as_ref().unwrap();
    assert_eq!(h.mla.as_ref().unwrap().q_lora, Some(1536));
    let m = h.moe.as_ref().unwrap();
    assert_eq!(
        (m.num_experts, m.top_k, m.shared_intermediate),
        (192, 8, Some(2048))
    );
    assert_eq!(m.sparse_layers, [false, true, true, true, true, true]);
    v["first_k_dense_replace"] = json!(2);
    v["moe_layer_freq"] = json!(2);
    let sparse = |v: &Value| parse(v).unwrap().hybrid.unwrap().moe.unwrap().sparse_layers;
    assert_eq!(sparse(&v), [false, false, true, false, true, false]);
    v["mlp_layer_types"] = json!(["dense", "sparse", "dense", "sparse", "dense", "sparse"]);
    assert_eq!(sparse(&v), [false, true, false, true, false, true]);
    v["moe_layer_freq"] = json!(0);
    v.as_object_mut().unwrap().remove("mlp_layer_types");
    assert!(parse(&v).unwrap_err().contains("moe_layer_freq"));
    v["moe_layer_freq"] = json!(1);
    v["q_lora_rank"] = json!(null);
    assert!(parse(&v).unwrap_err().contains("q_lora_rank"));
}

/// YoutuConfig: DeepSeek-V3's attention fields in Llama's dense layers, tied by default.
#[test]
fn youtu_is_dense_with_latent_attention() {
    let s = parse(&json!({"architectures": ["YoutuForCausalLM"], "num_hidden_layers": 4})).unwrap();
    assert_eq!(s.architecture, Architecture::Youtu);
    assert_eq!(
        (s.hidden_size, s.num_heads, s.intermediate_size),
        (2048, 16, 6144)
    );
    assert!(s.tie_word_embeddings);
    let h = s.hybrid.as_ref().unwrap();
    assert!(h.moe.is_none());
    let mla = h.mla.as_ref().unwrap();
    assert_eq!(
        (mla.q_lora, mla.kv_lora, mla.dims.rope),
        (Some(1536), 512, 64)
    );
}

/// Shaped as DeepSeek-V2-Lite's config: q through `q_proj`, interleaved (complex) RoPE
/// whatever `rope_interleave` says, the greedy top-6 of 64 softmax-scored experts never
/// renormalised and every group kept; `group_limited_greedy` keeps the groups with the best
/// single scores; another method, a missing `num_experts_per_tok` and `mlp_bias` are refused.
#[test]
fn deepseek_v2_lite_greedy_router() {
    let mut v = json!({
        "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
        "first_k_dense_replace": 1, "hidden_size": 2048, "intermediate_size": 10944,
        "kv_lora_rank": 512, "moe_intermediate_size": 1408, "moe_layer_freq": 1,
        "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": false,
        "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27,
        "num_key_value_heads": 16, "q_lora_rank": null, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000,
        "routed_scaling_factor": 1.0, "scoring_func": "softmax", "topk_group": 1,
        "topk_method": "greedy", "torch_dtype": "bfloat16", "v_head_dim": 128,
        "vocab_size": 102400
    });
    let s = parse(&v).unwrap();
    assert_eq!(s.architecture, Architecture::DeepseekV2);
    let h = s.hybrid.clone().unwrap();
    let mla = h.mla.unwrap();
    assert_eq!((mla.q_lora, mla.dims.interleave), (None, true));
    let m = h.moe.unwrap();
    assert_eq!(
        (m.num_experts, m.top_k, m.expert_intermediate),
        (64, 6, 1408)
    );
    assert_eq!(
        (m.shared_intermediate, m.norm_topk_prob),
        (Some(2816), false)
    );
    assert_eq!(&m.sparse_layers[..2], [false, true]);
    let g = m.grouped().unwrap();
    assert_eq!(
        (g.n_group, g.topk_group, g.renorm, g.scale),
        (1, 1, false, 1.0)
    );
    // A greedy router reads no groups; renormalisation is never applied.
    v["n_group"] = json!(8);
    v["topk_group"] = json!(3);
    v["norm_topk_prob"] = json!(true);
    v["rope_interleave"] = json!(false);
    let s = parse(&v).unwrap();
    let m = s.hybrid.clone().unwrap().moe.unwrap();
    let g = m.grouped().unwrap();
    assert_eq!((g.n_group, g.topk_group, g.renorm), (1, 1, false));
    assert!(s.hybrid.unwrap().mla.unwrap().dims.interleave);
    // V2 / V2.5 236B: the top-k inside the 3 of 8 groups with the best single scores.
    v["topk_method"] = json!("group_limited_greedy");
    let g = parse(&v)
        .unwrap()
        .hybrid
        .unwrap()
        .moe
        .unwrap()
        .grouped()
        .unwrap();
    assert_eq!((g.n_group, g.topk_group, g.renorm), (8, 3, false));
    assert_eq!(
        (g.group_rank, g.score),
        (GroupRank::Best, RouterScore::Softmax)
    );
    let mut other = v.clone();
    other["topk_method"] = json!("noaux_tc");
    assert!(parse(&other).unwrap_err().contains("noaux_tc"));
    for (field, bad) in [
        ("num_experts_per_tok", json!(null)),
        ("mlp_bias", json!(true)),
    ] {
        let mut b = v.clone();
        b[field] = bad;
        assert!(parse(&b).unwrap_err().contains(field), "{field}");
    }
}

/// DeepSeek-V2.5 (236B) as released: q through its LoRA, YaRN ×40, the top-6 of 160
/// softmax-scored experts inside the 3 of 8 groups with the best single expert, × 16.
#[test]
fn deepseek_v2_5_as_released() {
    let v = super::super::released_config("deepseek-v2.5.json");
    let s = parse(&v).unwrap();
    assert_eq!(
        (s.architecture, s.num_layers),
        (Architecture::DeepseekV2, 60)
    );
    let h = s.hybrid.unwrap();
    assert_eq!(h.mla.unwrap().q_lora, Some(1536));
    let m = h.moe.unwrap();
    assert_eq!((m.num_experts, m.top_k), (160, 6));
    let g = m.grouped().unwrap();
    assert_eq!((g.n_group, g.topk_group, g.scale), (8, 3, 16.0));
    assert_eq!((g.group_rank, g.renorm), (GroupRank::Best, false));
}
