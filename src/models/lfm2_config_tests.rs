use serde_json::{Value, json};

use super::super::{Architecture, Gemma4Rope, QkNorm, parse_config as parse};
use super::*;

/// Shaped as LFM2-1.2B's config.json (the fields transformers reads, and release fields it
/// ignores: `block_dim`, `conv_dim`, ...).
fn lfm2_1_2b() -> Value {
    json!({
        "architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2",
        "block_auto_adjust_ff_dim": true, "block_dim": 2048, "block_ff_dim": 12288,
        "block_ffn_dim_multiplier": 1.0, "block_multiple_of": 256, "block_norm_eps": 1e-5,
        "conv_L_cache": 3, "conv_bias": false, "conv_dim": 2048,
        "full_attn_idxs": [2, 5, 8, 10, 12, 14], "hidden_size": 2048,
        "intermediate_size": 12288, "max_position_embeddings": 128000, "norm_eps": 1e-5,
        "num_attention_heads": 32, "num_heads": 32, "num_hidden_layers": 16,
        "num_key_value_heads": 8, "rope_theta": 1000000.0, "tie_embedding": true,
        "torch_dtype": "bfloat16", "vocab_size": 65536
    })
}

/// Shaped as LFM2-8B-A1B's config.json.
fn lfm2_8b_a1b() -> Value {
    let mut kinds = vec!["conv"; 24];
    for i in [2, 6, 10, 14, 18, 21] {
        kinds[i] = "full_attention";
    }
    json!({
        "architectures": ["Lfm2MoeForCausalLM"], "model_type": "lfm2_moe",
        "conv_L_cache": 3, "conv_bias": false, "hidden_size": 2048, "intermediate_size": 7168,
        "layer_types": kinds, "max_position_embeddings": 128000, "moe_intermediate_size": 1792,
        "norm_eps": 1e-5, "norm_topk_prob": true, "num_attention_heads": 32,
        "num_dense_layers": 2, "num_experts": 32, "num_experts_per_tok": 4,
        "num_hidden_layers": 24, "num_key_value_heads": 8, "rope_theta": 1000000.0,
        "routed_scaling_factor": 1.0, "torch_dtype": "bfloat16", "use_expert_bias": true,
        "vocab_size": 65536
    })
}

fn kinds(s: &ModelSpec) -> Vec<LayerKind> {
    s.hybrid.as_ref().unwrap().layers.clone()
}

#[test]
fn lfm2_layers_mlp_width_and_convs() {
    let v = lfm2_1_2b();
    let s = parse(&v).unwrap();
    assert_eq!(s.architecture, Architecture::Lfm2);
    let attention: Vec<usize> = (0..16)
        .filter(|&i| kinds(&s)[i] == LayerKind::Attention)
        .collect();
    assert_eq!(attention, [2, 5, 8, 10, 12, 14]);
    assert!(
        kinds(&s)
            .iter()
            .all(|&k| matches!(k, LayerKind::Attention | LayerKind::ShortConv))
    );
    assert!(s.has_recurrent_layers());
    // Two thirds of 12288, times 1, rounded up to 256.
    assert_eq!(s.intermediate_size, 8192);
    assert_eq!(
        (s.head_dim, s.num_kv_heads, s.qk_norm),
        (64, 8, QkNorm::PerHead)
    );
    assert_eq!((s.rope_theta, s.rms_norm_eps), (1e6, 1e-5));
    assert!(s.tie_word_embeddings && s.hybrid.as_ref().unwrap().moe.is_none());
    let conv = Lfm2Spec {
        conv_kernel: 3,
        conv_bias: false,
        lfm3: None,
    };
    assert_eq!(s.lfm2, Some(conv));
}

/// `Lfm2MLP`'s arithmetic: `int(2 · I / 3)`, times the multiplier, rounded up to the multiple;
/// no rounding without a multiplier; none of it without the adjustment.
#[test]
fn lfm2_mlp_width_as_the_class_computes_it() {
    let width = |fields: Value| {
        let mut v = lfm2_1_2b();
        for (k, x) in fields.as_object().unwrap() {
            v[k] = x.clone();
        }
        parse(&v).map(|s| s.intermediate_size)
    };
    assert_eq!(width(json!({"block_ff_dim": 1000})).unwrap(), 768);
    assert_eq!(
        width(json!({"block_ff_dim": 1000, "block_ffn_dim_multiplier": 1.5})).unwrap(),
        1024
    );
    let null_multiplier = json!({"block_ff_dim": 1000, "block_ffn_dim_multiplier": null});
    assert_eq!(width(null_multiplier).unwrap(), 666);
    let no_adjust = json!({"block_ff_dim": 1000, "block_auto_adjust_ff_dim": false});
    assert_eq!(width(no_adjust).unwrap(), 1000);
    // `block_ff_dim` is popped into `intermediate_size`: absent, the latter is read.
    let mut v = lfm2_1_2b();
    v.as_object_mut().unwrap().remove("block_ff_dim");
    v["intermediate_size"] = json!(3000);
    assert_eq!(parse(&v).unwrap().intermediate_size, 2048);
    assert!(width(json!({"block_multiple_of": 0})).is_err());
}

/// Without `layer_types` or `full_attn_idxs` every LFM2 layer is attention (`Lfm2Config`);
/// explicit kinds win; unknown kinds, bad indices and a window of no inputs are refused;
/// `tie_embedding` wins over `tie_word_embeddings`.
#[test]
fn lfm2_defaults_and_refusals() {
    let mut v = lfm2_1_2b();
    v.as_object_mut().unwrap().remove("full_attn_idxs");
    assert!(
        kinds(&parse(&v).unwrap())
            .iter()
            .all(|&k| k == LayerKind::Attention)
    );
    v["num_hidden_layers"] = json!(3);
    v["layer_types"] = json!(["conv", "full_attention", "conv"]);
    let k = kinds(&parse(&v).unwrap());
    assert_eq!(
        k,
        [
            LayerKind::ShortConv,
            LayerKind::Attention,
            LayerKind::ShortConv
        ]
    );
    v["tie_embedding"] = json!(false);
    v["tie_word_embeddings"] = json!(true);
    assert!(!parse(&v).unwrap().tie_word_embeddings);
    for (field, bad) in [
        ("layer_types", json!(["conv", "sliding_attention", "conv"])),
        ("layer_types", json!(["conv", "conv"])),
        ("conv_L_cache", json!(1)),
    ] {
        let mut b = v.clone();
        b[field] = bad;
        assert!(parse(&b).is_err(), "{field}");
    }
    let mut b = lfm2_1_2b();
    b["full_attn_idxs"] = json!([2, 16]);
    assert!(
        parse(&b)
            .unwrap_err()
            .to_string()
            .contains("full_attn_idxs")
    );
}

#[test]
fn lfm2_moe_dense_layers_and_router() {
    let s = parse(&lfm2_8b_a1b()).unwrap();
    assert_eq!(s.architecture, Architecture::Lfm2Moe);
    assert_eq!(s.intermediate_size, 7168);
    let m = s.hybrid.as_ref().unwrap().moe.clone().unwrap();
    assert_eq!(
        (
            m.num_experts,
            m.top_k,
            m.expert_intermediate,
            m.shared_intermediate
        ),
        (32, 4, 1792, None)
    );
    assert_eq!(&m.sparse_layers[..3], [false, false, true]);
    assert!(m.sparse_layers[3..].iter().all(|&s| s));
    let router = MoeRouter::Grouped {
        n_group: 1,
        topk_group: 1,
        scale: 1.0,
        softmax: false,
        bias: true,
        renorm_eps: 1e-6,
        group_rank: GroupRank::TopTwoSum,
    };
    assert_eq!(m.router, router);
    assert!(m.norm_topk_prob && s.tie_word_embeddings);
    assert_eq!(kinds(&s)[21], LayerKind::Attention);
    // Its config class has no layer kinds of its own.
    let mut v = lfm2_8b_a1b();
    v.as_object_mut().unwrap().remove("layer_types");
    assert!(parse(&v).unwrap_err().to_string().contains("layer_types"));
    v = lfm2_8b_a1b();
    v["use_expert_bias"] = json!(false);
    v["routed_scaling_factor"] = json!(2.5);
    let m = parse(&v).unwrap().hybrid.unwrap().moe.unwrap();
    let MoeRouter::Grouped { bias, scale, .. } = m.router else {
        panic!("{:?}", m.router)
    };
    assert_eq!((bias, scale), (false, 2.5));
}

/// Shaped as LFM3-1.7B's config (`Lfm3Config`'s defaults, the fields written out).
fn lfm3_1_7b() -> Value {
    json!({
        "architectures": ["Lfm3ForCausalLM"], "model_type": "lfm3", "conv_L_cache": 7,
        "conv_bias": false, "head_dim": 128, "hidden_size": 2048, "intermediate_size": 7680,
        "max_position_embeddings": 128000, "norm_eps": 1e-5, "num_attention_heads": 16,
        "num_hidden_layers": 24, "num_key_value_heads": 4, "sliding_window": 256,
        "tie_word_embeddings": true, "torch_dtype": "bfloat16", "use_attention_gate": true,
        "use_sandwich_norm": true, "vocab_size": 128000
    })
}

#[test]
fn lfm3_kinds_windows_ropes_gate_and_sandwich() {
    let s = parse(&lfm3_1_7b()).unwrap();
    assert_eq!(s.architecture, Architecture::Lfm3);
    let k = kinds(&s);
    let (c, a) = (LayerKind::ShortConv, LayerKind::Attention);
    assert_eq!(k[..9], [c, c, a, c, a, c, a, c, a]);
    let l = s.lfm2.clone().unwrap();
    assert_eq!(l.conv_kernel, 7);
    let a3 = l.lfm3.unwrap();
    // Layer i: full where i % 4 == 2, sliding where i % 4 == 0 past layer 0.
    let sliding: Vec<usize> = (0..24).filter(|&i| a3.sliding[i]).collect();
    assert_eq!(sliding, [4, 8, 12, 16, 20]);
    assert!(!a3.sliding[0] && !a3.sliding[2]);
    assert_eq!(a3.window, 256);
    let full = Gemma4Rope::Proportional {
        theta: 1e6,
        partial: 0.5,
        factor: 1.0,
    };
    assert_eq!(a3.ropes, (Gemma4Rope::Default { theta: 1e4 }, full));
    assert!(a3.gate && a3.sandwich);
    assert_eq!(
        (s.head_dim, s.intermediate_size, s.num_kv_heads),
        (128, 7680, 4)
    );
    assert!(!s.qkv_bias && !s.o_bias && s.tie_word_embeddings);
}

/// Explicit kinds and RoPE, `rms_norm_eps` mapped onto `norm_eps`, the biases; `tie_embedding`
/// is not LFM3's; sliding kinds need a window; sliding kinds are LFM3's only.
#[test]
fn lfm3_fields_and_refusals() {
    let mut v = lfm3_1_7b();
    v["num_hidden_layers"] = json!(3);
    v["layer_types"] = json!(["conv", "sliding_attention", "full_attention"]);
    v["rope_parameters"] = json!({
        "sliding_attention": {"rope_type": "default", "rope_theta": 5e4},
        "full_attention": {"rope_type": "default", "rope_theta": 2e6}
    });
    v.as_object_mut().unwrap().remove("norm_eps");
    v["rms_norm_eps"] = json!(1e-6);
    v["attention_bias"] = json!(true);
    v["tie_embedding"] = json!(false);
    v["use_attention_gate"] = json!(false);
    let s = parse(&v).unwrap();
    let a3 = s.lfm2.clone().unwrap().lfm3.unwrap();
    assert_eq!(a3.sliding, [false, true, false]);
    let ropes = (
        Gemma4Rope::Default { theta: 5e4 },
        Gemma4Rope::Default { theta: 2e6 },
    );
    assert_eq!(a3.ropes, ropes);
    assert!(!a3.gate && a3.sandwich);
    assert_eq!(s.rms_norm_eps, 1e-6);
    assert!(s.qkv_bias && s.o_bias && s.tie_word_embeddings);
    v["sliding_window"] = json!(null);
    assert!(
        parse(&v)
            .unwrap_err()
            .to_string()
            .contains("sliding_window")
    );
    let mut lfm2 = lfm2_1_2b();
    lfm2["num_hidden_layers"] = json!(3);
    lfm2["layer_types"] = json!(["conv", "sliding_attention", "full_attention"]);
    assert!(
        parse(&lfm2)
            .unwrap_err()
            .to_string()
            .contains("layer_types")
    );
}
