//! The spec of a dense or attention-only MoE `config.json` (Llama, Qwen2 / 3, Mistral,
//! Granite, Qwen3-MoE, Mixtral, GLM-4.5, MiniMax-M2, Llama-4): one reader with each config
//! class's defaults.

use super::config::{Cfg, LongRope, default_eps, default_max_pos};
use super::{Architecture, ModelError, ModelSpec, QkNorm, RopeScaling, WeightDtype};
use crate::kernels::device::NormKind;

/// The spec of a dense or attention-only MoE config (Llama, Qwen2 / 3, Mistral, Qwen3-MoE,
/// Mixtral, GLM-4.5).
pub(super) fn dense_spec(
    cfg: &Cfg<'_>,
    architecture: Architecture,
    name: String,
) -> Result<ModelSpec, ModelError> {
    match architecture {
        // ArceeConfig's and Jais2Config's MLP is relu², without a gate.
        Architecture::Arcee | Architecture::Jais2 | Architecture::Nemotron => {
            cfg.check_named_activation(&["relu2"])?
        }
        // ApertusConfig's is xIELU; its MLP (Nemotron's) takes relu² too.
        Architecture::Apertus => cfg.check_named_activation(&["xielu", "relu2"])?,
        // Starcoder2Config's and PhiConfig's are the tanh GELU (`gelu_new` and
        // `gelu_pytorch_tanh` compute the same function).
        Architecture::Starcoder2 | Architecture::Phi => {
            cfg.check_named_activation(&["gelu_pytorch_tanh", "gelu_new"])?
        }
        // GPTNeoXConfig's is the exact GELU (checked, with the tanh ones, by gpt_neox).
        Architecture::GptNeox => {}
        _ => cfg.check_activation()?,
    }
    let ernie = matches!(
        architecture,
        Architecture::Ernie4_5 | Architecture::Ernie4_5Moe
    );
    let cohere = matches!(
        architecture,
        Architecture::Cohere | Architecture::Cohere2 | Architecture::Cohere2Moe
    );
    if architecture == Architecture::HyV3 && cfg.bool_or("mlp_bias", false)? {
        // Its shared experts would be biased too: no release has it.
        return Err(ModelError::Unsupported {
            path: cfg.path_buf(),
            what: "HY V3's mlp_bias (biased dense and shared-expert MLPs)".into(),
        });
    }
    if architecture == Architecture::Olmoe && cfg.get("clip_qkv").is_some_and(|v| !v.is_null()) {
        // No OLMoE release clips q / k / v.
        return Err(ModelError::Unsupported {
            path: cfg.path_buf(),
            what: "OLMoE's clip_qkv".into(),
        });
    }
    if ernie && cfg.bool_or("use_bias", false)? {
        // Every projection and the LM head biased: no release has it, and hsx's head has none.
        return Err(ModelError::Unsupported {
            path: cfg.path_buf(),
            what: "ERNIE 4.5's use_bias (biased projections and LM head)".into(),
        });
    }
    let hidden_size = cfg.usize_req("hidden_size")?;
    let num_heads = cfg.usize_req("num_attention_heads")?;
    let max_pos = cfg.usize_or("max_position_embeddings", default_max_pos(architecture))?;
    let longrope = match architecture {
        Architecture::Phi3 => phi3_rope(cfg, hidden_size / num_heads.max(1), max_pos)?,
        _ => None,
    };
    let num_kv_heads = cfg.usize_or("num_key_value_heads", num_heads)?;
    let default_head_dim = match architecture {
        // Qwen3Config's, MiniMaxM2Config's and Llama4TextConfig's head_dim default to 128,
        // not hidden/heads.
        Architecture::Qwen3
        | Architecture::Mellum
        | Architecture::MiniMaxM2
        | Architecture::Llama4
        | Architecture::Ministral3
        | Architecture::SeedOss
        | Architecture::Glm4
        | Architecture::Glm
        | Architecture::Ernie4_5
        | Architecture::Ernie4_5Moe
        | Architecture::HyV3
        | Architecture::Afmoe
        | Architecture::Cohere2Moe
        | Architecture::SolarOpen
        | Architecture::Helium
        | Architecture::Cwm => 128,
        _ => hidden_size / num_heads.max(1),
    };
    // LongRoPE: the short factors' range (see `LongRope`).
    let max_position_embeddings = longrope.as_ref().map_or(max_pos, |(_, l)| {
        l.original_max_position_embeddings.min(max_pos)
    });
    let head_dim = cfg.usize_or("head_dim", default_head_dim)?;
    let hunyuan = matches!(
        architecture,
        Architecture::HunYuanDenseV1 | Architecture::HunYuanMoEV1
    );
    let (rope_theta, rope_scaling) = match &longrope {
        Some((theta, _)) => (*theta, RopeScaling::None),
        None if hunyuan => super::hunyuan_config::rope(cfg, architecture, head_dim)?,
        None => cfg.rope(architecture)?,
    };
    // MiniMax-M2's projections never carry a bias (MiniMaxM2Config has no such field).
    // SeedOssConfig and Glm4Config bias q / k / v by default.
    let biased = matches!(
        architecture,
        Architecture::SeedOss | Architecture::Glm4 | Architecture::Glm
    );
    let attention_bias =
        architecture != Architecture::MiniMaxM2 && cfg.bool_or("attention_bias", biased)?;
    Ok(ModelSpec {
        vocab_size: cfg.usize_req("vocab_size")?,
        hidden_size,
        num_layers: cfg.num_layers()?,
        num_heads,
        num_kv_heads,
        head_dim,
        intermediate_size: match architecture {
            // Llama-4's dense MLPs (its `intermediate_size` is the experts').
            Architecture::Llama4 => cfg.usize_or("intermediate_size_mlp", 16384)?,
            // SolarOpenConfig has none (no dense MLP): the experts' width.
            Architecture::SolarOpen => cfg.usize_or("moe_intermediate_size", 1280)?,
            _ => cfg.usize_req("intermediate_size")?,
        },
        rms_norm_eps: cfg.f64_or("rms_norm_eps", default_eps(architecture))?,
        rope_theta,
        rope_scaling,
        qkv_bias: match architecture {
            Architecture::Qwen2 => true,
            Architecture::Qwen2Moe => cfg.bool_or("qkv_bias", true)?,
            _ => attention_bias,
        },
        // Qwen2's and GLM-4 / 4.5's `attention_bias` leaves o_proj without one; Seed-OSS's o_proj
        // has its own `attention_out_bias`.
        o_bias: match architecture {
            Architecture::Qwen2
            | Architecture::Glm4Moe
            | Architecture::Glm4
            | Architecture::Glm => false,
            // Helium's o_proj has none, whatever `attention_bias` says.
            Architecture::Qwen2Moe | Architecture::SolarOpen | Architecture::Helium => false,
            Architecture::SeedOss => cfg.bool_or("attention_out_bias", false)?,
            _ => attention_bias,
        },
        mlp_bias: cfg.bool_or("mlp_bias", false)?,
        qk_norm: match architecture {
            Architecture::Qwen3 | Architecture::Qwen3Moe | Architecture::Exaone4 => QkNorm::PerHead,
            Architecture::Dots1 | Architecture::ExaoneMoe | Architecture::HyV3 => QkNorm::PerHead,
            Architecture::Afmoe | Architecture::Apertus | Architecture::Mellum => QkNorm::PerHead,
            _ if hunyuan => QkNorm::PerHeadAfterRope,
            Architecture::Glm4Moe if cfg.bool_or("use_qk_norm", false)? => QkNorm::PerHead,
            Architecture::MiniMaxM2 | Architecture::Olmo2 | Architecture::Olmo3 => QkNorm::Whole,
            Architecture::OlmoHybrid | Architecture::Olmoe | Architecture::FlexOlmo => {
                QkNorm::Whole
            }
            _ => QkNorm::None,
        },
        // SmolLM3Config, Ernie4_5Config, Cohere's configs and GraniteSWAConfig tie by default.
        tie_word_embeddings: cfg.bool_or(
            "tie_word_embeddings",
            matches!(
                architecture,
                Architecture::SmolLM3 | Architecture::GraniteSwa
            ) || ernie
                || cohere,
        )?,
        max_position_embeddings,
        dtype: cfg.dtype()?.unwrap_or(WeightDtype::F32),
        hybrid: super::moe_config::attention_moe(cfg, architecture, head_dim)?,
        sliding_window: cfg.sliding_window(architecture, max_position_embeddings)?,
        llama4: match architecture {
            Architecture::Llama4 => Some(super::llama4_config::attention(cfg, cfg.num_layers()?)?),
            _ => None,
        },
        nope_layers: match architecture {
            Architecture::SmolLM3 => Some(smollm3_nope_layers(cfg, cfg.num_layers()?)?),
            _ => None,
        },
        rotary_dim: match architecture {
            Architecture::Glm4 | Architecture::Glm => {
                Some(super::hybrid_config::rotary_dim(cfg, head_dim, 0.5)?)
            }
            _ => None,
        },
        interleaved_rope: ernie
            || cohere
            || matches!(
                architecture,
                Architecture::Glm4 | Architecture::Glm | Architecture::Helium
            ),
        granite: match architecture {
            Architecture::Granite | Architecture::GraniteSwa => {
                Some(super::granite_config::multipliers(cfg)?)
            }
            Architecture::HyperClovaX => Some(super::granite_config::hyperclovax(cfg, head_dim)?),
            _ => None,
        },
        longrope: longrope.map(|(_, l)| l),
        query_temperature: super::mistral_config::query_temperature(cfg, architecture)?,
        ..ModelSpec::base(name, architecture)
    })
}

/// Jais 2's config (`Jais2Config`: Llama's fields): LayerNorms with biases of `layer_norm_eps`
/// (1e-5), q / k / v / o biased where `attention_bias` (true), the relu² MLP where `mlp_bias`
/// (true).
pub(super) fn parse_jais2(cfg: &Cfg<'_>, name: String) -> Result<ModelSpec, ModelError> {
    let mut spec = dense_spec(cfg, Architecture::Jais2, name)?;
    let bias = cfg.bool_or("attention_bias", true)?;
    (spec.qkv_bias, spec.o_bias) = (bias, bias);
    spec.mlp_bias = cfg.bool_or("mlp_bias", true)?;
    spec.norm = NormKind::LayerBias;
    spec.rms_norm_eps = cfg.f64_or("layer_norm_eps", 1e-5)?;
    Ok(spec)
}

/// SmolLM3's NoPE layers: `no_rope_layers` (1: RoPE, 0: none), else every
/// `no_rope_layer_interval`-th layer (4); its sliding window (`use_sliding_window`, on the
/// NoPE layers only; off in the releases) refused.
fn smollm3_nope_layers(cfg: &Cfg<'_>, layers: usize) -> Result<Vec<bool>, ModelError> {
    if cfg.bool_or("use_sliding_window", false)? {
        return Err(ModelError::Unsupported {
            path: cfg.path_buf(),
            what: "SmolLM3's sliding window (use_sliding_window)".into(),
        });
    }
    let field = "no_rope_layers";
    let Some(list) = cfg.get(field) else {
        let every = cfg.usize_or("no_rope_layer_interval", 4)?;
        if every == 0 {
            return Err(cfg.err("no_rope_layer_interval", "must be at least 1"));
        }
        return Ok((0..layers).map(|i| (i + 1).is_multiple_of(every)).collect());
    };
    let flags = (list.as_array())
        .filter(|a| a.len() >= layers)
        .ok_or_else(|| cfg.err(field, format!("expected a list of at least {layers} flags")))?;
    (flags.iter().take(layers))
        .map(|f| match f.as_u64() {
            Some(0) => Ok(true),
            Some(1) => Ok(false),
            _ => Err(cfg.err(field, format!("flag {f} (1: RoPE, 0: none)"))),
        })
        .collect()
}

/// Phi-3's RoPE as hsx runs it: `longrope` (`su`) read as [`LongRope`] with its theta, over
/// the first `partial_rotary_factor` of each head (Phi-4-mini: 3 / 4); `yarn` (which
/// `Phi3Config` also accepts) and a partial rotary factor without LongRoPE refused; other
/// types left to the common reader (`None`, whole heads rotated).
fn phi3_rope(
    cfg: &Cfg<'_>,
    head_dim: usize,
    max_pos: usize,
) -> Result<Option<(f64, LongRope)>, ModelError> {
    let rot = super::hybrid_config::rotary_dim(cfg, head_dim, 1.0)?;
    let params = cfg.rope_object();
    let kind = params
        .and_then(|(_, p)| p.get("rope_type").or_else(|| p.get("type")))
        .and_then(|v| v.as_str());
    match (kind, params) {
        (Some("longrope" | "su"), Some((field, p))) => {
            return super::longrope_config::longrope(cfg, (field, p), rot, max_pos).map(Some);
        }
        (Some("yarn"), _) => {
            return Err(ModelError::Unsupported {
                path: cfg.path_buf(),
                what: "Phi-3 rope type `yarn`".into(),
            });
        }
        _ => {}
    }
    if rot != head_dim {
        let msg = "a partial rotary factor without LongRoPE (Phi-4-mini's has it)";
        return Err(cfg.err("partial_rotary_factor", msg));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::{Value, json};

    use super::super::{Architecture, ModelSpec, RopeScaling, released_config};
    use crate::kernels::device::NormKind;

    fn parse(v: &Value) -> Result<ModelSpec, String> {
        ModelSpec::from_json(v, Path::new("config.json"), "m".into()).map_err(|e| e.to_string())
    }

    /// Shaped as GLM-4-9B-chat-hf's config: GLM-4's attention (q / k / v biased, o not; half of
    /// each 128-dim head rotated in interleaved pairs) with `GlmConfig`'s defaults.
    #[test]
    fn glm_4_9b_reads_glm_4s_attention() {
        let v = json!({
            "architectures": ["GlmForCausalLM"], "model_type": "glm", "attention_bias": true,
            "head_dim": 128, "hidden_size": 4096, "intermediate_size": 13696,
            "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 2,
            "partial_rotary_factor": 0.5, "rope_theta": 10000.0, "vocab_size": 151552
        });
        let s = parse(&v).unwrap();
        assert_eq!(s.architecture, Architecture::Glm);
        assert_eq!(
            (s.head_dim, s.rotary_dim, s.interleaved_rope),
            (128, Some(64), true)
        );
        assert_eq!(
            (s.qkv_bias, s.o_bias, s.rms_norm_eps),
            (true, false, 1.5625e-7)
        );
        assert_eq!(s.max_position_embeddings, 131072);
    }

    /// Shaped as Jais-2-8B-Chat (`Jais2Config`'s defaults: hidden 3328 in 26 heads of 128):
    /// LayerNorms with biases, every projection biased by default.
    #[test]
    fn jais2_layer_norms_and_biases() {
        let mut v = json!({
            "architectures": ["Jais2ForCausalLM"], "model_type": "jais2", "hidden_act": "relu2",
            "hidden_size": 3328, "intermediate_size": 26624, "num_attention_heads": 26,
            "num_hidden_layers": 32, "vocab_size": 150272, "layer_norm_eps": 1e-5
        });
        let s = parse(&v).unwrap();
        assert_eq!(s.architecture, Architecture::Jais2);
        assert_eq!(
            (s.head_dim, s.num_kv_heads, s.max_position_embeddings),
            (128, 26, 8192)
        );
        assert!(s.qkv_bias && s.o_bias && s.mlp_bias && !s.tie_word_embeddings);
        let norm = s.row_norm();
        assert_eq!((norm.kind, norm.eps), (NormKind::LayerBias, 1e-5));
        v["attention_bias"] = json!(false);
        v["mlp_bias"] = json!(false);
        let s = parse(&v).unwrap();
        assert!(!s.qkv_bias && !s.o_bias && !s.mlp_bias);
        v["hidden_act"] = json!("silu");
        let err = parse(&v).unwrap_err();
        assert!(err.contains("hidden_act `silu`"), "{err}");
    }

    #[test]
    fn phi_4_as_quoted() {
        let s = parse(&released_config("phi-4.json")).unwrap();
        assert_eq!(s.architecture, Architecture::Phi3);
        assert_eq!(
            (s.head_dim, s.num_kv_heads, s.rope_theta),
            (128, 10, 250000.0)
        );
        assert_eq!((s.sliding_window, s.rms_norm_eps), (None, 1e-5));
    }

    /// Phi-3-mini-4k's window of 2047 keys applies; yarn, and partial rotary without LongRoPE,
    /// are refused.
    #[test]
    fn phi3_window_and_refusals() {
        let with = |k: &str, v: Value| {
            let mut c = released_config("phi-4.json");
            c[k] = v;
            parse(&c)
        };
        assert_eq!(
            with("sliding_window", json!(2047)).unwrap().sliding_window,
            Some(2047)
        );
        assert_eq!(
            with("sliding_window", json!(16384)).unwrap().sliding_window,
            None
        );
        let err = with("rope_scaling", json!({"type": "yarn", "factor": 4.0})).unwrap_err();
        assert!(err.contains("yarn"), "{err}");
        let err = with("partial_rotary_factor", json!(0.75)).unwrap_err();
        assert!(err.contains("partial_rotary_factor"), "{err}");
        let params = json!({"rope_type": "default", "partial_rotary_factor": 1.0});
        let s = with("rope_parameters", params).unwrap();
        assert_eq!((s.longrope, s.max_position_embeddings), (None, 16384));
    }

    /// The 128k Phi-3 decoder's LongRoPE (`su`): its short factors, the attention factor from
    /// 131072 / 4096, and 4096 positions (the short factors' range); theta from the top level.
    #[test]
    fn phi3_longrope_as_released() {
        let s = parse(&released_config("phi-3-vision-128k-text.json")).unwrap();
        let l = s.longrope.clone().unwrap();
        assert_eq!((l.rotary_dim, l.short_factor.len()), (96, 48));
        assert_eq!(
            (l.short_factor[0], l.short_factor[47]),
            (1.05, 3.049999999999997)
        );
        assert_eq!(l.original_max_position_embeddings, 4096);
        let want = (1.0 + 32f64.ln() / 4096f64.ln()).sqrt();
        assert!(
            (l.attention_factor - want).abs() < 1e-15,
            "{}",
            l.attention_factor
        );
        assert_eq!((s.max_position_embeddings, s.sliding_window), (4096, None));
        assert_eq!((s.rope_theta, s.rope_scaling), (10000.0, RopeScaling::None));
    }

    /// Phi-4-mini's shape (config.json as released: the partial rotary factor and the original
    /// context at the top level, `rope_scaling` `longrope` without a `factor`): 96 rotated dims of
    /// 128, 4096 positions, the attention factor from 131072 / 4096.
    #[test]
    fn phi4_mini_shape() {
        let v = json!({"architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
            "vocab_size": 200064, "hidden_size": 3072, "intermediate_size": 8192,
            "num_hidden_layers": 32, "num_attention_heads": 24, "num_key_value_heads": 8,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 131072,
            "tie_word_embeddings": true, "partial_rotary_factor": 0.75,
            "original_max_position_embeddings": 4096, "sliding_window": 262144,
            "rope_scaling": {"type": "longrope", "long_factor": vec![3.0; 48],
                "short_factor": vec![1.0; 48]}});
        let s = parse(&v).unwrap();
        let l = s.longrope.unwrap();
        assert_eq!(
            (s.head_dim, l.rotary_dim, l.short_factor.len()),
            (128, 96, 48)
        );
        assert_eq!((s.max_position_embeddings, s.sliding_window), (4096, None));
        let want = (1.0 + 32f64.ln() / 4096f64.ln()).sqrt();
        assert!((l.attention_factor - want).abs() < 1e-15);
    }

    /// transformers 5's `rope_parameters` form (original context inside, theta, a given
    /// attention factor), and malformed LongRoPE configs refused by field.
    #[test]
    fn phi3_longrope_parameters_and_refusals() {
        let factors = |n: usize| json!(vec![1.5; n]);
        let with = |params: Value| {
            let mut c = released_config("phi-4.json");
            c["rope_parameters"] = params;
            parse(&c)
        };
        // phi-4: hidden 5120, 40 heads: head_dim 128, 64 factors.
        let base = json!({"rope_type": "longrope", "rope_theta": 5e5, "short_factor": factors(64),
            "long_factor": factors(64), "original_max_position_embeddings": 2048});
        let s = with(base.clone()).unwrap();
        let l = s.longrope.unwrap();
        // phi-4's max_position_embeddings 16384: factor 8.
        let want = (1.0 + 8f64.ln() / 2048f64.ln()).sqrt();
        assert!((l.attention_factor - want).abs() < 1e-15);
        assert_eq!((s.rope_theta, s.max_position_embeddings), (5e5, 2048));
        let mut given = base.clone();
        given["attention_factor"] = json!(1.25);
        assert_eq!(
            with(given).unwrap().longrope.unwrap().attention_factor,
            1.25
        );
        // Phi-4-mini's partial rotary factor: 96 of 128 dims, 48 factors each.
        let mut partial = base.clone();
        partial["partial_rotary_factor"] = json!(0.75);
        partial["short_factor"] = factors(48);
        partial["long_factor"] = factors(48);
        let l = with(partial.clone()).unwrap().longrope.unwrap();
        assert_eq!((l.rotary_dim, l.short_factor.len()), (96, 48));
        partial["short_factor"] = factors(64);
        assert!(with(partial).unwrap_err().contains("48 positive numbers"));
        for (key, bad, field) in [
            ("short_factor", factors(63), "short_factor"),
            ("short_factor", json!([1.0, "x"]), "short_factor"),
            ("long_factor", Value::Null, "long_factor"),
            (
                "original_max_position_embeddings",
                Value::Null,
                "original_max",
            ),
            ("attention_factor", json!(-1.0), "attention_factor"),
        ] {
            let mut p = base.clone();
            p[key] = bad;
            let err = with(p).unwrap_err();
            assert!(err.contains(field), "{key}: {err}");
        }
    }
}
