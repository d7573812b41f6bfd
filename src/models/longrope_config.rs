//! Phi-3's LongRoPE parameters (`longrope` / `su`), read as transformers 5's
//! `_compute_longrope_parameters` reads them: from `rope_parameters` (or the older
//! `rope_scaling`), `original_max_position_embeddings` there or at the top level.

use serde_json::Value;

use super::ModelError;
use super::architecture::{Architecture, default_theta};
use super::config::{Cfg, LongRope};
use super::pyjson::value_f64;

/// `(theta, LongRope)` of the parameter object `params` (found at `field`), for `rot` rotated
/// dims per head and the config's `max_position_embeddings` `max_pos`.
pub(super) fn longrope(
    cfg: &Cfg<'_>,
    (field, params): (&str, &Value),
    rot: usize,
    max_pos: usize,
) -> Result<(f64, LongRope), ModelError> {
    let params = params
        .as_object()
        .ok_or_else(|| cfg.err(field, "expected an object"))?;
    let at = |k: &str| format!("{field}.{k}");
    let sub = |k: &str| params.get(k).filter(|v| !v.is_null());
    let num = |k: &str| match sub(k) {
        None => Ok(None),
        Some(v) => value_f64(v)
            .map(Some)
            .ok_or_else(|| cfg.err(&at(k), "expected a number")),
    };
    let factors = |k: &str| -> Result<Vec<f64>, ModelError> {
        let list = sub(k).and_then(Value::as_array);
        let list = list.ok_or_else(|| cfg.err(&at(k), "missing (a list of numbers)"))?;
        let values: Option<Vec<f64>> = list.iter().map(value_f64).collect();
        match values {
            Some(v) if v.len() == rot / 2 && v.iter().all(|f| f.is_finite() && *f > 0.0) => Ok(v),
            _ => Err(cfg.err(
                &at(k),
                format!("expected {} positive numbers (rotated dims / 2)", rot / 2),
            )),
        }
    };
    let short_factor = factors("short_factor")?;
    // Not run (see `LongRope`), but a config without it is not a LongRoPE config.
    factors("long_factor")?;
    let original = match num("original_max_position_embeddings")? {
        Some(v) => v,
        None => cfg.f64_or("original_max_position_embeddings", f64::NAN)?,
    };
    if !(original.is_finite() && original >= 1.0 && original.fract() == 0.0) {
        let msg = "missing or not a positive whole number (LongRoPE)";
        return Err(cfg.err("original_max_position_embeddings", msg));
    }
    let factor = num("factor")?.unwrap_or(max_pos as f64 / original);
    let attention_factor = match num("attention_factor")? {
        Some(a) => a,
        None if factor <= 1.0 => 1.0,
        None => (1.0 + factor.ln() / original.ln()).sqrt(),
    };
    if !(attention_factor.is_finite() && attention_factor > 0.0) {
        return Err(cfg.err(&at("attention_factor"), "expected a positive number"));
    }
    let top_theta = cfg.f64_or("rope_theta", default_theta(Architecture::Phi3))?;
    let theta = num("rope_theta")?.unwrap_or(top_theta);
    let longrope = LongRope {
        rotary_dim: rot,
        short_factor,
        original_max_position_embeddings: original as usize,
        attention_factor,
    };
    Ok((theta, longrope))
}
