//! MiniMax-M2's config fields -> its MoE geometry and rotary dims (the rest of its spec is a
//! dense config's). `MiniMaxM2Config` ignores several fields of MiniMax's own config class;
//! those that would describe another model are refused.

use serde_json::{Value, json};

use super::ModelError;
use super::config::{Cfg, shown};
use super::hybrid_config::{MoeRouter, MoeSpec, first_usize, rotary_dim};

/// MiniMax-M2: `num_local_experts` experts of `intermediate_size` in every layer, top
/// `num_experts_per_tok` by `sigmoid(logits) + e_score_correction_bias`, weighted by the
/// unbiased sigmoids renormalised — DeepSeek-V3's router with one group and scale 1 — and no
/// shared expert.
pub(super) fn minimax_moe(cfg: &Cfg<'_>, num_layers: usize) -> Result<MoeSpec, ModelError> {
    check_minimax_fields(cfg)?;
    Ok(MoeSpec {
        num_experts: first_usize(cfg, &["num_local_experts", "num_experts"], 256)?,
        top_k: cfg.usize_or("num_experts_per_tok", 8)?,
        expert_intermediate: cfg.usize_req("intermediate_size")?,
        shared_intermediate: None,
        norm_topk_prob: true,
        sparse_layers: vec![true; num_layers],
        router: MoeRouter::sigmoid(1.0),
    })
}

/// Fields of MiniMax's own config class that `MiniMaxM2Config` ignores, each as MiniMax-M2
/// has it: another value describes a model transformers would not compute (a per-head norm,
/// a softmax router, a shared expert, lightning-attention layers), so it is refused.
fn check_minimax_fields(cfg: &Cfg<'_>) -> Result<(), ModelError> {
    let fixed = [
        ("use_qk_norm", json!(true)),
        ("qk_norm_type", json!("per_layer")),
        ("scoring_func", json!("sigmoid")),
        ("use_routing_bias", json!(true)),
        ("shared_intermediate_size", json!(0)),
    ];
    let same = |v: &Value, want: &Value| match (v.as_f64(), want.as_f64()) {
        (Some(a), Some(b)) => a == b,
        _ => v == want,
    };
    for (field, want) in fixed {
        if let Some(v) = cfg.get(field).filter(|v| !same(v, &want)) {
            let msg = format!("{} (MiniMax-M2 has {want})", shown(v));
            return Err(cfg.err(field, msg));
        }
    }
    match cfg.get("attn_type_list") {
        Some(Value::Array(a)) if a.iter().all(|t| same(t, &json!(1))) => Ok(()),
        Some(v) => Err(cfg.err(
            "attn_type_list",
            format!(
                "{} (only full-attention layers, 1, are supported)",
                shown(v)
            ),
        )),
        None => Ok(()),
    }
}

/// MiniMax-M2's rotary dims: `rotary_dim` (read as `partial_rotary_factor` = rotary_dim /
/// head_dim, as `MiniMaxM2Config` converts it, so a `partial_rotary_factor` given outright
/// wins), else all of `head_dim`.
pub(super) fn minimax_rotary_dim(cfg: &Cfg<'_>, head_dim: usize) -> Result<usize, ModelError> {
    let factor = match cfg.usize_opt("rotary_dim")? {
        Some(r) => r as f64 / head_dim.max(1) as f64,
        None => 1.0,
    };
    rotary_dim(cfg, head_dim, factor)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::{Value, json};

    use super::super::{Architecture, ModelSpec, QkNorm, released_config};

    fn parse(v: &Value) -> Result<ModelSpec, String> {
        ModelSpec::from_json(v, Path::new("config.json"), "m".into()).map_err(|e| e.to_string())
    }

    /// MiniMax-M2.5 as released (tests/fixtures/released_configs).
    fn released() -> Value {
        released_config("minimax-m2.5.json")
    }

    /// Every field hsx reads from the release, and MiniMaxM2Config's defaults for those a
    /// config may leave out (head_dim 128, theta 5e6, 256 experts top-8, full rotary).
    #[test]
    fn released_geometry_router_norms_and_defaults() {
        let s = parse(&released()).unwrap();
        assert_eq!(s.architecture, Architecture::MiniMaxM2);
        assert_eq!((s.num_layers, s.num_heads, s.num_kv_heads), (62, 48, 8));
        assert_eq!((s.head_dim, s.intermediate_size), (128, 1536));
        assert_eq!((s.rope_theta, s.rms_norm_eps), (5e6, 1e-6));
        assert_eq!(s.qk_norm, QkNorm::Whole);
        assert!(!s.qkv_bias && !s.o_bias && s.sliding_window.is_none());
        assert_eq!(s.fp8.map(|b| (b.rows, b.cols)), Some((128, 128)));
        let h = s.hybrid.as_ref().unwrap();
        assert_eq!(h.rotary_dim, 64);
        let m = h.moe.as_ref().unwrap();
        assert_eq!(
            (m.num_experts, m.top_k, m.expert_intermediate),
            (256, 8, 1536)
        );
        assert!(m.shared_intermediate.is_none() && m.sparse_layers.iter().all(|&s| s));
        let g = m.grouped().unwrap();
        assert_eq!(
            (g.n_group, g.topk_group, g.renorm, g.scale),
            (1, 1, true, 1.0)
        );

        let mut v = released();
        let o = v.as_object_mut().unwrap();
        for k in ["head_dim", "rope_theta", "rotary_dim", "num_local_experts"] {
            o.remove(k);
        }
        o.remove("num_experts_per_tok");
        // transformers never builds a bias for MiniMax-M2's projections.
        o.insert("attention_bias".into(), json!(true));
        let s = parse(&v).unwrap();
        assert_eq!((s.head_dim, s.rope_theta, s.qkv_bias), (128, 5e6, false));
        let h = s.hybrid.unwrap();
        let m = h.moe.unwrap();
        assert_eq!((h.rotary_dim, m.num_experts, m.top_k), (128, 256, 8));
    }

    /// `rotary_dim` is read as `partial_rotary_factor` = rotary_dim / head_dim, which a factor
    /// given outright (top level, or in `rope_parameters`) overrides, as in transformers.
    #[test]
    fn rotary_dim_and_the_factors_that_override_it() {
        let rot = |edit: &dyn Fn(&mut Value)| {
            let mut v = released();
            edit(&mut v);
            parse(&v).map(|s| s.hybrid.unwrap().rotary_dim)
        };
        assert_eq!(rot(&|v| v["rotary_dim"] = json!(32)), Ok(32));
        assert_eq!(rot(&|v| v["partial_rotary_factor"] = json!(0.25)), Ok(32));
        let params = json!({"rope_type": "default", "rope_theta": 5e6,
            "partial_rotary_factor": 0.75});
        assert_eq!(rot(&|v| v["rope_parameters"] = params.clone()), Ok(96));
        assert!(rot(&|v| v["rotary_dim"] = json!(0)).is_err());
        assert!(rot(&|v| v["rotary_dim"] = json!(256)).is_err());
    }

    /// The fields MiniMaxM2Config ignores are refused, by name, where their value describes a
    /// model transformers would not compute.
    #[test]
    fn other_models_fields_are_refused_by_name() {
        let cases = [
            ("use_qk_norm", json!(false)),
            ("qk_norm_type", json!("per_head")),
            ("scoring_func", json!("softmax")),
            ("use_routing_bias", json!(false)),
            ("shared_intermediate_size", json!(1536)),
            ("attn_type_list", json!([0, 1])),
            ("attn_type_list", json!("1")),
        ];
        for (field, value) in cases {
            let mut v = released();
            v[field] = value.clone();
            let e = parse(&v).unwrap_err();
            assert!(e.contains(field), "{field} {value}: {e}");
        }
        let mut v = released();
        v["shared_intermediate_size"] = json!(0.0);
        v["use_qk_norm"] = Value::Null;
        assert!(parse(&v).is_ok());
    }
}
