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
