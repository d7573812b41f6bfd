//! OLMo 2 / 3's and EXAONE 4.0's configs (`Olmo2Config`, `Olmo3Config`, `Exaone4Config`):
//! Llama's fields with their defaults (eps 1e-5; OLMo 3's RoPE theta 5e5), q / k norm over the
//! whole projection (EXAONE: per head), `attention_bias` on q, k, v and o. EXAONE 4.0's windows
//! and NoPE full layers: [`exaone4`]. OLMo 3 adds per-layer windows: `layer_types` (else three
//! sliding layers of every four), `sliding_window` (4096), each kind with its RoPE —
//! transformers 5's `rope_parameters.{full,sliding}_attention`, or the releases' `rope_theta`
//! for both and `rope_scaling` (YaRN in the long-context releases) on the full layers only, as
//! `Olmo3Config` reads them.

use serde_json::Value;

use super::config::{Cfg, default_theta};
use super::{Architecture, ModelError, ModelSpec, RopeScaling};

/// OLMo's per-layer attention.
#[derive(Debug, Clone, PartialEq)]
pub struct OlmoSpec {
    /// Per layer: a sliding window (OLMo 3's `sliding_attention`), else full.
    pub sliding: Vec<bool>,
    /// The sliding layers see keys `pos - window + 1 ..= pos`.
    pub window: usize,
    /// The sliding layers' RoPE (theta, scaling); the full layers' is the spec's.
    pub local_rope: (f64, RopeScaling),
}

const FULL: &str = "full_attention";
const SLIDING: &str = "sliding_attention";

pub(super) fn parse(
    cfg: &Cfg<'_>,
    arch: Architecture,
    name: String,
) -> Result<ModelSpec, ModelError> {
    let mut spec = super::dense_config::dense_spec(cfg, arch, name)?;
    let layers = spec.num_layers;
    let global = (spec.rope_theta, spec.rope_scaling);
    spec.olmo = Some(match arch {
        Architecture::Exaone4 => exaone4(cfg, &mut spec)?,
        Architecture::Olmo3 => {
            if cfg.is_null("sliding_window") {
                // transformers' sliding-window mask refuses a null window too.
                return Err(cfg.err("sliding_window", "null with sliding layers"));
            }
            let (full, local) = olmo3_ropes(cfg)?;
            (spec.rope_theta, spec.rope_scaling) = full;
            OlmoSpec {
                sliding: olmo3_sliding(cfg, layers)?,
                window: cfg.usize_or("sliding_window", 4096)?,
                local_rope: local,
            }
        }
        _ => OlmoSpec {
            sliding: vec![false; layers],
            window: 0,
            local_rope: global,
        },
    });
    let g = spec
        .olmo
        .as_ref()
        .map(|o| (o.window, o.sliding.contains(&true)));
    if g == Some((0, true)) {
        return Err(cfg.err("sliding_window", "must be at least 1 with sliding layers"));
    }
    Ok(spec)
}

/// EXAONE 4.0: with a `sliding_window` (4096 unless null), `layer_types` or every
/// `sliding_window_pattern`-th layer (4) full, the full layers without RoPE (its "global
/// NoPE"), the sliding ones with the one RoPE; with a null window every layer full, with RoPE.
fn exaone4(cfg: &Cfg<'_>, spec: &mut ModelSpec) -> Result<OlmoSpec, ModelError> {
    let layers = spec.num_layers;
    let local_rope = (spec.rope_theta, spec.rope_scaling);
    if cfg.is_null("sliding_window") {
        return Ok(OlmoSpec {
            sliding: vec![false; layers],
            window: 0,
            local_rope,
        });
    }
    let sliding = match cfg.sliding_layer_types(layers)? {
        Some(s) => s,
        None => {
            let field = "sliding_window_pattern";
            let every = match cfg.get(field) {
                None => 4,
                Some(v) => (v.as_u64().and_then(|n| usize::try_from(n).ok()))
                    .filter(|&n| n > 0)
                    .ok_or_else(|| cfg.err(field, format!("{v} without `layer_types`")))?,
            };
            (0..layers)
                .map(|i| !(i + 1).is_multiple_of(every))
                .collect()
        }
    };
    spec.nope_layers = Some(sliding.iter().map(|s| !s).collect());
    Ok(OlmoSpec {
        sliding,
        window: cfg.usize_or("sliding_window", 4096)?,
        local_rope,
    })
}

/// `layer_types`, else every 4th layer full.
fn olmo3_sliding(cfg: &Cfg<'_>, layers: usize) -> Result<Vec<bool>, ModelError> {
    match cfg.sliding_layer_types(layers)? {
        Some(s) => Ok(s),
        None => Ok((0..layers).map(|i| !(i + 1).is_multiple_of(4)).collect()),
    }
}

/// (full layers', sliding layers') RoPE.
type Ropes = ((f64, RopeScaling), (f64, RopeScaling));

fn olmo3_ropes(cfg: &Cfg<'_>) -> Result<Ropes, ModelError> {
    let theta = cfg.f64_or("rope_theta", default_theta(Architecture::Olmo3))?;
    let field = "rope_parameters";
    let per_kind = cfg
        .get(field)
        .and_then(Value::as_object)
        .filter(|o| !o.is_empty() && o.keys().all(|k| k == FULL || k == SLIDING));
    let Some(params) = per_kind else {
        // The releases: one theta, the scaling on the full layers only.
        return Ok((cfg.rope(Architecture::Olmo3)?, (theta, RopeScaling::None)));
    };
    let of = |kind: &str| match params.get(kind).filter(|v| !v.is_null()) {
        Some(p) => cfg.rope_params(&format!("{field}.{kind}"), p, theta),
        None => Ok((theta, RopeScaling::None)),
    };
    Ok((of(FULL)?, of(SLIDING)?))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::{Value, json};

    use super::*;

    fn spec(v: Value) -> Result<ModelSpec, ModelError> {
        ModelSpec::from_json(&v, Path::new("c.json"), "m".into())
    }

    fn olmo3(extra: Value) -> Value {
        let mut v = json!({"architectures": ["Olmo3ForCausalLM"], "hidden_size": 64,
            "num_attention_heads": 4, "num_hidden_layers": 8, "intermediate_size": 128,
            "vocab_size": 100});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    }

    /// As the releases write it: one theta for both kinds, YaRN on the full layers only, every
    /// 4th layer full, a window of 4096; q / k norms over the whole projection.
    #[test]
    fn olmo3_releases_scale_the_full_layers_only() {
        let yarn = json!({"rope_type": "yarn", "factor": 8.0, "attention_factor": 1.2,
            "original_max_position_embeddings": 8192, "beta_fast": 32, "beta_slow": 1});
        let s = spec(olmo3(json!({"rope_theta": 500000.0, "rope_scaling": yarn,
            "max_position_embeddings": 65536})))
        .unwrap();
        let o = s.olmo.clone().unwrap();
        assert_eq!(
            o.sliding,
            [true, true, true, false, true, true, true, false]
        );
        assert_eq!((o.window, o.local_rope), (4096, (5e5, RopeScaling::None)));
        assert_eq!(s.rope_theta, 5e5);
        assert!(matches!(
            s.rope_scaling,
            RopeScaling::Yarn { factor: 8.0, .. }
        ));
        assert_eq!(
            (s.qk_norm, s.rms_norm_eps),
            (super::super::QkNorm::Whole, 1e-5)
        );
    }

    /// EXAONE 4.0: full layers without RoPE where a window is set (every 4th by default, or
    /// `layer_types`); a null window (the 1.2B) makes every layer full and rotating; a pattern
    /// string without `layer_types` is what the class cannot expand either.
    #[test]
    fn exaone4_windows_and_global_nope() {
        let exaone = |extra: Value| {
            let mut v = olmo3(extra);
            v["architectures"] = json!(["Exaone4ForCausalLM"]);
            spec(v)
        };
        let s = exaone(json!({})).unwrap();
        let o = s.olmo.unwrap();
        assert_eq!((o.window, o.sliding[3], o.sliding[2]), (4096, false, true));
        assert_eq!(
            s.nope_layers.unwrap(),
            o.sliding.iter().map(|s| !s).collect::<Vec<_>>()
        );
        let s = exaone(json!({"sliding_window": null})).unwrap();
        assert!(s.olmo.unwrap().sliding.iter().all(|s| !s) && s.nope_layers.is_none());
        let e = exaone(json!({"sliding_window_pattern": "LLLG"})).unwrap_err();
        assert!(e.to_string().contains("sliding_window_pattern"), "{e}");
        assert_eq!(
            exaone(json!({})).unwrap().qk_norm,
            super::super::QkNorm::PerHead
        );
    }

    /// transformers 5's saves: one RoPE per kind.
    #[test]
    fn olmo3_rope_per_kind() {
        let s = spec(olmo3(json!({"rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}})))
        .unwrap();
        assert_eq!(
            (s.rope_theta, s.rope_scaling),
            (1e6, RopeScaling::Linear { factor: 2.0 })
        );
        assert_eq!(s.olmo.unwrap().local_rope, (1e4, RopeScaling::None));
        let e = spec(olmo3(json!({"rope_parameters": {
            "full_attention": {"rope_type": "dynamic", "factor": 2.0}}})))
        .unwrap_err();
        assert!(e.to_string().contains("rope type `dynamic`"), "{e}");
        for window in [json!(0), json!(null)] {
            let e = spec(olmo3(json!({"sliding_window": window}))).unwrap_err();
            assert!(e.to_string().contains("sliding_window"), "{e}");
        }
    }
}
