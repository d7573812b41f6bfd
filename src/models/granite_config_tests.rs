use std::path::Path;

use serde_json::{Value, json};

use super::super::{Architecture, ModelSpec, RopeScaling, released_config};
use super::*;

fn parse(v: &Value) -> Result<ModelSpec, String> {
    ModelSpec::from_json(v, Path::new("config.json"), "m".into()).map_err(|e| e.to_string())
}

fn hybrid(s: &ModelSpec) -> &HybridSpec {
    s.hybrid.as_ref().unwrap()
}

/// A small consistent `GraniteMoeHybridConfig` (4 layers, 2 experts).
fn small() -> Value {
    json!({
        "architectures": ["GraniteMoeHybridForCausalLM"], "hidden_size": 64,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 512, "intermediate_size": 32, "shared_intermediate_size": 48,
        "num_local_experts": 2, "num_experts_per_tok": 1, "mamba_n_heads": 8,
        "mamba_d_state": 16, "layer_types": ["mamba", "attention", "mamba", "attention"],
        "embedding_multiplier": 12, "residual_multiplier": 0.22,
        "attention_multiplier": 0.0078125
    })
}

fn with(mut v: Value, field: &str, value: Value) -> Value {
    v[field] = value;
    v
}

#[test]
fn granite_4_h_350m_as_quoted() {
    let s = parse(&released_config("granite-4.0-h-350m.json")).unwrap();
    assert_eq!(s.architecture, Architecture::GraniteMoeHybrid);
    let dims = (s.hidden_size, s.num_heads, s.num_kv_heads, s.head_dim);
    assert_eq!(dims, (768, 12, 4, 64));
    assert_eq!((s.intermediate_size, s.vocab_size), (2048, 100_352));
    assert_eq!((s.rms_norm_eps, s.tie_word_embeddings), (1e-5, true));
    let h = hybrid(&s);
    assert_eq!((h.rotary_dim, h.moe.is_none()), (0, true));
    let attention: Vec<usize> = (0..32)
        .filter(|&i| h.layers[i] == LayerKind::Attention)
        .collect();
    assert_eq!(attention, [10, 13, 17, 27]);
    let m = h.mamba.as_ref().unwrap();
    let mamba = (
        m.num_heads,
        m.head_dim,
        m.state_size,
        m.n_groups,
        m.conv_kernel,
    );
    assert_eq!(mamba, (48, 32, 128, 1, 4));
    assert_eq!(
        (m.time_step_min, m.conv_bias, m.proj_bias),
        (0.0, true, false)
    );
    let g = s.granite.unwrap();
    assert_eq!(
        (g.embedding, g.residual, g.attention),
        (12.0, 0.246, 0.015625)
    );
    assert_eq!(g.score_factor(64), 0.125);
}

/// A config naming nothing takes every `GraniteMoeHybridConfig` default.
#[test]
fn class_defaults_fill_an_empty_config() {
    let s = parse(&json!({"architectures": ["GraniteMoeHybridForCausalLM"]})).unwrap();
    let dims = (
        s.vocab_size,
        s.hidden_size,
        s.num_layers,
        s.num_heads,
        s.num_kv_heads,
    );
    assert_eq!(dims, (32000, 4096, 32, 32, 32));
    assert_eq!((s.intermediate_size, s.rms_norm_eps), (1024, 1e-6));
    assert_eq!(
        (s.max_position_embeddings, s.tie_word_embeddings),
        (2048, false)
    );
    let h = hybrid(&s);
    assert_eq!(h.layers, vec![LayerKind::Mamba2; 32]);
    let moe = h.moe.as_ref().unwrap();
    let experts = (moe.num_experts, moe.top_k, moe.expert_intermediate);
    assert_eq!(experts, (8, 2, 11008));
    assert_eq!(
        (moe.shared_intermediate, moe.norm_topk_prob),
        (Some(1024), true)
    );
    let m = h.mamba.as_ref().unwrap();
    assert_eq!((m.num_heads, m.head_dim, m.state_size), (128, 64, 256));
    let g = s.granite.unwrap();
    assert_eq!((g.embedding, g.residual, g.attention), (1.0, 1.0, 1.0));
}

/// transformers 5's layer names and the `layers_block_type` alias read as the releases' do.
#[test]
fn layer_names_old_and_new() {
    let want = [
        LayerKind::Mamba2,
        LayerKind::Attention,
        LayerKind::Mamba2,
        LayerKind::Attention,
    ];
    let new = json!([
        "linear_attention",
        "full_attention",
        "linear_attention",
        "full_attention"
    ]);
    for v in [
        small(),
        with(small(), "layer_types", new),
        with(small(), "layer_types", Value::Null),
    ] {
        let v = match v["layer_types"].is_null() {
            true => with(
                v,
                "layers_block_type",
                json!(["mamba", "attention", "mamba", "attention"]),
            ),
            false => v,
        };
        assert_eq!(hybrid(&parse(&v).unwrap()).layers, want);
    }
}

#[test]
fn rope_only_when_named() {
    let nope = parse(&with(small(), "position_embedding_type", json!("nope"))).unwrap();
    assert_eq!(hybrid(&nope).rotary_dim, 0);
    assert_eq!(hybrid(&parse(&small()).unwrap()).rotary_dim, 0);
    let mut v = with(small(), "position_embedding_type", json!("rope"));
    v["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 1e7});
    let s = parse(&v).unwrap();
    assert_eq!((hybrid(&s).rotary_dim, s.rope_theta), (16, 1e7));
    assert_eq!(s.rope_scaling, RopeScaling::None);
}

/// Granite-4.0-Micro: every layer attention; its leftover `mamba_*` fields are checked as
/// the class checks them but make no Mamba-2 geometry.
#[test]
fn attention_only_has_no_mamba() {
    let v = with(
        small(),
        "layer_types",
        json!(["attention", "attention", "attention", "attention"]),
    );
    let v = with(v, "mamba_d_head", json!(16));
    assert!(hybrid(&parse(&v).unwrap()).mamba.is_none());
    let bad = with(v, "mamba_d_head", json!(40));
    assert!(parse(&bad).unwrap_err().contains("mamba_d_head"));
}

#[test]
fn time_step_floor_is_read() {
    let inf = json!({"__float__": "Infinity"});
    let v = with(small(), "time_step_limit", json!([0.02, inf]));
    let m = hybrid(&parse(&v).unwrap()).mamba.clone().unwrap();
    assert_eq!(m.time_step_min, 0.02);
}

/// Each refused with the field named.
#[test]
fn contradictions_are_refused_by_name() {
    let inf = json!({"__float__": "Infinity"});
    let cases = [
        ("layer_types", json!(["mamba", "mlp", "mamba", "attention"])),
        ("layer_types", json!(["mamba", "attention"])),
        ("layer_types", json!("mamba")),
        ("position_embedding_type", json!("alibi")),
        ("mamba_d_head", json!(8)),
        ("mamba_n_heads", json!(7)),
        ("mamba_n_heads", json!(0)),
        ("time_step_limit", json!([0.0, 0.1])),
        ("time_step_limit", json!([-1.0, inf])),
        ("time_step_limit", json!([0.0])),
        ("time_step_limit", Value::Null),
        ("num_experts_per_tok", json!(3)),
        ("num_experts_per_tok", json!(0)),
        ("attention_multiplier", json!(0.0)),
        ("embedding_multiplier", json!({"__float__": "Infinity"})),
        ("residual_multiplier", json!({"__float__": "NaN"})),
        ("num_attention_heads", json!(5)),
    ];
    for (field, value) in cases {
        let err = parse(&with(small(), field, value.clone())).unwrap_err();
        assert!(err.contains(field), "{field} = {value}: {err}");
    }
    let gelu = with(small(), "hidden_act", json!("gelu"));
    assert!(parse(&gelu).unwrap_err().contains("hidden_act"));
}

#[test]
fn granite_3_is_llama_with_multipliers() {
    let s = parse(&released_config("granite-3.3-8b-instruct.json")).unwrap();
    assert_eq!(s.architecture, Architecture::Granite);
    assert_eq!((s.head_dim, s.num_kv_heads, s.rope_theta), (128, 8, 1e7));
    assert_eq!((s.tie_word_embeddings, s.hybrid.is_none()), (true, true));
    let g = s.granite.unwrap();
    assert_eq!(
        (g.embedding, g.residual, g.attention),
        (12.0, 0.22, 0.0078125)
    );
    let bad = |f: &str, v: Value| {
        let mut c = released_config("granite-3.3-8b-instruct.json");
        c[f] = v;
        parse(&c).unwrap_err()
    };
    assert!(bad("attention_multiplier", json!(-1.0)).contains("attention_multiplier"));
    assert!(bad("residual_multiplier", json!("x")).contains("residual_multiplier"));
}

/// HyperCLOVAXConfig: Granite's fields, the attention's head_dim^-½ where the multiplier is
/// absent or null, Peri-LN's output norms unless `use_post_norm` is false.
#[test]
fn hyperclovax_defaults_the_attention_scale_and_post_norms() {
    let v = json!({"architectures": ["HyperCLOVAXForCausalLM"], "hidden_size": 256,
        "intermediate_size": 512, "num_attention_heads": 4, "num_hidden_layers": 2,
        "vocab_size": 100, "embedding_multiplier": 2.0, "attention_multiplier": null});
    let s = parse(&v).unwrap();
    assert_eq!(s.architecture, Architecture::HyperClovaX);
    let g = s.granite.unwrap();
    assert_eq!(
        (g.embedding, g.residual, g.attention, g.post_norms),
        (2.0, 1.0, 0.125, true)
    );
    assert_eq!(g.score_factor(s.head_dim), 1.0);
    let s = parse(&with(v, "use_post_norm", json!(false))).unwrap();
    assert!(!s.granite.unwrap().post_norms);
}

/// GraniteSWAConfig: tied, eps 1e-5, every 4th layer from layer 0 full, window 128, the one
/// theta per layer unless `layer_rope_theta` (0: NoPE) says otherwise.
#[test]
fn granite_swa_windows_and_layer_thetas() {
    let mut v = json!({"architectures": ["GraniteSWAForCausalLM"], "hidden_size": 256,
        "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 5, "vocab_size": 100, "rope_theta": 10000.0});
    let s = parse(&v).unwrap();
    assert_eq!(s.architecture, Architecture::GraniteSwa);
    assert_eq!(
        (s.tie_word_embeddings, s.rms_norm_eps, s.head_dim),
        (true, 1e-5, 64)
    );
    let w = s.windows.as_ref().unwrap();
    assert_eq!(
        (w.window, w.sliding.clone()),
        (128, vec![false, true, true, true, false])
    );
    assert_eq!(s.layer_thetas.unwrap(), vec![1e4; 5]);
    assert_eq!(s.nope_layers.unwrap(), vec![false; 5]);
    v["layer_rope_theta"] = json!([1e4, 0, 5e5, 1e4, 0.0]);
    let s = parse(&v).unwrap();
    assert_eq!(s.layer_thetas.unwrap(), [1e4, 0.0, 5e5, 1e4, 0.0]);
    assert_eq!(s.nope_layers.unwrap(), [false, true, false, false, true]);
    for bad in [json!([1e4]), json!([1e4, -1, 1e4, 1e4, 1e4]), json!("x")] {
        v["layer_rope_theta"] = bad;
        assert!(parse(&v).unwrap_err().contains("layer_rope_theta"));
    }
}

#[test]
fn bamba_takes_its_class_defaults() {
    let s = parse(&released_config("bamba-9b.json")).unwrap();
    assert_eq!(s.architecture, Architecture::Bamba);
    let dims = (s.vocab_size, s.num_heads, s.num_kv_heads, s.head_dim);
    assert_eq!(dims, (128_000, 32, 8, 128));
    assert_eq!((s.intermediate_size, s.rms_norm_eps), (14336, 1e-5));
    assert_eq!((s.max_position_embeddings, s.granite), (262_144, None));
    let h = hybrid(&s);
    // Half of each head rotated, whatever the config's own factor.
    assert_eq!((h.rotary_dim, h.moe.is_none()), (64, true));
    let attention: Vec<usize> = (0..32)
        .filter(|&i| h.layers[i] == LayerKind::Attention)
        .collect();
    assert_eq!(attention, [9, 18, 27]);
    let m = h.mamba.as_ref().unwrap();
    assert_eq!((m.num_heads, m.head_dim, m.state_size), (128, 64, 128));
    let mut v = released_config("bamba-9b.json");
    v["attn_layer_indices"] = json!([9, 32]);
    assert!(parse(&v).unwrap_err().contains("attn_layer_indices"));
    v["attn_layer_indices"] = json!("9");
    assert!(parse(&v).unwrap_err().contains("attn_layer_indices"));
    v["attn_layer_indices"] = json!([]);
    assert_eq!(
        hybrid(&parse(&v).unwrap()).layers,
        vec![LayerKind::Mamba2; 32]
    );
}

/// Shaped as granite-3.1-3b-a800m-instruct's config.json: RoPE attention and 40 experts top-8
/// in every layer, no shared MLP; the shared class with one where its width is above 0.
#[test]
fn granite_moe_experts_and_shared_mlp() {
    let mut v = json!({
        "architectures": ["GraniteMoeForCausalLM"], "model_type": "granitemoe",
        "hidden_act": "silu", "hidden_size": 1536, "intermediate_size": 512,
        "num_attention_heads": 24, "num_key_value_heads": 8, "num_hidden_layers": 32,
        "num_local_experts": 40, "num_experts_per_tok": 8, "embedding_multiplier": 12.0,
        "residual_multiplier": 0.22, "attention_multiplier": 0.015625, "logits_scaling": 6.0,
        "rope_theta": 10000000.0, "max_position_embeddings": 131072,
        "tie_word_embeddings": true, "torch_dtype": "bfloat16", "vocab_size": 49155
    });
    let s = super::super::parse_config(&v).unwrap();
    assert_eq!(s.architecture, Architecture::GraniteMoe);
    let h = s.hybrid.as_ref().unwrap();
    assert!(h.layers.iter().all(|&k| k == LayerKind::Attention) && h.rotary_dim == 64);
    let m = h.moe.as_ref().unwrap();
    assert_eq!(
        (
            m.num_experts,
            m.top_k,
            m.expert_intermediate,
            m.shared_intermediate
        ),
        (40, 8, 512, None)
    );
    assert_eq!(s.granite.unwrap().embedding, 12.0);
    v["architectures"] = json!(["GraniteMoeSharedForCausalLM"]);
    v["shared_intermediate_size"] = json!(1024);
    let s = super::super::parse_config(&v).unwrap();
    let m = s.hybrid.as_ref().unwrap().moe.as_ref().unwrap();
    assert_eq!(
        (m.shared_intermediate, s.intermediate_size),
        (Some(1024), 1024)
    );
    v["num_local_experts"] = json!(0);
    let err = super::super::parse_config(&v).unwrap_err();
    assert!(err.to_string().contains("num_local_experts"), "{err}");
}

/// GraniteMoeSWAConfig: GraniteMoeShared's experts and shared MLP with Granite SWA's layers
/// (every 4th from layer 0 full, window 128, a theta per layer), GraniteMoeShared's defaults
/// otherwise (untied, eps 1e-6).
#[test]
fn granite_moe_swa_experts_behind_sliding_layers() {
    let mut v = json!({
        "architectures": ["GraniteMoeSWAForCausalLM"], "hidden_size": 256,
        "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 5, "num_local_experts": 8, "num_experts_per_tok": 2,
        "shared_intermediate_size": 128, "vocab_size": 100, "rope_theta": 10000.0
    });
    let s = parse(&v).unwrap();
    assert_eq!(s.architecture, Architecture::GraniteMoeSwa);
    assert_eq!((s.tie_word_embeddings, s.rms_norm_eps), (false, 1e-6));
    let m = hybrid(&s).moe.as_ref().unwrap();
    assert_eq!(
        (m.num_experts, m.top_k, m.shared_intermediate),
        (8, 2, Some(128))
    );
    let w = s.windows.as_ref().unwrap();
    assert_eq!(
        (w.window, w.sliding.clone()),
        (128, vec![false, true, true, true, false])
    );
    assert_eq!(s.layer_thetas.as_ref().unwrap(), &vec![1e4; 5]);
    v["layer_rope_theta"] = json!([1e4, 5e5, 0, 1e4, 1e4]);
    let s = parse(&v).unwrap();
    assert_eq!(s.nope_layers.unwrap(), [false, false, true, false, false]);
}
