//! OLMo 2 / 3's and EXAONE 4.0's configs (`Olmo2Config`, `Olmo3Config`, `Exaone4Config`):
//! Llama's fields with their defaults (eps 1e-5; OLMo 3's RoPE theta 5e5), q / k norm over the
//! whole projection (EXAONE: per head), `attention_bias` on q, k, v and o. EXAONE 4.0's windows
//! and NoPE full layers: [`exaone4`]. OLMo 3 adds per-layer windows: `layer_types` (else three
//! sliding layers of every four), `sliding_window` (4096), each kind with its RoPE —
//! transformers 5's `rope_parameters.{full,sliding}_attention`, or the releases' `rope_theta`
//! for both and `rope_scaling` (YaRN in the long-context releases) on the full layers only, as
//! `Olmo3Config` reads them. OLMo Hybrid (`OlmoHybridConfig`): [`parse_hybrid`].

use serde_json::Value;

use super::config::{Cfg, default_theta};
use super::hybrid_config::{GdnSpec, HybridSpec, LayerKind, NormGate};
use super::{Architecture, ModelError, ModelSpec, RopeScaling};

/// Per-layer sliding windows (OLMo 3, EXAONE 4.0, Cohere 2).
#[derive(Debug, Clone, PartialEq)]
pub struct LayerWindows {
    /// Per layer: a sliding window (`sliding_attention`), else full.
    pub sliding: Vec<bool>,
    /// The sliding layers see keys `pos - window + 1 ..= pos`.
    pub window: usize,
    /// The sliding layers' RoPE (theta, scaling); the full layers' is the spec's.
    pub local_rope: (f64, RopeScaling),
}

/// The per-layer windows of a config: `layer_types`, else `default_sliding`; a window of
/// `sliding_window` (`default_window` where the config names none), at least 1 where a layer
/// slides (a null one too is refused there, as transformers' sliding-window mask refuses it);
/// `local_rope` on the sliding layers.
pub(super) fn layer_windows(
    cfg: &Cfg<'_>,
    default_sliding: Vec<bool>,
    default_window: usize,
    local_rope: (f64, RopeScaling),
) -> Result<LayerWindows, ModelError> {
    let sliding = (cfg.sliding_layer_types(default_sliding.len())?).unwrap_or(default_sliding);
    Ok(LayerWindows {
        window: window_of(cfg, default_window, &sliding)?,
        sliding,
        local_rope,
    })
}

/// `sliding_window` (`default` where the config names none), at least 1 where a layer slides
/// (a null one too is refused there).
pub(super) fn window_of(
    cfg: &Cfg<'_>,
    default: usize,
    sliding: &[bool],
) -> Result<usize, ModelError> {
    let window = cfg.usize_or("sliding_window", default)?;
    if (cfg.is_null("sliding_window") || window == 0) && sliding.contains(&true) {
        return Err(cfg.err("sliding_window", "must be at least 1 with sliding layers"));
    }
    Ok(window)
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
    spec.windows = Some(match arch {
        Architecture::Exaone4 | Architecture::ExaoneMoe => exaone4(cfg, &mut spec)?,
        Architecture::Olmo3 => {
            if cfg.is_null("sliding_window") {
                // transformers' sliding-window mask refuses a null window too.
                return Err(cfg.err("sliding_window", "null with sliding layers"));
            }
            let (full, local) = olmo3_ropes(cfg)?;
            (spec.rope_theta, spec.rope_scaling) = full;
            LayerWindows {
                sliding: olmo3_sliding(cfg, layers)?,
                window: cfg.usize_or("sliding_window", 4096)?,
                local_rope: local,
            }
        }
        _ => LayerWindows {
            sliding: vec![false; layers],
            window: 0,
            local_rope: global,
        },
    });
    let g = spec
        .windows
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
fn exaone4(cfg: &Cfg<'_>, spec: &mut ModelSpec) -> Result<LayerWindows, ModelError> {
    let layers = spec.num_layers;
    let local_rope = (spec.rope_theta, spec.rope_scaling);
    if cfg.is_null("sliding_window") {
        return Ok(LayerWindows {
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
    Ok(LayerWindows {
        sliding,
        window: cfg.usize_or("sliding_window", 4096)?,
        local_rope,
    })
}

/// OLMo Hybrid: Llama's fields (eps 1e-6, 65536 positions, untied) with OLMo's q / k norms
/// over the whole projection; `layer_types` of `linear_attention` (Gated DeltaNet) and
/// `full_attention`, by default every 4th layer full (the last where that gives none); the
/// DeltaNet's `linear_*` geometry with `OlmoHybridConfig`'s defaults (heads as the attention's,
/// key dim `int(0.75 · hidden / key heads)`, value dim twice that), beta × 2 where
/// `linear_allow_neg_eigval` (default), its gated norm's eps 1e-5 (FLA's, as transformers).
/// A null RoPE theta (the releases' `"rope_theta": null`) makes every attention layer NoPE.
pub(super) fn parse_hybrid(cfg: &Cfg<'_>, name: String) -> Result<ModelSpec, ModelError> {
    let mut spec = super::dense_config::dense_spec(cfg, Architecture::OlmoHybrid, name)?;
    let (h, heads, layers) = (spec.hidden_size, spec.num_heads, spec.num_layers);
    let nk = cfg.usize_or("linear_num_key_heads", heads)?;
    let dk = match cfg.get("linear_key_head_dim") {
        Some(_) => cfg.usize_req("linear_key_head_dim")?,
        None if nk == 0 => 0,
        None => (0.75 * h as f64 / nk as f64) as usize,
    };
    let gdn = GdnSpec {
        num_k_heads: nk,
        num_v_heads: cfg.usize_or("linear_num_value_heads", heads)?,
        k_head_dim: dk,
        v_head_dim: cfg.usize_or("linear_value_head_dim", 2 * dk)?,
        conv_kernel: cfg.usize_or("linear_conv_kernel_dim", 4)?,
        beta_scale: match cfg.bool_or("linear_allow_neg_eigval", true)? {
            true => 2.0,
            false => 1.0,
        },
        norm_eps: Some(1e-5),
        out_gate: NormGate::Silu,
    };
    if rope_theta_is_null(cfg) {
        spec.nope_layers = Some(vec![true; layers]);
    }
    spec.hybrid = Some(HybridSpec {
        layers: hybrid_layers(cfg, layers)?,
        rotary_dim: spec.head_dim,
        gdn: Some(gdn),
        moe: None,
        mamba: None,
        nemotron_moe: None,
        mamba1: None,
        mla: None,
    });
    Ok(spec)
}

/// transformers builds no rotary embedding where the RoPE theta it resolves is null: the RoPE
/// object's `rope_theta` where it names one, else the top-level field.
fn rope_theta_is_null(cfg: &Cfg<'_>) -> bool {
    match cfg.rope_object() {
        Some((_, p)) if p.get("rope_theta").is_some() => p["rope_theta"].is_null(),
        _ => cfg.is_null("rope_theta"),
    }
}

/// OLMo Hybrid's `layer_types` (at least one of each kind), else every 4th layer full.
fn hybrid_layers(cfg: &Cfg<'_>, layers: usize) -> Result<Vec<LayerKind>, ModelError> {
    let field = "layer_types";
    let kinds = match cfg.linear_layer_types(layers, LayerKind::GatedDeltaNet)? {
        Some(kinds) => kinds,
        None => {
            let mut kinds: Vec<_> = (0..layers)
                .map(|i| match i % 4 {
                    3 => LayerKind::Attention,
                    _ => LayerKind::GatedDeltaNet,
                })
                .collect();
            if let Some(last) = kinds.last_mut().filter(|_| layers < 4) {
                *last = LayerKind::Attention;
            }
            kinds
        }
    };
    let has = |k: LayerKind| kinds.contains(&k);
    if !has(LayerKind::Attention) || !has(LayerKind::GatedDeltaNet) {
        return Err(cfg.err(
            field,
            "needs both linear_attention and full_attention layers",
        ));
    }
    Ok(kinds)
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
    match per_kind_ropes(cfg, theta)? {
        Some(ropes) => Ok(ropes),
        // The releases: one theta, the scaling on the full layers only.
        None => Ok((cfg.rope(Architecture::Olmo3)?, (theta, RopeScaling::None))),
    }
}

/// transformers 5's `rope_parameters.{full,sliding}_attention` (each kind's theta `theta`
/// where it names none); `None` where the config has no such object.
fn per_kind_ropes(cfg: &Cfg<'_>, theta: f64) -> Result<Option<Ropes>, ModelError> {
    let field = "rope_parameters";
    let per_kind = cfg
        .get(field)
        .and_then(Value::as_object)
        .filter(|o| !o.is_empty() && o.keys().all(|k| k == FULL || k == SLIDING));
    let Some(params) = per_kind else {
        return Ok(None);
    };
    let of = |kind: &str| match params.get(kind).filter(|v| !v.is_null()) {
        Some(p) => cfg.rope_params(&format!("{field}.{kind}"), p, theta),
        None => Ok((theta, RopeScaling::None)),
    };
    Ok(Some((of(FULL)?, of(SLIDING)?)))
}

/// `MellumConfig`'s: Qwen3-MoE's fields (heads of 128, 64 experts of 896, top-8, renormalised,
/// eps 1e-6) with `layer_types` (else every layer full) of `sliding_window` (1024), each kind
/// with its RoPE (`rope_parameters.{full,sliding}_attention`; by default theta 5·10⁵ on the full
/// layers, 10⁴ on the sliding ones).
pub(super) fn parse_mellum(cfg: &Cfg<'_>, name: String) -> Result<ModelSpec, ModelError> {
    let mut spec = super::dense_config::dense_spec(cfg, Architecture::Mellum, name)?;
    let layers = spec.num_layers;
    let (full, local) = match cfg.get("rope_parameters") {
        None => ((5e5, RopeScaling::None), (1e4, RopeScaling::None)),
        Some(_) => match per_kind_ropes(cfg, default_theta(Architecture::Mellum))? {
            Some(ropes) => ropes,
            None => {
                let one = cfg.rope(Architecture::Mellum)?;
                (one, one)
            }
        },
    };
    (spec.rope_theta, spec.rope_scaling) = full;
    spec.windows = Some(layer_windows(cfg, vec![false; layers], 1024, local)?);
    Ok(spec)
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
        let o = s.windows.clone().unwrap();
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
        let o = s.windows.unwrap();
        assert_eq!((o.window, o.sliding[3], o.sliding[2]), (4096, false, true));
        assert_eq!(
            s.nope_layers.unwrap(),
            o.sliding.iter().map(|s| !s).collect::<Vec<_>>()
        );
        let s = exaone(json!({"sliding_window": null})).unwrap();
        assert!(s.windows.unwrap().sliding.iter().all(|s| !s) && s.nope_layers.is_none());
        let e = exaone(json!({"sliding_window_pattern": "LLLG"})).unwrap_err();
        assert!(e.to_string().contains("sliding_window_pattern"), "{e}");
        assert_eq!(
            exaone(json!({})).unwrap().qk_norm,
            super::super::QkNorm::PerHead
        );
    }

    /// K-EXAONE (`ExaoneMoeForCausalLM`): EXAONE 4.0's windows and NoPE full layers, its MoE
    /// fields named `num_experts` / `num_shared_experts`, dense layers by `mlp_layer_types`
    /// (else `first_k_dense_replace`, 1).
    #[test]
    fn exaone_moe_windows_and_experts() {
        let layer_types: Vec<&str> = (0..8)
            .map(|i| match (i + 1) % 4 {
                0 => "full_attention",
                _ => "sliding_attention",
            })
            .collect();
        let mut v = olmo3(json!({"sliding_window": 128, "layer_types": layer_types,
            "sliding_window_pattern": "LLLG", "num_experts": 128, "num_experts_per_tok": 8,
            "num_shared_experts": 1, "moe_intermediate_size": 2048, "first_k_dense_replace": 1,
            "routed_scaling_factor": 2.5, "norm_topk_prob": true}));
        v["architectures"] = json!(["ExaoneMoeForCausalLM"]);
        v["num_hidden_layers"] = json!(8);
        let s = spec(v.clone()).unwrap();
        assert_eq!(s.qk_norm, super::super::QkNorm::PerHead);
        let o = s.windows.as_ref().unwrap();
        assert_eq!((o.window, o.sliding[3], o.sliding[4]), (128, false, true));
        assert!(s.nope_layers.as_ref().unwrap()[7]);
        let m = s.hybrid.as_ref().unwrap().moe.as_ref().unwrap();
        assert_eq!(
            (m.num_experts, m.top_k, m.shared_intermediate),
            (128, 8, Some(2048))
        );
        assert!(!m.sparse_layers[0] && m.sparse_layers[1..].iter().all(|&s| s));
        v["mlp_layer_types"] = json!([
            "dense", "dense", "sparse", "sparse", "sparse", "sparse", "sparse", "sparse"
        ]);
        let m = spec(v).unwrap().hybrid.unwrap().moe.unwrap();
        assert_eq!(m.sparse_layers.iter().position(|&s| s), Some(2));
    }

    fn olmo_hybrid(extra: Value) -> Result<ModelSpec, ModelError> {
        let mut v = olmo3(extra);
        v["architectures"] = json!(["OlmoHybridForCausalLM"]);
        spec(v)
    }

    /// `OlmoHybridConfig`'s defaults: every 4th layer full, linear heads as the attention's,
    /// key dim int(0.75 · 64 / 4) = 12, value dim 24, beta × 2, the gated norm's eps 1e-5,
    /// RoPE (theta 1e4) on the attention layers; eps 1e-6, 65536 positions, untied.
    #[test]
    fn olmo_hybrid_defaults() {
        let s = olmo_hybrid(json!({})).unwrap();
        let h = s.hybrid.clone().unwrap();
        let (g, a) = (LayerKind::GatedDeltaNet, LayerKind::Attention);
        assert_eq!(h.layers, [g, g, g, a, g, g, g, a]);
        assert_eq!(
            h.gdn.unwrap(),
            GdnSpec {
                num_k_heads: 4,
                num_v_heads: 4,
                k_head_dim: 12,
                v_head_dim: 24,
                conv_kernel: 4,
                beta_scale: 2.0,
                norm_eps: Some(1e-5),
                out_gate: NormGate::Silu,
            }
        );
        assert_eq!((h.rotary_dim, s.head_dim, s.rope_theta), (16, 16, 1e4));
        assert_eq!(s.nope_layers, None);
        assert_eq!(
            (s.qk_norm, s.rms_norm_eps),
            (super::super::QkNorm::Whole, 1e-6)
        );
        assert_eq!(
            (s.max_position_embeddings, s.tie_word_embeddings),
            (65536, false)
        );
        assert!(s.has_recurrent_layers());
        let s = olmo_hybrid(json!({"num_hidden_layers": 2, "linear_allow_neg_eigval": false}));
        let h = s.unwrap().hybrid.unwrap();
        assert_eq!((h.layers, h.gdn.unwrap().beta_scale), (vec![g, a], 1.0));
    }

    /// The RoPE theta transformers resolves: null (OLMo-core's releases write
    /// `"rope_theta": null`) turns RoPE off on every layer; a theta in the RoPE object wins
    /// over the top-level one, null included; a null RoPE object is the default RoPE.
    #[test]
    fn olmo_hybrid_nope_where_the_theta_is_null() {
        let nope = |extra: Value| olmo_hybrid(extra).unwrap().nope_layers;
        assert_eq!(nope(json!({"rope_theta": null})), Some(vec![true; 8]));
        let p = json!({"rope_type": "default", "rope_theta": null});
        assert_eq!(nope(json!({"rope_parameters": p})), Some(vec![true; 8]));
        let p = json!({"rope_type": "default"});
        let both = json!({"rope_parameters": p, "rope_theta": null});
        assert_eq!(nope(both), Some(vec![true; 8]));
        let p = json!({"rope_type": "default", "rope_theta": 5e5});
        assert_eq!(
            nope(json!({"rope_parameters": p, "rope_theta": null})),
            None
        );
        assert_eq!(nope(json!({"rope_parameters": null})), None);
    }

    /// Layer kinds transformers refuses (no linear or no full layer) or does not know, and
    /// a list of the wrong length, are refused by name.
    #[test]
    fn olmo_hybrid_layer_types_refused() {
        let types = |t: Value| {
            olmo_hybrid(json!({"layer_types": t}))
                .unwrap_err()
                .to_string()
        };
        let lin = "linear_attention";
        let full = "full_attention";
        for bad in [
            json!(vec![lin; 8]),
            json!(vec![full; 8]),
            json!([lin, "mamba", lin, full]),
        ] {
            assert!(types(bad).contains("layer_types"));
        }
        assert!(types(json!([lin, full])).contains("layer_types"));
        let e = olmo_hybrid(json!({"linear_num_key_heads": 3})).unwrap_err();
        assert!(e.to_string().contains("linear_num_value_heads"), "{e}");
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
        assert_eq!(s.windows.unwrap().local_rope, (1e4, RopeScaling::None));
        let e = spec(olmo3(json!({"rope_parameters": {
            "full_attention": {"rope_type": "dynamic", "factor": 2.0}}})))
        .unwrap_err();
        assert!(e.to_string().contains("rope type `dynamic`"), "{e}");
        for window in [json!(0), json!(null)] {
            let e = spec(olmo3(json!({"sliding_window": window}))).unwrap_err();
            assert!(e.to_string().contains("sliding_window"), "{e}");
        }
    }

    /// MellumConfig: every layer full and sparse by default, the full layers' theta 5e5 and
    /// the sliding ones' 1e4 unless `rope_parameters` names its kinds.
    #[test]
    fn mellum_defaults_and_per_kind_ropes() {
        let mut v = json!({"architectures": ["MellumForCausalLM"], "hidden_size": 256,
            "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 3,
            "intermediate_size": 512, "vocab_size": 100});
        let s = spec(v.clone()).unwrap();
        assert_eq!((s.head_dim, s.rms_norm_eps, s.rope_theta), (128, 1e-6, 5e5));
        let w = s.windows.as_ref().unwrap();
        assert_eq!(
            (w.sliding.clone(), w.window, w.local_rope.0),
            (vec![false; 3], 1024, 1e4)
        );
        let m = s.hybrid.as_ref().unwrap().moe.as_ref().unwrap();
        assert_eq!(
            (m.num_experts, m.top_k, m.expert_intermediate),
            (64, 8, 896)
        );
        assert_eq!(
            (
                m.sparse_layers.clone(),
                m.norm_topk_prob,
                m.shared_intermediate
            ),
            (vec![true; 3], true, None)
        );
        v["rope_parameters"] = json!({"full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 2e4}});
        v["layer_types"] = json!(["sliding_attention", "full_attention", "sliding_attention"]);
        v["mlp_layer_types"] = json!(["dense", "sparse", "dense"]);
        let s = spec(v).unwrap();
        let w = s.windows.as_ref().unwrap();
        assert_eq!(
            (s.rope_theta, w.local_rope.0, w.sliding.clone()),
            (1e6, 2e4, vec![true, false, true])
        );
        let m = s.hybrid.as_ref().unwrap().moe.as_ref().unwrap();
        assert_eq!(m.sparse_layers, [false, true, false]);
    }
}
