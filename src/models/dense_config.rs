//! The spec of a dense or attention-only MoE `config.json` (Llama, Qwen2 / 3, Mistral,
//! Granite, Qwen3-MoE, Mixtral, GLM-4.5, MiniMax-M2, Llama-4): one reader with each config
//! class's defaults.

use super::config::{Cfg, default_eps, default_max_pos};
use super::{Architecture, ModelError, ModelSpec, QkNorm, WeightDtype};

/// The spec of a dense or attention-only MoE config (Llama, Qwen2 / 3, Mistral, Qwen3-MoE,
/// Mixtral, GLM-4.5).
pub(super) fn dense_spec(
    cfg: &Cfg<'_>,
    architecture: Architecture,
    name: String,
) -> Result<ModelSpec, ModelError> {
    cfg.check_activation()?;
    let hidden_size = cfg.usize_req("hidden_size")?;
    let num_heads = cfg.usize_req("num_attention_heads")?;
    if architecture == Architecture::Phi3 {
        phi3_rope(cfg, hidden_size / num_heads.max(1))?;
    }
    let num_kv_heads = cfg.usize_or("num_key_value_heads", num_heads)?;
    let default_head_dim = match architecture {
        // Qwen3Config's, MiniMaxM2Config's and Llama4TextConfig's head_dim default to 128,
        // not hidden/heads.
        Architecture::Qwen3 | Architecture::MiniMaxM2 | Architecture::Llama4 => 128,
        _ => hidden_size / num_heads.max(1),
    };
    let max_position_embeddings =
        cfg.usize_or("max_position_embeddings", default_max_pos(architecture))?;
    let (rope_theta, rope_scaling) = cfg.rope(architecture)?;
    // MiniMax-M2's projections never carry a bias (MiniMaxM2Config has no such field).
    let attention_bias =
        architecture != Architecture::MiniMaxM2 && cfg.bool_or("attention_bias", false)?;
    let head_dim = cfg.usize_or("head_dim", default_head_dim)?;
    Ok(ModelSpec {
        name,
        architecture,
        vocab_size: cfg.usize_req("vocab_size")?,
        hidden_size,
        num_layers: cfg.num_layers()?,
        num_heads,
        num_kv_heads,
        head_dim,
        intermediate_size: match architecture {
            // Llama-4's dense MLPs (its `intermediate_size` is the experts').
            Architecture::Llama4 => cfg.usize_or("intermediate_size_mlp", 16384)?,
            _ => cfg.usize_req("intermediate_size")?,
        },
        rms_norm_eps: cfg.f64_or("rms_norm_eps", default_eps(architecture))?,
        rope_theta,
        rope_scaling,
        qkv_bias: architecture == Architecture::Qwen2 || attention_bias,
        // Qwen2's and GLM-4.5's `attention_bias` leaves o_proj without one.
        o_bias: !matches!(architecture, Architecture::Qwen2 | Architecture::Glm4Moe)
            && attention_bias,
        mlp_bias: cfg.bool_or("mlp_bias", false)?,
        qk_norm: match architecture {
            Architecture::Qwen3 | Architecture::Qwen3Moe => QkNorm::PerHead,
            Architecture::Glm4Moe if cfg.bool_or("use_qk_norm", false)? => QkNorm::PerHead,
            Architecture::MiniMaxM2 => QkNorm::Whole,
            _ => QkNorm::None,
        },
        tie_word_embeddings: cfg.bool_or("tie_word_embeddings", false)?,
        max_position_embeddings,
        dtype: cfg.dtype()?.unwrap_or(WeightDtype::F32),
        hybrid: super::moe_config::attention_moe(cfg, architecture, head_dim)?,
        sliding_window: cfg.sliding_window(architecture, max_position_embeddings)?,
        gpt_oss: None,
        fp8: None,
        llama4: match architecture {
            Architecture::Llama4 => Some(super::llama4_config::attention(cfg, cfg.num_layers()?)?),
            _ => None,
        },
        gemma3: None,
        granite: match architecture {
            Architecture::Granite => Some(super::granite_config::multipliers(cfg)?),
            _ => None,
        },
    })
}

/// Phi-3's RoPE as hsx runs it: every dim of the head rotated, no `longrope` (which
/// `Phi3Config` also calls `su` and `yarn`: Phi-3.5-mini's and Phi-4-mini's 128k scaling picks
/// its factors by the sequence's length).
fn phi3_rope(cfg: &Cfg<'_>, head_dim: usize) -> Result<(), ModelError> {
    if super::hybrid_config::rotary_dim(cfg, head_dim, 1.0)? != head_dim {
        let msg = "a partial rotary factor (Phi-4-mini's): hsx rotates whole Phi-3 heads";
        return Err(cfg.err("partial_rotary_factor", msg));
    }
    let params = cfg
        .get("rope_parameters")
        .or_else(|| cfg.get("rope_scaling"));
    let kind = params
        .and_then(|p| p.get("rope_type").or_else(|| p.get("type")))
        .and_then(|v| v.as_str());
    if let Some(k @ ("longrope" | "su" | "yarn")) = kind {
        return Err(ModelError::Unsupported {
            path: cfg.path_buf(),
            what: format!("Phi-3 rope type `{k}` (longrope: 128k Phi-3.5 / Phi-4-mini)"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::{Value, json};

    use super::super::{Architecture, ModelSpec, released_config};

    fn parse(v: &Value) -> Result<ModelSpec, String> {
        ModelSpec::from_json(v, Path::new("config.json"), "m".into()).map_err(|e| e.to_string())
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

    /// Phi-3-mini-4k's window of 2047 keys applies; longrope and partial rotary are refused.
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
        for kind in ["longrope", "su", "yarn"] {
            let scaling = json!({"type": kind, "short_factor": [1.0], "long_factor": [1.0]});
            let err = with("rope_scaling", scaling).unwrap_err();
            assert!(err.contains(kind), "{err}");
        }
        let params = json!({"rope_type": "longrope", "rope_theta": 1e4});
        assert!(
            with("rope_parameters", params)
                .unwrap_err()
                .contains("longrope")
        );
        let err = with("partial_rotary_factor", json!(0.75)).unwrap_err();
        assert!(err.contains("partial_rotary_factor"), "{err}");
        let params = json!({"rope_type": "default", "partial_rotary_factor": 1.0});
        assert!(with("rope_parameters", params).is_ok());
    }
}
