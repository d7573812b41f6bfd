use std::path::Path;

use serde_json::{Value, json};

use super::super::{Architecture, ModelSpec, released_config};
use super::*;

fn parse(v: &Value) -> Result<ModelSpec, String> {
    ModelSpec::from_json(v, Path::new("config.json"), "m".into()).map_err(|e| e.to_string())
}

fn gemma3(s: &ModelSpec) -> &Gemma3Spec {
    s.gemma3.as_ref().unwrap()
}

/// Full attention every 6th layer (transformers' `sliding_window_pattern` default).
fn every_sixth_full(layers: usize) -> Vec<bool> {
    (0..layers).map(|i| (i + 1) % 6 != 0).collect()
}

#[test]
fn gemma_3_1b_as_released() {
    let s = parse(&released_config("gemma-3-1b-it.json")).unwrap();
    assert_eq!(s.architecture, Architecture::Gemma3);
    let dims = (
        s.hidden_size,
        s.num_layers,
        s.num_heads,
        s.num_kv_heads,
        s.head_dim,
    );
    assert_eq!(dims, (1152, 26, 4, 1, 256));
    assert_eq!((s.intermediate_size, s.vocab_size), (6912, 262_144));
    assert_eq!((s.rope_theta, s.rope_scaling), (1e6, RopeScaling::None));
    assert_eq!((s.qk_norm, s.tie_word_embeddings), (QkNorm::PerHead, true));
    assert_eq!((s.qkv_bias, s.o_bias, s.mlp_bias), (false, false, false));
    assert_eq!((s.dtype, s.sliding_window), (WeightDtype::Bf16, None));
    let g = gemma3(&s);
    assert_eq!(g.sliding, every_sixth_full(26));
    assert_eq!((g.window, g.local_rope), (512, (1e4, RopeScaling::None)));
    assert_eq!(g.score_factor, 1.0);
}

/// The released multimodal configs write a sparse text config: the rest is the class's.
#[test]
fn gemma_3_4b_and_27b_exports_fill_the_class_defaults() {
    let s = parse(&released_config("gemma-3-4b-it.json")).unwrap();
    assert_eq!(s.architecture, Architecture::Gemma3);
    let dims = (
        s.hidden_size,
        s.num_layers,
        s.num_heads,
        s.num_kv_heads,
        s.head_dim,
    );
    assert_eq!(dims, (2560, 34, 8, 4, 256));
    assert_eq!(
        (s.vocab_size, s.max_position_embeddings),
        (262_208, 131_072)
    );
    assert_eq!(s.rope_theta, 1e6);
    assert_eq!(s.rope_scaling, RopeScaling::Linear { factor: 8.0 });
    assert_eq!((s.rms_norm_eps, s.dtype), (1e-6, WeightDtype::Bf16));
    // Gemma3Config ties by default; the release names no tie.
    assert!(s.tie_word_embeddings);
    let g = gemma3(&s);
    assert_eq!(g.sliding, every_sixth_full(34));
    assert_eq!((g.window, g.local_rope), (1024, (1e4, RopeScaling::None)));

    let s = parse(&released_config("gemma-3-27b-it.json")).unwrap();
    let dims = (
        s.hidden_size,
        s.num_layers,
        s.num_heads,
        s.num_kv_heads,
        s.head_dim,
    );
    assert_eq!(dims, (5376, 62, 32, 16, 128));
    // Scores scaled by 168^-½, not head_dim^-½.
    let scale = (s.head_dim as f64).powf(-0.5) * gemma3(&s).score_factor;
    assert!((scale - 168f64.powf(-0.5)).abs() < 1e-15, "{scale}");
}

/// transformers 5 saves `layer_types` and `rope_parameters` per layer type.
#[test]
fn transformers_5_fields() {
    let cfg = json!({
        "architectures": ["Gemma3ForCausalLM"],
        "num_hidden_layers": 3,
        "layer_types": ["full_attention", "sliding_attention", "full_attention"],
        "sliding_window_pattern": 2,
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 5e5},
            "sliding_attention": {"rope_type": "default", "rope_theta": 2e4},
        },
    });
    let s = parse(&cfg).unwrap();
    assert_eq!(
        (s.rope_theta, s.rope_scaling),
        (5e5, RopeScaling::Linear { factor: 4.0 })
    );
    let g = gemma3(&s);
    // `layer_types` wins over the older pattern.
    assert_eq!(g.sliding, [false, true, false]);
    assert_eq!(g.local_rope, (2e4, RopeScaling::None));
    // A layer type's missing entry: its default RoPE at the top-level or class theta.
    let mut cfg = cfg;
    cfg["rope_parameters"] = json!({"full_attention": {"rope_type": "default"}});
    let s = parse(&cfg).unwrap();
    assert_eq!((s.rope_theta, gemma3(&s).local_rope.0), (1e6, 1e4));
}

#[test]
fn export_tie_follows_the_top_level_else_the_class() {
    let mut cfg = released_config("gemma-3-4b-it.json");
    cfg["tie_word_embeddings"] = json!(false);
    assert!(!parse(&cfg).unwrap().tie_word_embeddings);
    // The text config's own flag is not the export's.
    let mut cfg = released_config("gemma-3-4b-it.json");
    cfg["text_config"]["tie_word_embeddings"] = json!(false);
    assert!(parse(&cfg).unwrap().tie_word_embeddings);
}

#[test]
fn what_hsx_does_not_run_is_refused_by_name() {
    let base = released_config("gemma-3-1b-it.json");
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "attn_logit_softcapping",
            json!(0.0),
            "attn_logit_softcapping",
        ),
        (
            "attn_logit_softcapping",
            json!("50"),
            "attn_logit_softcapping",
        ),
        ("use_bidirectional_attention", json!(true), "bidirectional"),
        (
            "hidden_activation",
            json!("gelu"),
            "hidden_activation `gelu`",
        ),
        ("hidden_activation", json!(3), "hidden_activation"),
        ("sliding_window", json!(0), "sliding_window"),
        ("sliding_window_pattern", json!(0), "sliding_window_pattern"),
        ("query_pre_attn_scalar", json!(0), "query_pre_attn_scalar"),
        (
            "query_pre_attn_scalar",
            json!(-4.0),
            "query_pre_attn_scalar",
        ),
        ("layer_types", json!(["full_attention"]), "26 layer types"),
        (
            "layer_types",
            json!(vec!["chunked_attention"; 26]),
            "chunked_attention",
        ),
        (
            "rope_scaling",
            json!({"rope_type": "dynamic", "factor": 2.0}),
            "`dynamic`",
        ),
        (
            "rope_scaling",
            json!({"rope_type": "linear"}),
            "rope_scaling.factor",
        ),
        (
            "rope_scaling",
            json!({"rope_type": "linear", "factor": 0}),
            "rope_scaling.factor",
        ),
        (
            "rope_parameters",
            json!({"rope_type": "default"}),
            "full_attention",
        ),
        ("rope_parameters", json!([1]), "rope_parameters"),
        (
            "rope_parameters",
            json!({"sliding_attention": {"rope_type": "yarn"}}),
            "rope_parameters.sliding_attention",
        ),
        ("num_hidden_layers", json!(1u64 << 20), "num_hidden_layers"),
    ];
    for (field, v, want) in cases {
        let mut cfg = base.clone();
        cfg[field] = v;
        let err = parse(&cfg).unwrap_err();
        assert!(err.contains(want), "{field}: {err}");
    }
    // final_logit_softcapping shapes the logits only (not the hidden states; the argmax
    // keeps its order): accepted. So is a `hidden_act`, which the class ignores.
    let mut cfg = base;
    cfg["final_logit_softcapping"] = json!(30.0);
    cfg["hidden_act"] = json!("silu");
    assert!(parse(&cfg).is_ok());
    // Gemma3TextConfig's soft cap (None by default) caps the scores as Gemma-2's does.
    cfg["attn_logit_softcapping"] = json!(30.0);
    assert_eq!(gemma3(&parse(&cfg).unwrap()).softcap, Some(30.0));
}

/// Every second layer full from layer 1, one RoPE, no q/k norms, scores capped at 50; the
/// 27B's heads of 128 scaled by 144^-½.
#[test]
fn gemma_2_9b_and_27b_as_released() {
    let alternating = |n: usize| (0..n).map(|i| i % 2 == 0).collect::<Vec<_>>();
    for (file, layers, head_dim, factor) in [
        ("gemma-2-9b.json", 42, 256, 1.0),
        ("gemma-2-27b.json", 46, 128, (128.0f64 / 144.0).sqrt()),
    ] {
        let s = parse(&released_config(file)).unwrap();
        assert_eq!(s.architecture, Architecture::Gemma2, "{file}");
        assert_eq!(
            (s.num_layers, s.head_dim, s.vocab_size),
            (layers, head_dim, 256_000)
        );
        assert_eq!((s.qk_norm, s.tie_word_embeddings), (QkNorm::None, true));
        assert_eq!((s.rope_theta, s.rope_scaling), (1e4, RopeScaling::None));
        let g = gemma3(&s);
        assert_eq!(g.sliding, alternating(layers), "{file}");
        assert_eq!((g.window, g.local_rope), (4096, (1e4, RopeScaling::None)));
        assert_eq!((g.score_factor, g.softcap), (factor, Some(50.0)), "{file}");
    }
}

/// A config naming nothing takes Gemma2Config's defaults; a null cap is none.
#[test]
fn gemma_2_class_defaults_and_a_null_cap() {
    let mut cfg = json!({"architectures": ["Gemma2ForCausalLM"]});
    let s = parse(&cfg).unwrap();
    assert_eq!((s.num_layers, s.hidden_size, s.head_dim), (26, 2304, 256));
    assert_eq!((s.vocab_size, s.max_position_embeddings), (256_000, 8192));
    let g = gemma3(&s);
    assert_eq!(g.sliding, (0..26).map(|i| i % 2 == 0).collect::<Vec<_>>());
    assert_eq!((g.window, g.softcap), (4096, Some(50.0)));
    // Gemma-3's older pattern field is not Gemma-2's.
    cfg["sliding_window_pattern"] = json!(6);
    assert_eq!(gemma3(&parse(&cfg).unwrap()).sliding, g.sliding);
    cfg["attn_logit_softcapping"] = Value::Null;
    assert_eq!(gemma3(&parse(&cfg).unwrap()).softcap, None);
}

/// VaultGemma takes Gemma2Config's defaults (alternating windows, the cap of 50) and drops the
/// sandwich: each sublayer's input normed only.
#[test]
fn vaultgemma_is_gemma_2_without_post_norms() {
    let s = parse(&json!({"architectures": ["VaultGemmaForCausalLM"]})).unwrap();
    assert_eq!(s.architecture, Architecture::VaultGemma);
    assert_eq!(
        (s.num_layers, s.hidden_size, s.vocab_size),
        (26, 2304, 256_000)
    );
    let g = gemma3(&s);
    assert_eq!(g.sliding, (0..26).map(|i| i % 2 == 0).collect::<Vec<_>>());
    assert_eq!((g.window, g.softcap, g.sandwich), (4096, Some(50.0), false));
}

/// Shaped as gemma-7b's config: every layer full, scores × head_dim^-½, no sandwich, no cap,
/// the legacy `hidden_act` `gelu` read as the tanh approximation; another activation refused.
#[test]
fn gemma_1_reads_its_own_fields() {
    let mut cfg = json!({
        "architectures": ["GemmaForCausalLM"], "model_type": "gemma", "head_dim": 256,
        "hidden_act": "gelu", "hidden_size": 3072, "intermediate_size": 24576,
        "max_position_embeddings": 8192, "num_attention_heads": 16, "num_hidden_layers": 28,
        "num_key_value_heads": 16, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "vocab_size": 256000, "sliding_window": 0, "query_pre_attn_scalar": 0,
        "attn_logit_softcapping": 50.0
    });
    let s = parse(&cfg).unwrap();
    assert_eq!(s.architecture, Architecture::Gemma);
    assert_eq!(
        (s.qk_norm, s.num_kv_heads, s.vocab_size),
        (QkNorm::None, 16, 256_000)
    );
    let g = gemma3(&s);
    assert_eq!(g.sliding, vec![false; 28]);
    assert_eq!((g.score_factor, g.softcap, g.sandwich), (1.0, None, false));
    cfg["hidden_act"] = json!("silu");
    assert!(parse(&cfg).unwrap_err().contains("hidden_act `silu`"));
    // GemmaConfig's defaults where the config names nothing.
    let s = parse(&json!({"architectures": ["GemmaForCausalLM"]})).unwrap();
    assert_eq!((s.hidden_size, s.num_layers, s.num_heads), (3072, 28, 16));
}
