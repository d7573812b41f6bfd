//! Gemma-3's text config (`Gemma3TextConfig`, `gemma3_text`: `Gemma3ForCausalLM` and the
//! language model of `Gemma3ForConditionalGeneration` exports). Released multimodal configs
//! write only what differs from the class (4B: hidden and MLP sizes, layers, RoPE scaling,
//! window), so every field has the class's default. Per layer: sliding-window or full
//! attention (`layer_types`, or the older `sliding_window_pattern`), each kind with its own
//! RoPE (`rope_parameters.{full,sliding}_attention`, or the older `rope_theta` + `rope_scaling`
//! and `rope_local_base_freq`). Refused: attention logit soft-capping (Gemma-2's) and
//! bidirectional attention (EmbeddingGemma).

use serde_json::Value;

use super::config::{Cfg, default_eps, default_max_pos, default_theta, shown};
use super::{Architecture, ModelError, ModelSpec, QkNorm, RopeScaling, WeightDtype};

/// Gemma-3's per-layer attention.
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma3Spec {
    /// Per layer: sliding-window attention (`sliding_attention`), else full.
    pub sliding: Vec<bool>,
    /// The sliding layers see keys `pos - window + 1 ..= pos`.
    pub window: usize,
    /// The sliding layers' RoPE (theta, scaling); the full layers' is the spec's.
    pub local_rope: (f64, RopeScaling),
    /// Scores are scaled by `query_pre_attn_scalar^-½`: this times `head_dim^-½`.
    pub score_factor: f64,
}

const FULL: &str = "full_attention";
const SLIDING: &str = "sliding_attention";

/// The spec of a Gemma-3 text config, with `Gemma3TextConfig`'s defaults.
pub(super) fn parse(cfg: &Cfg<'_>, name: String) -> Result<ModelSpec, ModelError> {
    let arch = Architecture::Gemma3;
    refuse_unsupported(cfg)?;
    let layers = cfg.num_layers_or(26)?;
    let head_dim = cfg.usize_or("head_dim", 256)?;
    let ((rope_theta, rope_scaling), local_rope) = ropes(cfg)?;
    let scalar = cfg.f64_or("query_pre_attn_scalar", 256.0)?;
    if !(scalar.is_finite() && scalar > 0.0) {
        return Err(cfg.err("query_pre_attn_scalar", format!("{scalar} (above 0)")));
    }
    let window = cfg.usize_or("sliding_window", 4096)?;
    if window == 0 {
        return Err(cfg.err("sliding_window", "must be at least 1"));
    }
    let bias = cfg.bool_or("attention_bias", false)?;
    Ok(ModelSpec {
        vocab_size: cfg.usize_or("vocab_size", 262_208)?,
        hidden_size: cfg.usize_or("hidden_size", 2304)?,
        num_layers: layers,
        num_heads: cfg.usize_or("num_attention_heads", 8)?,
        num_kv_heads: cfg.usize_or("num_key_value_heads", 4)?,
        head_dim,
        intermediate_size: cfg.usize_or("intermediate_size", 9216)?,
        rms_norm_eps: cfg.f64_or("rms_norm_eps", default_eps(arch))?,
        rope_theta,
        rope_scaling,
        qkv_bias: bias,
        o_bias: bias,
        mlp_bias: false,
        qk_norm: QkNorm::PerHead,
        tie_word_embeddings: cfg.bool_or("tie_word_embeddings", true)?,
        max_position_embeddings: cfg.usize_or("max_position_embeddings", default_max_pos(arch))?,
        dtype: cfg.dtype()?.unwrap_or(WeightDtype::F32),
        gemma3: Some(Gemma3Spec {
            sliding: sliding_layers(cfg, layers)?,
            window,
            local_rope,
            score_factor: (head_dim as f64 / scalar).sqrt(),
        }),
        ..ModelSpec::base(name, arch)
    })
}

/// What Gemma-3's class allows but hsx does not run.
fn refuse_unsupported(cfg: &Cfg<'_>) -> Result<(), ModelError> {
    let unsupported = |what: String| ModelError::Unsupported {
        path: cfg.path_buf(),
        what,
    };
    if let Some(cap) = cfg.get("attn_logit_softcapping") {
        return Err(unsupported(format!(
            "attention logit soft-capping (attn_logit_softcapping {cap})"
        )));
    }
    if cfg.bool_or("use_bidirectional_attention", false)? {
        return Err(unsupported(
            "bidirectional attention (use_bidirectional_attention)".into(),
        ));
    }
    // Only `hidden_activation` counts: Gemma3TextConfig ignores a `hidden_act`.
    match cfg.get("hidden_activation") {
        None => {}
        Some(v) if v.as_str() == Some("gelu_pytorch_tanh") => {}
        Some(v) => {
            let shown = v.as_str().map_or_else(|| shown(v), String::from);
            return Err(unsupported(format!(
                "hidden_activation `{shown}` (only gelu_pytorch_tanh)"
            )));
        }
    }
    Ok(())
}

/// `layer_types`, else every `sliding_window_pattern`-th layer full (default 6).
fn sliding_layers(cfg: &Cfg<'_>, layers: usize) -> Result<Vec<bool>, ModelError> {
    if let Some(sliding) = cfg.sliding_layer_types(layers)? {
        return Ok(sliding);
    }
    let pattern = cfg.usize_or("sliding_window_pattern", 6)?;
    if pattern == 0 {
        return Err(cfg.err("sliding_window_pattern", "must be at least 1"));
    }
    Ok((0..layers)
        .map(|i| !(i + 1).is_multiple_of(pattern))
        .collect())
}

/// (full layers', sliding layers') RoPE: transformers 5's `rope_parameters` per layer type, or
/// the released `rope_theta` + `rope_scaling` (full) and `rope_local_base_freq` (sliding).
type Ropes = ((f64, RopeScaling), (f64, RopeScaling));

fn ropes(cfg: &Cfg<'_>) -> Result<Ropes, ModelError> {
    let local_theta = cfg.f64_or("rope_local_base_freq", 1e4)?;
    let Some(params) = cfg.get("rope_parameters") else {
        // The full layers' `rope_theta` + `rope_scaling`, read as every family's.
        let full = cfg.rope(Architecture::Gemma3)?;
        return Ok((full, (local_theta, RopeScaling::None)));
    };
    let full_theta = cfg.f64_or("rope_theta", default_theta(Architecture::Gemma3))?;
    let field = "rope_parameters";
    let of = |kind: &str, theta: f64| match params.get(kind).filter(|v| !v.is_null()) {
        Some(p) => cfg.rope_params(&format!("{field}.{kind}"), p, theta),
        None => Ok((theta, RopeScaling::None)),
    };
    let per_kind = params
        .as_object()
        .is_some_and(|o| o.keys().all(|k| k == FULL || k == SLIDING));
    if !per_kind {
        return Err(cfg.err(
            field,
            format!(
                "expected `{FULL}` / `{SLIDING}` entries, found {}",
                keys(params)
            ),
        ));
    }
    Ok((of(FULL, full_theta)?, of(SLIDING, local_theta)?))
}

fn keys(v: &Value) -> String {
    match v.as_object() {
        Some(o) => format!("{:?}", o.keys().collect::<Vec<_>>()),
        None => shown(v),
    }
}

#[cfg(test)]
#[path = "gemma3_config_tests.rs"]
mod tests;
