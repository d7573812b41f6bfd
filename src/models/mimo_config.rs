//! MiMo-V2-Flash's config (`MiMoV2FlashConfig`, `mimo_v2_flash`) -> [`ModelSpec`] +
//! [`MimoSpec`]. Two spellings of the same model are read:
//! - transformers' (`save_pretrained` of its class): `layer_types`, `mlp_layer_types`,
//!   `rope_parameters.{full,sliding}_attention`, `sliding_window`, `rms_norm_eps`;
//! - the released checkpoints' own (what vLLM and SGLang read): `hybrid_layer_pattern` (1 =
//!   sliding), `moe_layer_freq` (1 = MoE), `swa_num_key_value_heads` and the other `swa_*`
//!   geometry, `rope_theta` / `swa_rope_theta` / `partial_rotary_factor`,
//!   `sliding_window_size` (the keys before the query: the window is one more, as transformers
//!   reads it), `add_{swa,full}_attention_sink_bias`, `layernorm_epsilon`.
//!
//! Where a config gives neither, the class's defaults: the first layer and every 6th full
//! attention, the rest sliding; the first layer a dense MLP, the rest MoE; thetas 5e6 (full) and
//! 1e4 (sliding), rotary 0.334 of each head; window 129; sinks on the sliding layers only; the
//! sliding layers twice the full layers' KV heads.

use serde_json::Value;

use super::config::{Cfg, default_eps, default_max_pos, default_theta};
use super::hybrid_config::{HybridSpec, LayerKind};
use super::moe_config::{MIMO_MOE, deepseek_moe};
use super::{Architecture, ModelError, ModelSpec, QkNorm, RopeScaling, WeightDtype};

/// MiMo-V2-Flash's two kinds of attention layer; index 0 of each pair is the full layers',
/// 1 the sliding layers'.
#[derive(Debug, Clone, PartialEq)]
pub struct MimoSpec {
    /// Per layer: sliding-window attention, else full.
    pub sliding: Vec<bool>,
    /// KV heads of each kind (the cache holds the larger count: the other kind's heads are
    /// repeated to fill it).
    pub kv_heads: [usize; 2],
    /// RoPE (theta, scaling) and rotated dims of each kind.
    pub rope: [(f64, RopeScaling, usize); 2],
    /// The sliding layers see keys `pos - window + 1 ..= pos`.
    pub window: usize,
    /// Whether each kind has learned sink logits (`self_attn.attention_sink_bias`).
    pub sinks: [bool; 2],
    /// Dims of a value head (q and k heads have the spec's `head_dim`).
    pub v_head_dim: usize,
    /// `attention_value_scale`: the factor on every value.
    pub value_scale: f32,
}

impl MimoSpec {
    /// 0 for a full-attention layer, 1 for a sliding one.
    pub fn kind(&self, i: usize) -> usize {
        usize::from(self.sliding[i])
    }
}

const FULL: &str = "full_attention";
const SLIDING: &str = "sliding_attention";

/// The spec of a MiMo-V2-Flash config, with `MiMoV2FlashConfig`'s defaults.
pub(super) fn parse(cfg: &Cfg<'_>, name: String) -> Result<ModelSpec, ModelError> {
    let arch = Architecture::MiMoV2Flash;
    cfg.check_activation()?;
    refuse_other_router(cfg)?;
    let layers = cfg.num_layers_or(48)?;
    let heads = cfg.usize_or("num_attention_heads", 64)?;
    let head_dim = cfg.usize_or("head_dim", 192)?;
    let v_head_dim = cfg.usize_or("v_head_dim", 128)?;
    same_as_full(cfg, "swa_num_attention_heads", heads)?;
    same_as_full(cfg, "swa_head_dim", head_dim)?;
    same_as_full(cfg, "swa_v_head_dim", v_head_dim)?;
    let kv = cfg.usize_or("num_key_value_heads", 4)?;
    let kv_heads = [kv, cfg.usize_or("swa_num_key_value_heads", 2 * kv)?];
    let rope = ropes(cfg, head_dim)?;
    let mimo = MimoSpec {
        sliding: sliding_layers(cfg, layers)?,
        kv_heads,
        rope,
        window: window(cfg)?,
        sinks: [
            cfg.bool_or("add_full_attention_sink_bias", false)?,
            cfg.bool_or("add_swa_attention_sink_bias", true)?,
        ],
        v_head_dim,
        value_scale: cfg.f64_or("attention_value_scale", 0.707)? as f32,
    };
    check_heads(cfg, &mimo, (heads, head_dim))?;
    let mut moe = deepseek_moe(cfg, layers, &MIMO_MOE)?;
    moe.sparse_layers = sparse_layers(cfg, layers)?;
    // MiMoV2FlashMoE has no shared experts (the class drops `n_shared_experts`).
    moe.shared_intermediate = None;
    let bias = cfg.bool_or("attention_bias", false)?;
    Ok(ModelSpec {
        vocab_size: cfg.usize_or("vocab_size", 152_576)?,
        hidden_size: cfg.usize_or("hidden_size", 4096)?,
        num_layers: layers,
        num_heads: heads,
        num_kv_heads: kv_heads[0].max(kv_heads[1]),
        head_dim,
        intermediate_size: cfg.usize_or("intermediate_size", 16384)?,
        rms_norm_eps: match cfg.get("rms_norm_eps") {
            Some(_) => cfg.f64_or("rms_norm_eps", default_eps(arch))?,
            None => cfg.f64_or("layernorm_epsilon", default_eps(arch))?,
        },
        rope_theta: rope[0].0,
        rope_scaling: rope[0].1,
        qkv_bias: bias,
        o_bias: false,
        mlp_bias: false,
        qk_norm: QkNorm::None,
        tie_word_embeddings: cfg.bool_or("tie_word_embeddings", false)?,
        max_position_embeddings: cfg.usize_or("max_position_embeddings", default_max_pos(arch))?,
        dtype: cfg.dtype()?.unwrap_or(WeightDtype::F32),
        hybrid: Some(HybridSpec {
            layers: vec![LayerKind::Attention; layers],
            rotary_dim: rope[0].2,
            gdn: None,
            moe: Some(moe),
            mamba: None,
            nemotron_moe: None,
            mamba1: None,
            mla: None,
        }),
        mimo: Some(mimo),
        ..ModelSpec::base(name, arch)
    })
}

/// Each kind's KV heads divide the cache's (the larger count) and it divides the query heads;
/// a value head is at most a key head wide (it is padded to one).
fn check_heads(
    cfg: &Cfg<'_>,
    m: &MimoSpec,
    (heads, head_dim): (usize, usize),
) -> Result<(), ModelError> {
    let [full, swa] = m.kv_heads;
    let most = full.max(swa);
    if full == 0 || swa == 0 || most % full != 0 || most % swa != 0 || heads % most != 0 {
        let msg = format!(
            "KV heads {full} (full) and {swa} (sliding) must each divide the larger, and it \
             num_attention_heads {heads}"
        );
        return Err(cfg.err("num_key_value_heads", msg));
    }
    if m.v_head_dim == 0 || m.v_head_dim > head_dim {
        let msg = format!("{} (from 1 to head_dim {head_dim})", m.v_head_dim);
        return Err(cfg.err("v_head_dim", msg));
    }
    Ok(())
}

/// The released configs' router fields, which transformers ignores, must name the router it
/// runs (sigmoid scores, the choice by the bias-corrected ones).
fn refuse_other_router(cfg: &Cfg<'_>) -> Result<(), ModelError> {
    for (field, runs) in [("scoring_func", "sigmoid"), ("topk_method", "noaux_tc")] {
        match cfg.get(field).map(|v| v.as_str()) {
            None => {}
            Some(Some(v)) if v == runs => {}
            Some(other) => {
                return Err(ModelError::Unsupported {
                    path: cfg.path_buf(),
                    what: format!("{field} {other:?} (MiMo-V2-Flash's router is {runs})"),
                });
            }
        }
    }
    Ok(())
}

/// A released config's `swa_*` geometry must be the full layers' (transformers builds every
/// layer with the full layers' heads and head sizes).
fn same_as_full(cfg: &Cfg<'_>, field: &str, full: usize) -> Result<(), ModelError> {
    match cfg.usize_opt(field)? {
        Some(v) if v != full => Err(ModelError::Unsupported {
            path: cfg.path_buf(),
            what: format!("{field} {v} unlike the full-attention layers' {full}"),
        }),
        _ => Ok(()),
    }
}

/// `layer_types`, else `hybrid_layer_pattern` (1 sliding, 0 full), else the class's pattern.
fn sliding_layers(cfg: &Cfg<'_>, layers: usize) -> Result<Vec<bool>, ModelError> {
    if let Some(sliding) = cfg.sliding_layer_types(layers)? {
        return Ok(sliding);
    }
    if let Some(flags) = flags(cfg, "hybrid_layer_pattern", layers)? {
        return Ok(flags);
    }
    Ok((0..layers).map(|i| i != 0 && (i + 1) % 6 != 0).collect())
}

/// `mlp_layer_types`, else `moe_layer_freq` (1 MoE, 0 dense), else layer 0 dense.
fn sparse_layers(cfg: &Cfg<'_>, layers: usize) -> Result<Vec<bool>, ModelError> {
    let kinds = cfg.per_layer_list("mlp_layer_types", layers, "dense / sparse", |k| match k {
        "dense" => Some(false),
        "sparse" => Some(true),
        _ => None,
    })?;
    if let Some(kinds) = kinds {
        return Ok(kinds);
    }
    if let Some(flags) = flags(cfg, "moe_layer_freq", layers)? {
        return Ok(flags);
    }
    Ok((0..layers).map(|i| i > 0).collect())
}

/// `field` as a list of `layers` flags, each 0 or 1 (`None` where absent).
fn flags(cfg: &Cfg<'_>, field: &str, layers: usize) -> Result<Option<Vec<bool>>, ModelError> {
    let Some(v) = cfg.get(field) else {
        return Ok(None);
    };
    let flag = |x: &Value| match x.as_u64() {
        Some(0) => Some(false),
        Some(1) => Some(true),
        _ => x.as_bool(),
    };
    let parsed: Option<Vec<bool>> = (v.as_array())
        .filter(|a| a.len() == layers)
        .and_then(|a| a.iter().map(flag).collect());
    let msg = format!("expected a list of {layers} flags, each 0 or 1");
    parsed.map(Some).ok_or_else(|| cfg.err(field, msg))
}

/// The sliding window: `sliding_window_size + 1` where given (the keys before the query, as
/// the released configs count it), else `sliding_window` (129 by default).
fn window(cfg: &Cfg<'_>) -> Result<usize, ModelError> {
    let window = match cfg.usize_opt("sliding_window_size")? {
        Some(before) => before
            .checked_add(1)
            .ok_or_else(|| cfg.err("sliding_window_size", "too large"))?,
        None => cfg.usize_or("sliding_window", 129)?,
    };
    if window == 0 {
        return Err(cfg.err("sliding_window", "must be at least 1"));
    }
    Ok(window)
}

/// Each kind's RoPE and rotated dims, `int(head_dim · partial_rotary_factor)` as transformers
/// computes them: from `rope_parameters.{full,sliding}_attention`, else the released
/// `rope_theta` / `swa_rope_theta` / `partial_rotary_factor`.
fn ropes(cfg: &Cfg<'_>, head_dim: usize) -> Result<[(f64, RopeScaling, usize); 2], ModelError> {
    let top_factor = cfg.f64_or("partial_rotary_factor", 0.334)?;
    let top_theta = [
        cfg.f64_or("rope_theta", default_theta(Architecture::MiMoV2Flash))?,
        cfg.f64_or("swa_rope_theta", 1e4)?,
    ];
    let params = cfg.get("rope_parameters");
    let mut out = [(0.0, RopeScaling::None, 0); 2];
    for (k, kind) in [FULL, SLIDING].into_iter().enumerate() {
        let field = format!("rope_parameters.{kind}");
        let p = params.and_then(|p| p.get(kind)).filter(|v| !v.is_null());
        let (theta, scaling) = match p {
            Some(p) => cfg.rope_params(&field, p, top_theta[k])?,
            None => (top_theta[k], RopeScaling::None),
        };
        let factor = match p.and_then(|p| p.get("partial_rotary_factor")) {
            Some(f) => f
                .as_f64()
                .ok_or_else(|| cfg.err(&field, "partial_rotary_factor: expected a number"))?,
            None => top_factor,
        };
        let rot = (head_dim as f64 * factor) as usize;
        if !(factor > 0.0 && factor <= 1.0) || rot == 0 || !rot.is_multiple_of(2) {
            let msg = format!("partial_rotary_factor {factor} of head_dim {head_dim}: {rot} dims");
            return Err(cfg.err(&field, format!("{msg} (must be even and at least 2)")));
        }
        out[k] = (theta, scaling, rot);
    }
    if let Some(p) = params.filter(|p| p.get(FULL).is_none() && p.get(SLIDING).is_none()) {
        let msg = format!("expected {FULL} / {SLIDING} entries, not {p}");
        return Err(cfg.err("rope_parameters", msg));
    }
    Ok(out)
}

#[cfg(test)]
#[path = "mimo_config_tests.rs"]
mod tests;
