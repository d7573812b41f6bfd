//! ERNIE 4.5's config fields hsx reads beyond Llama's (`Ernie4_5Config`,
//! `Ernie4_5_MoeConfig`): its MoE block. The dense fields (`use_bias` refused, `head_dim` 128 and
//! tied embeddings by default, RoPE on interleaved pairs) are read by `dense_config`.

use super::ModelError;
use super::config::Cfg;
use super::hybrid_config::{DEFAULT_RENORM_EPS, GroupRank, MoeRouter, MoeSpec};

/// ERNIE 4.5's MoE (`Ernie4_5_MoeConfig`): `moe_num_experts` of `moe_intermediate_size`, top
/// `moe_k` of the softmax of the logits ranked with `moe_statics.e_score_correction_bias`, their
/// probabilities renormalised; `moe_num_shared_experts` shared experts as one plain MLP. Layer i
/// is sparse when (i + 1) % `moe_layer_interval` is 0 and `moe_layer_start_index` <= i <=
/// `moe_layer_end_index` (-1: the last layer); the others are MLPs of `intermediate_size`.
pub(super) fn moe(cfg: &Cfg<'_>, num_layers: usize) -> Result<MoeSpec, ModelError> {
    let inter = cfg.usize_or("moe_intermediate_size", 1536)?;
    let shared = inter
        .checked_mul(cfg.usize_or("moe_num_shared_experts", 2)?)
        .ok_or_else(|| cfg.err("moe_num_shared_experts", "too large"))?;
    let interval = cfg.usize_or("moe_layer_interval", 1)?;
    if interval == 0 {
        return Err(cfg.err("moe_layer_interval", "must be at least 1"));
    }
    let start = cfg.usize_or("moe_layer_start_index", 1)?;
    let last = num_layers.saturating_sub(1);
    let end = match cfg.get("moe_layer_end_index").and_then(|v| v.as_i64()) {
        Some(-1) => last,
        _ => cfg.usize_or("moe_layer_end_index", last)?,
    };
    // transformers divides by the weights' sum clamped to `moe_norm_min`: the clamp cannot bind
    // for top-k softmax probabilities unless it is large, where hsx's sum would differ.
    let norm_min = cfg.f64_or("moe_norm_min", 1e-12)?;
    if norm_min > 1e-6 {
        return Err(cfg.err("moe_norm_min", format!("{norm_min} (hsx runs up to 1e-6)")));
    }
    Ok(MoeSpec {
        num_experts: cfg.usize_or("moe_num_experts", 64)?,
        top_k: cfg.usize_or("moe_k", 6)?,
        expert_intermediate: inter,
        shared_intermediate: (shared > 0).then_some(shared),
        norm_topk_prob: true,
        sparse_layers: (0..num_layers)
            .map(|i| (i + 1).is_multiple_of(interval) && i >= start && i <= end)
            .collect(),
        router: MoeRouter::Grouped {
            n_group: 1,
            topk_group: 1,
            scale: 1.0,
            softmax: true,
            bias: true,
            renorm_eps: DEFAULT_RENORM_EPS,
            group_rank: GroupRank::TopTwoSum,
        },
    })
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::super::{Architecture, QkNorm, parse_config as parse};
    use super::*;

    /// Shaped as ERNIE-4.5-21B-A3B-PT's config.json (the fields hsx and transformers read, and
    /// some of the release's own that transformers ignores).
    fn ernie_21b_a3b() -> Value {
        json!({
            "architectures": ["Ernie4_5_MoeForCausalLM"], "model_type": "ernie4_5_moe",
            "hidden_act": "silu", "hidden_size": 2560, "intermediate_size": 12288,
            "max_position_embeddings": 131072, "num_attention_heads": 20,
            "num_key_value_heads": 4, "num_hidden_layers": 28, "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
            "use_bias": false, "vocab_size": 103424, "moe_num_experts": 64, "moe_k": 6,
            "moe_num_shared_experts": 2, "moe_intermediate_size": 1536,
            "moe_layer_start_index": 1, "moe_layer_end_index": 27, "moe_layer_interval": 1,
            "moe_capacity": [64, 64, 64], "moe_gate": "topk", "moe_use_aux_free": true
        })
    }

    #[test]
    fn ernie_moe_geometry_router_and_attention() {
        let s = parse(&ernie_21b_a3b()).unwrap();
        assert_eq!(s.architecture, Architecture::Ernie4_5Moe);
        assert_eq!((s.head_dim, s.num_kv_heads, s.rope_theta), (128, 4, 5e5));
        assert!(s.interleaved_rope && s.tie_word_embeddings);
        assert_eq!((s.qkv_bias, s.o_bias, s.mlp_bias), (false, false, false));
        assert_eq!(s.qk_norm, QkNorm::None);
        let m = s.hybrid.as_ref().unwrap().moe.as_ref().unwrap();
        assert_eq!(
            (
                m.num_experts,
                m.top_k,
                m.expert_intermediate,
                m.shared_intermediate
            ),
            (64, 6, 1536, Some(3072))
        );
        assert!(m.norm_topk_prob);
        assert_eq!(m.sparse_layers.iter().position(|&s| !s), Some(0));
        assert_eq!(m.sparse_layers.iter().filter(|&&s| s).count(), 27);
        let router = MoeRouter::Grouped {
            n_group: 1,
            topk_group: 1,
            scale: 1.0,
            softmax: true,
            bias: true,
            renorm_eps: DEFAULT_RENORM_EPS,
            group_rank: GroupRank::TopTwoSum,
        };
        assert_eq!(m.router, router);
    }

    /// `moe_layer_end_index` -1 is the last layer; an interval makes every n-th layer sparse
    /// inside the range; a range that ends early leaves the last layers dense.
    #[test]
    fn ernie_sparse_layers_follow_range_and_interval() {
        let sparse = |fields: Value| {
            let mut v = ernie_21b_a3b();
            v["num_hidden_layers"] = json!(8);
            for (k, x) in fields.as_object().unwrap() {
                v[k] = x.clone();
            }
            let s = parse(&v).unwrap();
            s.hybrid.unwrap().moe.unwrap().sparse_layers
        };
        let (f, t) = (false, true);
        let all_but_first = [f, t, t, t, t, t, t, t];
        assert_eq!(sparse(json!({"moe_layer_end_index": -1})), all_but_first);
        let odd = sparse(json!({"moe_layer_end_index": -1, "moe_layer_interval": 2}));
        assert_eq!(odd, [f, t, f, t, f, t, f, t]);
        let early = sparse(json!({"moe_layer_start_index": 2, "moe_layer_end_index": 5}));
        assert_eq!(early, [f, f, t, t, t, t, f, f]);
    }

    #[test]
    fn ernie_refusals_name_the_field() {
        let refused = |k: &str, x: Value| {
            let mut v = ernie_21b_a3b();
            v[k] = x;
            parse(&v).unwrap_err().to_string()
        };
        assert!(refused("use_bias", json!(true)).contains("use_bias"));
        assert!(refused("moe_layer_interval", json!(0)).contains("moe_layer_interval"));
        assert!(refused("moe_norm_min", json!(0.5)).contains("moe_norm_min"));
        // The VL release's per-modality expert lists are not a text model's.
        assert!(refused("moe_num_experts", json!([64, 64])).contains("moe_num_experts"));
    }

    /// Shaped as ERNIE-4.5-0.3B-PT's config.json: Llama's layers, tied, interleaved RoPE.
    #[test]
    fn ernie_dense_defaults() {
        let v = json!({
            "architectures": ["Ernie4_5ForCausalLM"], "model_type": "ernie4_5",
            "hidden_act": "silu", "hidden_size": 1024, "intermediate_size": 3072,
            "max_position_embeddings": 131072, "num_attention_heads": 16,
            "num_key_value_heads": 2, "num_hidden_layers": 18, "rope_theta": 500000.0,
            "torch_dtype": "bfloat16", "use_bias": false, "vocab_size": 103424
        });
        let s = parse(&v).unwrap();
        assert_eq!(s.architecture, Architecture::Ernie4_5);
        // Ernie4_5Config's head_dim (128), not hidden / heads: the release's q is 2048 wide.
        assert_eq!((s.head_dim, s.rms_norm_eps), (128, 1e-5));
        assert!(s.interleaved_rope && s.tie_word_embeddings && s.hybrid.is_none());
    }

    /// Shaped as dots.llm1.inst's config.json: Qwen3's attention with DeepSeek-V3's MoE.
    #[test]
    fn dots1_geometry_defaults_and_sliding_refusal() {
        let v = json!({
            "architectures": ["Dots1ForCausalLM"], "model_type": "dots1",
            "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 10944,
            "moe_intermediate_size": 1408, "num_hidden_layers": 62, "num_attention_heads": 32,
            "num_key_value_heads": 32, "head_dim": 128, "n_shared_experts": 2,
            "n_routed_experts": 128, "num_experts_per_tok": 6, "first_k_dense_replace": 1,
            "norm_topk_prob": true, "routed_scaling_factor": 2.5, "n_group": 1,
            "topk_group": 1, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5,
            "rope_theta": 10000000.0, "sliding_window": null, "max_window_layers": 62,
            "use_sliding_window": false, "tie_word_embeddings": false,
            "attention_bias": false, "torch_dtype": "bfloat16", "vocab_size": 152064
        });
        let s = parse(&v).unwrap();
        assert_eq!(s.architecture, Architecture::Dots1);
        assert_eq!(s.qk_norm, QkNorm::PerHead);
        assert!(!s.interleaved_rope && s.sliding_window.is_none());
        let h = s.hybrid.as_ref().unwrap();
        assert_eq!(h.rotary_dim, 128);
        let m = h.moe.as_ref().unwrap();
        assert_eq!(
            (m.num_experts, m.top_k, m.shared_intermediate),
            (128, 6, Some(2816))
        );
        assert!(m.norm_topk_prob && !m.sparse_layers[0] && m.sparse_layers[1]);
        let router = MoeRouter::Grouped {
            n_group: 1,
            topk_group: 1,
            scale: 2.5,
            softmax: false,
            bias: true,
            renorm_eps: DEFAULT_RENORM_EPS,
            group_rank: GroupRank::TopTwoSum,
        };
        assert_eq!(m.router, router);
        // Dots1Config's default: not renormalised.
        let mut d = v.clone();
        d.as_object_mut().unwrap().remove("norm_topk_prob");
        assert!(
            !parse(&d)
                .unwrap()
                .hybrid
                .unwrap()
                .moe
                .unwrap()
                .norm_topk_prob
        );
        // Layers from `max_window_layers` on slide (Dots1Config's default window 4096).
        let mut w = v.clone();
        w["max_window_layers"] = json!(60);
        w.as_object_mut().unwrap().remove("sliding_window");
        let err = parse(&w).unwrap_err().to_string();
        assert!(err.contains("sliding-window"), "{err}");
    }
}
