//! What Mistral's 2025–26 text classes add to the configs they share with Mistral and
//! DeepSeek-V3: `Ministral3ForCausalLM` (Ministral 3, Devstral 2, Devstral Small 2: Mistral's
//! layers) and `Mistral4ForCausalLM` (Mistral Small 4: DeepSeek-V3's latent attention). Both
//! scale every attention layer's query by its position past the original context
//! (`rope_parameters.llama_4_scaling_beta`, transformers' `get_llama_4_attn_scale`) and default
//! to a YaRN RoPE carrying it when the config names none — the class-RoPE defaults, which
//! Code World Model's and Apertus' llama3 ones share ([`with_class_rope`]).

use std::borrow::Cow;

use serde_json::{Value, json};

use super::config::{Architecture, Cfg};
use super::{ModelError, ModelSpec, pyjson};
use crate::kernels::device::QueryTemperature;

/// The classes' `rope_parameters` where a config has neither it nor `rope_scaling`
/// (`Ministral3Config` / `Mistral4Config.__post_init__`; Mistral 4's also names
/// `partial_rotary_factor`, which `deepseek_config` reads from the heads). `CwmConfig` and
/// `ApertusConfig` default to llama3 ones the same way (a top-level `rope_theta` alone does not
/// replace them there either: transformers 5.24, checked).
fn class_rope(arch: Architecture) -> Option<Value> {
    let llama3 = |theta: f64, factor: f64| {
        json!({"rope_type": "llama3", "rope_theta": theta, "factor": factor,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192})
    };
    let (theta, factor, original) = match arch {
        Architecture::Ministral3 => (1e6, 16.0, 16384),
        Architecture::Mistral4 => (10000.0, 128.0, 8192),
        Architecture::Cwm => return Some(llama3(1e6, 16.0)),
        Architecture::Apertus => return Some(llama3(1.2e7, 8.0)),
        _ => return None,
    };
    Some(json!({
        "rope_type": "yarn", "rope_theta": theta, "factor": factor,
        "original_max_position_embeddings": original, "beta_fast": 32.0, "beta_slow": 1.0,
        "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1
    }))
}

/// `value` with its class's RoPE filled in where it names none (Ministral 3, Mistral 4, Code
/// World Model, Apertus).
pub(super) fn with_class_rope(value: Cow<'_, Value>, arch: Architecture) -> Cow<'_, Value> {
    let has = |k: &str| value.get(k).is_some_and(|v| !v.is_null());
    match class_rope(arch) {
        Some(rope) if !has("rope_parameters") && !has("rope_scaling") => {
            let mut v = value.into_owned();
            v["rope_parameters"] = rope;
            Cow::Owned(v)
        }
        _ => value,
    }
}

/// Ministral 3's and Mistral 4's query scale `1 + β · ln(1 + ⌊p / original⌋)` (β
/// `llama_4_scaling_beta`, `original` the RoPE's `original_max_position_embeddings`; exactly 1
/// below it); `None` for other architectures and for β = 0. transformers fails without either
/// field (`None` in arithmetic): refused, by name.
pub(super) fn query_temperature(
    cfg: &Cfg<'_>,
    arch: Architecture,
) -> Result<Option<QueryTemperature>, ModelError> {
    if !matches!(arch, Architecture::Ministral3 | Architecture::Mistral4) {
        return Ok(None);
    }
    let (field, params) = cfg.rope_object().unwrap_or(("rope_scaling", &Value::Null));
    let num = |k: &str| {
        let v = params.get(k).filter(|v| !v.is_null());
        let x = v.and_then(pyjson::value_f64);
        x.ok_or_else(|| {
            let why = format!(
                "{} ({} scales each query by its position with it)",
                if v.is_some() {
                    "expected a number"
                } else {
                    "missing"
                },
                arch.hf_name()
            );
            cfg.err(&format!("{field}.{k}"), why)
        })
    };
    let beta = num("llama_4_scaling_beta")?;
    let original = num("original_max_position_embeddings")?;
    if !(beta.is_finite() && original >= 1.0 && original.is_finite()) {
        let msg = format!("β {beta} over {original} positions (finite, at least 1 position)");
        return Err(cfg.err(&format!("{field}.llama_4_scaling_beta"), msg));
    }
    Ok((beta != 0.0).then_some(QueryTemperature {
        floor_scale: original as f32,
        attn_scale: beta as f32,
        offset: 0.0,
    }))
}

/// `MinistralForCausalLM`'s config (`MinistralConfig`): Mistral's fields with per-layer
/// windows — `layer_types`, else every layer sliding where `sliding_window` (4096) is not
/// null — one RoPE for both kinds. Its projections have no biases, whatever the config says
/// (as Mistral's).
pub(super) fn parse_ministral(cfg: &Cfg<'_>, name: String) -> Result<ModelSpec, ModelError> {
    let mut spec = super::dense_config::dense_spec(cfg, Architecture::Ministral, name)?;
    let all_sliding = !cfg.is_null("sliding_window");
    let rope = (spec.rope_theta, spec.rope_scaling);
    let sliding = vec![all_sliding; spec.num_layers];
    spec.windows = Some(super::olmo_config::layer_windows(cfg, sliding, 4096, rope)?);
    (spec.qkv_bias, spec.o_bias, spec.mlp_bias) = (false, false, false);
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::{Value, json};

    use super::super::hybrid_config::{DEFAULT_RENORM_EPS, GroupRank, MoeRouter};
    use super::super::{Architecture, ModelSpec, RopeScaling};
    use crate::kernels::device::QueryTemperature;

    fn parse(v: &Value) -> Result<ModelSpec, String> {
        ModelSpec::from_json(v, Path::new("config.json"), "m".into()).map_err(|e| e.to_string())
    }

    /// Devstral Small 2's text config as its export nests it (`ministral3` under
    /// `Mistral3ForConditionalGeneration`): YaRN over 8192 positions, β 0.1.
    fn devstral_small_2() -> Value {
        json!({
            "architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
            "text_config": {
                "model_type": "ministral3", "head_dim": 128, "hidden_size": 5120,
                "intermediate_size": 32768, "num_attention_heads": 32,
                "num_key_value_heads": 8, "num_hidden_layers": 40, "vocab_size": 131072,
                "max_position_embeddings": 393216, "rms_norm_eps": 1e-5,
                "sliding_window": null,
                "rope_parameters": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 48.0,
                    "llama_4_scaling_beta": 0.1, "mscale": 1.0, "mscale_all_dim": 1.0,
                    "original_max_position_embeddings": 8192, "rope_theta": 100000000.0,
                    "rope_type": "yarn", "type": "yarn"}
            },
            "vision_config": {"model_type": "pixtral"}, "torch_dtype": "bfloat16"
        })
    }

    #[test]
    fn ministral3_export_scales_queries_past_its_original_context() {
        let s = parse(&devstral_small_2()).unwrap();
        assert_eq!(s.architecture, Architecture::Ministral3);
        assert_eq!((s.num_layers, s.head_dim, s.num_kv_heads), (40, 128, 8));
        assert_eq!(s.rope_theta, 1e8);
        let RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            attention_factor,
            ..
        } = s.rope_scaling
        else {
            panic!("{:?}", s.rope_scaling)
        };
        // mscale / mscale_all_dim both 1: cos and sin unscaled.
        let yarn = (factor, original_max_position_embeddings, attention_factor);
        assert_eq!(yarn, (48.0, 8192.0, 1.0));
        let t = s.query_temperature.unwrap();
        let want = QueryTemperature {
            floor_scale: 8192.0,
            attn_scale: 0.1,
            offset: 0.0,
        };
        assert_eq!(t, want);
        // 1 up to position 8191, then 1 + 0.1 ln 2, 1 + 0.1 ln 3 (transformers' values, f32).
        assert_eq!((t.factor(0), t.factor(8191)), (1.0, 1.0));
        assert_eq!(t.factor(8192), 1.0 + 0.1 * 2f32.ln());
        assert_eq!(t.factor(16384), 1.0 + 0.1 * 3f32.ln());
        assert_eq!(s.sliding_window, None);
    }

    /// A Mistral text config under the same export keeps Mistral's layers (MistralConfig has no
    /// query scale, whatever its RoPE parameters carry); an unknown text class is refused.
    #[test]
    fn mistral3_exports_take_their_text_class() {
        let mut v = devstral_small_2();
        v["text_config"]["model_type"] = json!("mistral");
        let s = parse(&v).unwrap();
        assert_eq!(s.architecture, Architecture::Mistral);
        assert_eq!(s.query_temperature, None);
        v["text_config"]["model_type"] = json!("pixtral_text");
        let err = parse(&v).unwrap_err();
        assert!(err.contains("pixtral_text"), "{err}");
    }

    /// Without RoPE parameters the class's own (YaRN ×16 over 16384, θ 1e6, β 0.1); β and the
    /// original context are required where they are given; β 0 scales nothing.
    #[test]
    fn ministral3_defaults_and_refusals() {
        let mut v = json!({"architectures": ["Ministral3ForCausalLM"], "hidden_size": 64,
            "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 256,
            "intermediate_size": 128});
        let s = parse(&v).unwrap();
        assert_eq!((s.rope_theta, s.rms_norm_eps), (1e6, 1e-5));
        assert!(matches!(
            s.rope_scaling,
            RopeScaling::Yarn { factor: 16.0, .. }
        ));
        assert_eq!(s.query_temperature.unwrap().floor_scale, 16384.0);
        v["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 1e4});
        let err = parse(&v).unwrap_err();
        assert!(
            err.contains("rope_parameters.llama_4_scaling_beta"),
            "{err}"
        );
        v["rope_parameters"]["llama_4_scaling_beta"] = json!(0.1);
        let err = parse(&v).unwrap_err();
        assert!(err.contains("original_max_position_embeddings"), "{err}");
        v["rope_parameters"]["original_max_position_embeddings"] = json!(4096);
        let s = parse(&v).unwrap();
        assert_eq!(s.rope_scaling, RopeScaling::None);
        assert_eq!(s.query_temperature.unwrap().floor_scale, 4096.0);
        v["rope_parameters"]["llama_4_scaling_beta"] = json!(0.0);
        assert_eq!(parse(&v).unwrap().query_temperature, None);
        v["rope_parameters"]["original_max_position_embeddings"] = json!(0);
        assert!(parse(&v).is_err());
    }

    /// Mistral Small 4 as its export nests it, every field but the layer count left to
    /// `Mistral4Config` (whose defaults are its geometry): latent attention (nope 64 + rope 64
    /// — the rotary table over half of each 128-dim head — v 128, q latent 1024, kv latent
    /// 256), YaRN ×128 over 8192 positions with mscale_all_dim 1, β 0.1, 128 experts top-4 by
    /// softmax in one group, a shared expert.
    #[test]
    fn mistral4_export_defaults() {
        let mut v = json!({
            "architectures": ["Mistral3ForConditionalGeneration"],
            "text_config": {"model_type": "mistral4", "num_hidden_layers": 36},
            "vision_config": {}, "dtype": "bfloat16"
        });
        let s = parse(&v).unwrap();
        assert_eq!(s.architecture, Architecture::Mistral4);
        assert_eq!((s.num_layers, s.num_heads, s.head_dim), (36, 32, 128));
        assert_eq!((s.hidden_size, s.vocab_size), (4096, 131072));
        let h = s.hybrid.as_ref().unwrap();
        let mla = h.mla.as_ref().unwrap();
        assert_eq!((mla.dims.nope, mla.dims.rope, mla.dims.v), (64, 64, 128));
        assert_eq!(
            (mla.q_lora, mla.kv_lora, h.rotary_dim),
            (Some(1024), 256, 64)
        );
        let m = 0.1 * 128f64.ln() + 1.0;
        assert!((mla.score_factor - m * m).abs() < 1e-12);
        assert!(matches!(
            s.rope_scaling,
            RopeScaling::Yarn { factor: 128.0, .. }
        ));
        let moe = h.moe.as_ref().unwrap();
        assert_eq!(
            (moe.num_experts, moe.top_k, moe.shared_intermediate),
            (128, 4, Some(2048))
        );
        let router = MoeRouter::Grouped {
            n_group: 1,
            topk_group: 1,
            scale: 1.0,
            softmax: true,
            bias: false,
            renorm_eps: DEFAULT_RENORM_EPS,
            group_rank: GroupRank::TopTwoSum,
        };
        assert_eq!(moe.router, router);
        assert!(moe.sparse_layers.iter().all(|&s| s));
        let t = s.query_temperature.unwrap();
        assert_eq!((t.floor_scale, t.attn_scale, t.offset), (8192.0, 0.1, 0.0));
        // A rotary table over the whole head would not fit its 64 rotated dims.
        v["text_config"]["rope_parameters"] = json!({"rope_type": "default",
            "partial_rotary_factor": 1.0, "llama_4_scaling_beta": 0.1,
            "original_max_position_embeddings": 8192});
        let err = parse(&v).unwrap_err();
        assert!(err.contains("partial_rotary_factor"), "{err}");
    }

    /// Ministral-8B-Instruct-2410's shape under transformers' own class: every layer sliding
    /// by default, `layer_types` where named, the window refused null with sliding layers.
    #[test]
    fn ministral_windows_per_layer() {
        let mut v = json!({
            "architectures": ["MinistralForCausalLM"], "model_type": "ministral",
            "head_dim": 128, "hidden_size": 4096, "intermediate_size": 12288,
            "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 4,
            "rms_norm_eps": 1e-5, "rope_theta": 100000000.0, "sliding_window": 32768,
            "vocab_size": 131072, "attention_bias": true
        });
        let s = parse(&v).unwrap();
        assert_eq!(s.architecture, Architecture::Ministral);
        assert_eq!((s.head_dim, s.rope_theta, s.rms_norm_eps), (128, 1e8, 1e-5));
        assert!(!s.qkv_bias && !s.o_bias && s.sliding_window.is_none());
        let w = s.windows.unwrap();
        assert_eq!((w.window, w.sliding), (32768, vec![true; 4]));
        assert_eq!(w.local_rope, (1e8, RopeScaling::None));
        let types = ["full_attention", "sliding_attention"];
        v["layer_types"] = json!([types[1], types[1], types[1], types[0]]);
        v["sliding_window"] = json!(64);
        let w = parse(&v).unwrap().windows.unwrap();
        assert_eq!((w.window, w.sliding), (64, vec![true, true, true, false]));
        v["sliding_window"] = json!(null);
        let err = parse(&v).unwrap_err();
        assert!(err.contains("sliding_window"), "{err}");
        v.as_object_mut().unwrap().remove("layer_types");
        let w = parse(&v).unwrap().windows.unwrap();
        assert_eq!(w.sliding, vec![false; 4]);
    }
}
