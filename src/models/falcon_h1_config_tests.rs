use std::path::Path;

use serde_json::{Value, json};

use super::super::{Architecture, ModelSpec};
use super::*;

fn parse(v: &Value) -> Result<ModelSpec, String> {
    ModelSpec::from_json(v, Path::new("config.json"), "m".into()).map_err(|e| e.to_string())
}

/// The fields of Megatron-Bridge's Falcon-H1-0.5B test config (its `FALCON_H1_500M_CONFIG`:
/// µP multipliers as released, Mamba-2 without its norm), `mamba_d_ssm` added (that quote
/// lacks it; 24 heads × 64 is 1536) and 4 layers.
fn half_b() -> Value {
    json!({
        "architectures": ["FalconH1ForCausalLM"], "model_type": "falcon_h1",
        "attention_bias": false, "attention_in_multiplier": 1.0,
        "attention_out_multiplier": 0.9375, "embedding_multiplier": 5.656854249492381,
        "head_dim": 64, "hidden_act": "silu", "hidden_size": 1024, "intermediate_size": 2048,
        "key_multiplier": 0.39062499999999994, "lm_head_multiplier": 0.0390625,
        "mamba_chunk_size": 128, "mamba_conv_bias": true, "mamba_d_conv": 4,
        "mamba_d_head": 64, "mamba_d_ssm": 1536, "mamba_d_state": 128, "mamba_expand": 2,
        "mamba_n_groups": 1, "mamba_n_heads": 24, "mamba_norm_before_gate": false,
        "mamba_proj_bias": false, "mamba_rms_norm": false, "max_position_embeddings": 16384,
        "mlp_bias": false, "mlp_multipliers": [0.8838834764831844, 0.5859375],
        "num_attention_heads": 8, "num_hidden_layers": 4, "num_key_value_heads": 2,
        "projectors_bias": false, "rms_norm_eps": 1e-5, "rope_scaling": null,
        "rope_theta": 100000000000.0, "ssm_in_multiplier": 1.25,
        "ssm_multipliers": [0.3535533905932738, 0.25, 0.3535533905932738, 0.5, 0.3535533905932738],
        "ssm_out_multiplier": 0.23570226039551587, "tie_word_embeddings": false,
        "torch_dtype": "bfloat16", "vocab_size": 32784
    })
}

fn with(mut v: Value, field: &str, value: Value) -> Value {
    v[field] = value;
    v
}

#[test]
fn the_half_b_config_is_read() {
    let s = parse(&half_b()).unwrap();
    assert_eq!(s.architecture, Architecture::FalconH1);
    let dims = (s.hidden_size, s.num_heads, s.num_kv_heads, s.head_dim);
    assert_eq!(dims, (1024, 8, 2, 64));
    assert_eq!(
        (s.intermediate_size, s.vocab_size, s.rope_theta),
        (2048, 32784, 1e11)
    );
    let h = s.hybrid.as_ref().unwrap();
    assert_eq!(h.layers, vec![LayerKind::MambaAttention; 4]);
    assert_eq!(h.rotary_dim, 64);
    let m = h.mamba.as_ref().unwrap();
    let geometry = (
        m.num_heads,
        m.head_dim,
        m.state_size,
        m.n_groups,
        m.conv_kernel,
    );
    assert_eq!(geometry, (24, 64, 128, 1, 4));
    assert_eq!(
        (m.norm, m.conv_bias, m.proj_bias),
        (MambaNorm::None, true, false)
    );
    let f = s.falcon_h1.clone().unwrap();
    assert_eq!(
        (f.embedding, f.key, f.ssm_in),
        (5.656854249492381f64 as f32, 0.39062499999999994, 1.25)
    );
    assert_eq!((f.mlp_gate, f.mlp_down), (0.8838834764831844, 0.5859375));
    assert_eq!(f.ssm[3], 0.5);
    assert!(s.has_recurrent_layers());
}

#[test]
fn the_class_defaults_apply() {
    let v = json!({"architectures": ["FalconH1ForCausalLM"], "num_hidden_layers": 2});
    let s = parse(&v).unwrap();
    assert_eq!(
        (s.hidden_size, s.num_heads, s.num_kv_heads, s.head_dim),
        (4096, 32, 8, 128)
    );
    let m = s.hybrid.as_ref().unwrap().mamba.clone().unwrap();
    // mamba_d_ssm's default 1024 over 128 heads.
    assert_eq!((m.num_heads, m.head_dim, m.norm), (128, 8, MambaNorm::None));
    let f = s.falcon_h1.clone().unwrap();
    assert_eq!((f.ssm, f.mlp_gate, f.embedding), ([1.0; 5], 1.0, 1.0));
    assert_eq!((s.rms_norm_eps, s.max_position_embeddings), (1e-5, 8192));
    // A null `mamba_d_ssm` is `mamba_expand · hidden_size`; null kv heads are the heads.
    let v = json!({"architectures": ["FalconH1ForCausalLM"], "hidden_size": 256,
        "num_attention_heads": 4, "num_key_value_heads": null, "mamba_d_ssm": null,
        "mamba_n_heads": 8, "num_hidden_layers": 2});
    let s = parse(&v).unwrap();
    let m = s.hybrid.as_ref().unwrap().mamba.clone().unwrap();
    assert_eq!((m.head_dim, s.num_kv_heads), (64, 4));
}

#[test]
fn the_norm_sits_where_the_flags_say() {
    let norm = |rms, before| {
        let v = with(half_b(), "mamba_rms_norm", json!(rms));
        let v = with(v, "mamba_norm_before_gate", json!(before));
        parse(&v).unwrap().hybrid.unwrap().mamba.unwrap().norm
    };
    assert_eq!(norm(false, true), MambaNorm::None);
    assert_eq!(norm(true, false), MambaNorm::AfterGate);
    assert_eq!(norm(true, true), MambaNorm::BeforeGate);
    // `mamba_norm_before_gate` defaults to true.
    let mut v = with(half_b(), "mamba_rms_norm", json!(true));
    v.as_object_mut().unwrap().remove("mamba_norm_before_gate");
    assert_eq!(
        parse(&v).unwrap().hybrid.unwrap().mamba.unwrap().norm,
        MambaNorm::BeforeGate
    );
}

/// Each refused with the field named.
#[test]
fn contradictions_are_refused_by_name() {
    let nan = json!({"__float__": "NaN"});
    let cases = [
        ("mamba_d_ssm", json!(1000)),
        ("mamba_d_head", json!(32)),
        ("mamba_n_heads", json!(0)),
        ("time_step_limit", json!([0.0, 0.1])),
        ("mlp_multipliers", json!([1.0])),
        ("mlp_multipliers", json!("1.0")),
        ("ssm_multipliers", json!([1.0, 1.0, 1.0, 1.0, nan])),
        ("key_multiplier", json!({"__float__": "Infinity"})),
        ("lm_head_multiplier", json!(0.0)),
        ("lm_head_multiplier", json!(-1.0)),
        ("embedding_multiplier", nan.clone()),
        ("num_attention_heads", json!(0)),
    ];
    for (field, value) in cases {
        let err = parse(&with(half_b(), field, value.clone())).unwrap_err();
        assert!(err.contains(field), "{field} = {value}: {err}");
    }
    let gelu = with(half_b(), "hidden_act", json!("gelu"));
    assert!(parse(&gelu).unwrap_err().contains("hidden_act"));
}
