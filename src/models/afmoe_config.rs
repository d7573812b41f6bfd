//! AFMoE's config (`AfmoeConfig`: Arcee Trinity): Llama's fields (heads of 128 by default) with
//! per-layer windows — `layer_types`, else every `global_attn_every_n_layers`-th (4) layer full —
//! of `sliding_window` (1024), the full layers without RoPE; µP's embedding scale
//! (`mup_enabled`); its experts after the first `num_dense_layers` (1).

use super::config::{Architecture, Cfg};
use super::hybrid_config::{MoeRouter, MoeSpec, first_usize};
use super::{ModelError, ModelSpec};

/// AFMoE's per-layer attention and embedding scale.
#[derive(Debug, Clone, PartialEq)]
pub struct AfmoeSpec {
    /// Per layer: a sliding window with RoPE, else full attention without RoPE.
    pub sliding: Vec<bool>,
    pub window: usize,
    /// Embeddings times √hidden (`mup_enabled`).
    pub mup: bool,
}

pub(super) fn parse(cfg: &Cfg<'_>, name: String) -> Result<ModelSpec, ModelError> {
    let mut spec = super::dense_config::dense_spec(cfg, Architecture::Afmoe, name)?;
    if spec.qkv_bias {
        // The gate projection beside q / k / v has none: no release biases them.
        return Err(ModelError::Unsupported {
            path: cfg.path_buf(),
            what: "AFMoE's attention_bias".into(),
        });
    }
    let layers = spec.num_layers;
    let sliding = match cfg.sliding_layer_types(layers)? {
        Some(s) => s,
        None => {
            let every = cfg.usize_or("global_attn_every_n_layers", 4)?;
            if every == 0 {
                return Err(cfg.err("global_attn_every_n_layers", "must be at least 1"));
            }
            (0..layers)
                .map(|i| !(i + 1).is_multiple_of(every))
                .collect()
        }
    };
    let window = cfg.usize_or("sliding_window", 1024)?;
    if window == 0 && sliding.contains(&true) {
        return Err(cfg.err("sliding_window", "must be at least 1 with sliding layers"));
    }
    spec.afmoe = Some(AfmoeSpec {
        sliding,
        window,
        mup: cfg.bool_or("mup_enabled", false)?,
    });
    Ok(spec)
}

/// AFMoE's experts: after the first `num_dense_layers` (1), `num_experts` (64) of
/// `moe_intermediate_size` (1408), the top `num_experts_per_tok` (6) of the sigmoid of
/// `router.gate`'s logits ranked with `expert_bias`, renormalised and times `route_scale` (1),
/// beside `num_shared_experts` (2) shared experts as one plain MLP.
pub(super) fn moe(cfg: &Cfg<'_>, num_layers: usize) -> Result<MoeSpec, ModelError> {
    let inter = cfg.usize_or("moe_intermediate_size", 1408)?;
    let shared = inter
        .checked_mul(cfg.usize_or("num_shared_experts", 2)?)
        .ok_or_else(|| cfg.err("num_shared_experts", "too large"))?;
    let dense = cfg.usize_or("num_dense_layers", 1)?;
    Ok(MoeSpec {
        num_experts: first_usize(cfg, &["num_experts", "num_local_experts"], 64)?,
        top_k: cfg.usize_or("num_experts_per_tok", 6)?,
        expert_intermediate: inter,
        shared_intermediate: (shared > 0).then_some(shared),
        norm_topk_prob: true,
        sparse_layers: (0..num_layers).map(|i| i >= dense).collect(),
        router: MoeRouter::sigmoid(cfg.f64_or("route_scale", 1.0)? as f32),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::{QkNorm, parse_config as parse};
    use super::*;

    /// `AfmoeConfig`'s defaults: every 4th layer full (NoPE), windows of 1024, heads of 128,
    /// layer 0 dense, 64 experts top-6 of the sigmoid router, 2 shared experts.
    #[test]
    fn afmoe_defaults() {
        let mut v = json!({
            "architectures": ["AfmoeForCausalLM"], "model_type": "afmoe", "hidden_size": 2048,
            "intermediate_size": 6144, "num_hidden_layers": 8, "num_attention_heads": 16,
            "num_key_value_heads": 4, "vocab_size": 200192, "mup_enabled": true
        });
        let s = parse(&v).unwrap();
        assert_eq!(s.architecture, Architecture::Afmoe);
        assert_eq!((s.head_dim, s.qk_norm), (128, QkNorm::PerHead));
        let a = s.afmoe.as_ref().unwrap();
        assert_eq!((a.window, a.mup), (1024, true));
        let (f, t) = (false, true);
        assert_eq!(a.sliding, [t, t, t, f, t, t, t, f]);
        let m = s.hybrid.as_ref().unwrap().moe.as_ref().unwrap();
        assert_eq!(
            (
                m.num_experts,
                m.top_k,
                m.expert_intermediate,
                m.shared_intermediate
            ),
            (64, 6, 1408, Some(2816))
        );
        assert!(!m.sparse_layers[0] && m.sparse_layers[1..].iter().all(|&s| s));
        v["attention_bias"] = json!(true);
        assert!(
            parse(&v)
                .unwrap_err()
                .to_string()
                .contains("attention_bias")
        );
        v["attention_bias"] = json!(false);
        v["global_attn_every_n_layers"] = json!(0);
        let err = parse(&v).unwrap_err().to_string();
        assert!(err.contains("global_attn_every_n_layers"), "{err}");
    }
}
