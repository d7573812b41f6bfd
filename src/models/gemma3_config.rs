//! Gemma-3's text config (`Gemma3TextConfig`, `gemma3_text`: `Gemma3ForCausalLM` and the
//! language model of `Gemma3ForConditionalGeneration` exports) and Gemma-2's (`Gemma2Config`,
//! `Gemma2ForCausalLM`), which Gemma-3's layers run with no q/k norms, one RoPE for both kinds
//! and the scores soft-capped (`attn_logit_softcapping`, 50 by default). Released multimodal
//! configs write only what differs from the class (4B: hidden and MLP sizes, layers, RoPE
//! scaling, window), so every field has the class's default. Per layer: sliding-window or full
//! attention (`layer_types`, or Gemma-3's older `sliding_window_pattern`; Gemma-2's default
//! alternates, sliding first), each kind with its own RoPE on Gemma-3
//! (`rope_parameters.{full,sliding}_attention`, or the older `rope_theta` + `rope_scaling` and
//! `rope_local_base_freq`). Refused: bidirectional attention (EmbeddingGemma).

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
    /// `attn_logit_softcapping`: scaled scores become `cap · tanh(s / cap)`.
    pub softcap: Option<f32>,
    /// Each sublayer's output normed too (Gemma 2 and 3), not only its input (Gemma 1).
    pub sandwich: bool,
}

const FULL: &str = "full_attention";
const SLIDING: &str = "sliding_attention";

/// The spec of a Gemma-3 text config, with `Gemma3TextConfig`'s defaults.
pub(super) fn parse(cfg: &Cfg<'_>, name: String) -> Result<ModelSpec, ModelError> {
    let ((rope_theta, rope_scaling), local_rope) = ropes(cfg)?;
    let family = Family {
        arch: Architecture::Gemma3,
        sizes: GEMMA2_3_SIZES,
        vocab: 262_208,
        qk_norm: QkNorm::PerHead,
        ropes: ((rope_theta, rope_scaling), local_rope),
        softcap: None,
    };
    parse_family(cfg, name, family)
}

/// The spec of a Gemma-2 or VaultGemma config (`Gemma2Config`'s defaults; VaultGemma's layers
/// without post-norms) or a Gemma (1) one (`GemmaConfig`'s: every layer full attention, no
/// sandwich, no score scalar).
pub(super) fn parse_gemma1_2(
    cfg: &Cfg<'_>,
    arch: Architecture,
    name: String,
) -> Result<ModelSpec, ModelError> {
    let rope = cfg.rope(arch)?;
    let (sizes, softcap) = match arch {
        Architecture::Gemma => (GEMMA1_SIZES, None),
        _ => (GEMMA2_3_SIZES, Some(50.0)),
    };
    let family = Family {
        arch,
        sizes,
        vocab: 256_000,
        qk_norm: QkNorm::None,
        ropes: (rope, rope),
        softcap,
    };
    parse_family(cfg, name, family)
}

/// What the Gemma classes' configs do not share: the class, its default sizes and
/// vocabulary, its q/k norms, the (full, sliding) layers' RoPE, the default soft cap.
struct Family {
    arch: Architecture,
    sizes: Sizes,
    vocab: usize,
    qk_norm: QkNorm,
    ropes: Ropes,
    softcap: Option<f64>,
}

/// A class's default (hidden, intermediate, layers, heads, kv heads).
type Sizes = (usize, usize, usize, usize, usize);
const GEMMA1_SIZES: Sizes = (3072, 24576, 28, 16, 16);
const GEMMA2_3_SIZES: Sizes = (2304, 9216, 26, 8, 4);

fn parse_family(cfg: &Cfg<'_>, name: String, family: Family) -> Result<ModelSpec, ModelError> {
    let arch = family.arch;
    let gemma1 = arch == Architecture::Gemma;
    refuse_unsupported(cfg, arch)?;
    let (hidden, inter, layers, heads, kv_heads) = family.sizes;
    let layers = cfg.num_layers_or(layers)?;
    let head_dim = cfg.usize_or("head_dim", 256)?;
    let ((rope_theta, rope_scaling), local_rope) = family.ropes;
    // GemmaConfig has no score scalar (scores × head_dim^-½) and no window.
    let scalar = match gemma1 {
        true => head_dim as f64,
        false => cfg.f64_or("query_pre_attn_scalar", 256.0)?,
    };
    if !(scalar.is_finite() && scalar > 0.0) {
        return Err(cfg.err("query_pre_attn_scalar", format!("{scalar} (above 0)")));
    }
    let window = match gemma1 {
        true => usize::MAX,
        false => cfg.usize_or("sliding_window", 4096)?,
    };
    if window == 0 {
        return Err(cfg.err("sliding_window", "must be at least 1"));
    }
    let bias = cfg.bool_or("attention_bias", false)?;
    Ok(ModelSpec {
        vocab_size: cfg.usize_or("vocab_size", family.vocab)?,
        hidden_size: cfg.usize_or("hidden_size", hidden)?,
        num_layers: layers,
        num_heads: cfg.usize_or("num_attention_heads", heads)?,
        num_kv_heads: cfg.usize_or("num_key_value_heads", kv_heads)?,
        head_dim,
        intermediate_size: cfg.usize_or("intermediate_size", inter)?,
        rms_norm_eps: cfg.f64_or("rms_norm_eps", default_eps(arch))?,
        rope_theta,
        rope_scaling,
        qkv_bias: bias,
        o_bias: bias,
        mlp_bias: false,
        qk_norm: family.qk_norm,
        tie_word_embeddings: cfg.bool_or("tie_word_embeddings", true)?,
        max_position_embeddings: cfg.usize_or("max_position_embeddings", default_max_pos(arch))?,
        dtype: cfg.dtype()?.unwrap_or(WeightDtype::F32),
        gemma3: Some(Gemma3Spec {
            sliding: sliding_layers(cfg, arch, layers)?,
            window,
            local_rope,
            score_factor: (head_dim as f64 / scalar).sqrt(),
            // GemmaConfig has no soft cap to read.
            softcap: match gemma1 {
                true => None,
                false => softcap(cfg, family.softcap)?,
            },
            // Gemma (1) and VaultGemma norm each sublayer's input only.
            sandwich: !gemma1 && arch != Architecture::VaultGemma,
        }),
        ..ModelSpec::base(name, arch)
    })
}

/// `attn_logit_softcapping` (null: none), finite and above 0; the class's default where the
/// config names none.
fn softcap(cfg: &Cfg<'_>, default: Option<f64>) -> Result<Option<f32>, ModelError> {
    const FIELD: &str = "attn_logit_softcapping";
    let cap = match (cfg.has(FIELD), cfg.get(FIELD)) {
        (false, _) => default,
        (true, None) => None,
        (true, Some(_)) => Some(cfg.f64_or(FIELD, 0.0)?),
    };
    match cap {
        Some(c) if !(c.is_finite() && c > 0.0) => Err(cfg.err(FIELD, format!("{c} (above 0)"))),
        _ => Ok(cap.map(|c| c as f32)),
    }
}

/// What the Gemma classes allow but hsx does not run.
fn refuse_unsupported(cfg: &Cfg<'_>, arch: Architecture) -> Result<(), ModelError> {
    let unsupported = |what: String| ModelError::Unsupported {
        path: cfg.path_buf(),
        what,
    };
    if cfg.bool_or("use_bidirectional_attention", false)? {
        return Err(unsupported(
            "bidirectional attention (use_bidirectional_attention)".into(),
        ));
    }
    // Gemma 2 / 3 read only `hidden_activation` (a `hidden_act` is ignored); Gemma (1) only
    // `hidden_act`, its releases' legacy `gelu` meaning the tanh approximation.
    let (field, legacy) = match arch {
        Architecture::Gemma => ("hidden_act", Some("gelu")),
        _ => ("hidden_activation", None),
    };
    match cfg.get(field) {
        None => {}
        Some(v) if v.as_str() == Some("gelu_pytorch_tanh") => {}
        Some(v) if legacy.is_some() && v.as_str() == legacy => {}
        Some(v) => {
            let shown = v.as_str().map_or_else(|| shown(v), String::from);
            return Err(unsupported(format!(
                "{field} `{shown}` (only gelu_pytorch_tanh)"
            )));
        }
    }
    Ok(())
}

/// `layer_types`, else every `sliding_window_pattern`-th layer full (Gemma-3: default 6;
/// Gemma-2 reads no pattern, every second layer is full); Gemma (1): every layer full.
fn sliding_layers(
    cfg: &Cfg<'_>,
    arch: Architecture,
    layers: usize,
) -> Result<Vec<bool>, ModelError> {
    if arch == Architecture::Gemma {
        // GemmaConfig reads no layer types: every layer full.
        return Ok(vec![false; layers]);
    }
    if let Some(sliding) = cfg.sliding_layer_types(layers)? {
        return Ok(sliding);
    }
    let pattern = match arch {
        Architecture::Gemma2 | Architecture::VaultGemma => 2,
        _ => cfg.usize_or("sliding_window_pattern", 6)?,
    };
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
