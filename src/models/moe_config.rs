//! The MoE fields of `config.json` -> [`MoeSpec`], for the families with routed experts:
//! Qwen3-Next and Qwen3.5-MoE (hybrid layers, a gated shared expert), Qwen3-MoE and Mixtral
//! (attention-only layers, no shared expert), GLM-4.5 (attention-only layers, DeepSeek-V3's
//! grouped sigmoid router, a plain shared expert), MiniMax-M2 (attention-only layers, a
//! sigmoid router with a correction bias, no shared expert). Defaults are the transformers
//! config classes'.

use super::ModelError;
use super::config::{Architecture, Cfg};
use super::hybrid_config::{HybridSpec, LayerKind, MoeRouter, MoeSpec, first_usize, rotary_dim};
use super::minimax_config::{minimax_moe, minimax_rotary_dim};

/// Qwen-style MoE fields (`num_experts`, `num_experts_per_tok`, `moe_intermediate_size`,
/// `shared_expert_intermediate_size`, `norm_topk_prob`, `decoder_sparse_step`,
/// `mlp_only_layers`); `None` when `num_experts` is 0 (every layer dense).
pub(super) fn qwen_moe(
    cfg: &Cfg<'_>,
    arch: Architecture,
    num_layers: usize,
) -> Result<Option<MoeSpec>, ModelError> {
    // (num_experts, top_k, moe_intermediate_size, norm_topk_prob) defaults per config class.
    let (experts, top_k, inter, renorm) = match arch {
        Architecture::Qwen3Next => (512, 10, 512, true),
        Architecture::Qwen3_5Moe => (256, 8, 512, true),
        Architecture::Qwen4Exp => (512, 10, 512, true),
        _ => (128, 8, 768, false),
    };
    // Qwen3MoeConfig maps `num_experts` to `num_local_experts`, the name transformers 5 saves.
    let num_experts = first_usize(cfg, &["num_experts", "num_local_experts"], experts)?;
    if num_experts == 0 {
        return Ok(None);
    }
    let shared = match arch {
        Architecture::Qwen3Moe => None,
        _ => Some(cfg.usize_or("shared_expert_intermediate_size", 512)?),
    };
    // Qwen3.5-MoE and Qwen4-Exp make every layer sparse and always renormalise (its config has neither
    // field; transformers would ignore them).
    let (norm_topk_prob, sparse_layers) = match arch {
        Architecture::Qwen3_5Moe | Architecture::Qwen4Exp => (true, vec![true; num_layers]),
        _ => (
            cfg.bool_or("norm_topk_prob", renorm)?,
            sparse_layers(cfg, num_layers)?,
        ),
    };
    Ok(Some(MoeSpec {
        num_experts,
        // Range checked with the rest of the geometry (spec_checks.rs).
        top_k: cfg.usize_or("num_experts_per_tok", top_k)?,
        expert_intermediate: cfg.usize_or("moe_intermediate_size", inter)?,
        shared_intermediate: shared,
        norm_topk_prob,
        sparse_layers,
        router: MoeRouter::Softmax,
    }))
}

/// Layer i is sparse unless listed in `mlp_only_layers`, when (i + 1) % `decoder_sparse_step`
/// is 0 (transformers' `Qwen3MoeDecoderLayer`).
fn sparse_layers(cfg: &Cfg<'_>, num_layers: usize) -> Result<Vec<bool>, ModelError> {
    let step = cfg.usize_or("decoder_sparse_step", 1)?.max(1);
    let mlp_only: Vec<usize> = match cfg.get("mlp_only_layers") {
        None => Vec::new(),
        Some(v) => v
            .as_array()
            .and_then(|a| a.iter().map(|x| x.as_u64().map(|n| n as usize)).collect())
            .ok_or_else(|| cfg.err("mlp_only_layers", "expected a list of layer indices"))?,
    };
    Ok((0..num_layers)
        .map(|i| !mlp_only.contains(&i) && (i + 1) % step == 0)
        .collect())
}

/// Mixtral: `num_local_experts` experts of `intermediate_size` in every layer, top
/// `num_experts_per_tok`, always renormalised, no shared expert.
fn mixtral_moe(cfg: &Cfg<'_>, num_layers: usize) -> Result<MoeSpec, ModelError> {
    Ok(MoeSpec {
        num_experts: first_usize(cfg, &["num_local_experts", "num_experts"], 8)?,
        top_k: cfg.usize_or("num_experts_per_tok", 2)?,
        expert_intermediate: cfg.usize_req("intermediate_size")?,
        shared_intermediate: None,
        norm_topk_prob: true,
        sparse_layers: vec![true; num_layers],
        router: MoeRouter::Softmax,
    })
}

/// The config classes' defaults of DeepSeek-V3's MoE fields.
pub(super) struct DeepseekMoeDefaults {
    experts: usize,
    top_k: usize,
    inter: usize,
    scale: f64,
    n_group: usize,
    topk_group: usize,
    dense: DenseLayers,
    /// The router scores by softmax, without a bias (`MoeRouter::Grouped`'s `softmax`:
    /// Mistral 4), not by sigmoid.
    softmax: bool,
    /// `norm_topk_prob`'s default (Dots1Config's is false).
    renorm: bool,
}

/// Which layers keep a dense MLP.
enum DenseLayers {
    /// Those below `first_k_dense_replace` (this default).
    FirstK(usize),
    /// Those `mlp_layer_types` names `"dense"`; by default layer 0
    /// (`Glm4MoeLiteConfig`, which ignores `first_k_dense_replace`).
    LayerTypes,
    /// Those `mlp_layer_types` names `"dense"`, else those below `first_k_dense_replace`
    /// (this default; `KimiLinearConfig`).
    LayerTypesElseFirstK(usize),
}

/// `Glm4MoeConfig`'s.
pub(super) const GLM_MOE: DeepseekMoeDefaults = DeepseekMoeDefaults {
    experts: 128,
    top_k: 8,
    inter: 1408,
    scale: 1.0,
    n_group: 1,
    topk_group: 1,
    dense: DenseLayers::FirstK(1),
    softmax: false,
    renorm: true,
};

/// `GlmMoeDsaConfig`'s (GLM-5's).
pub(super) const GLM_MOE_DSA: DeepseekMoeDefaults = DeepseekMoeDefaults {
    experts: 256,
    top_k: 8,
    inter: 2048,
    scale: 2.5,
    n_group: 1,
    topk_group: 1,
    dense: DenseLayers::LayerTypesElseFirstK(3),
    softmax: false,
    renorm: true,
};

/// `DeepseekV32Config`'s: DeepSeek-V3's, with `mlp_layer_types` read where given.
pub(super) const DEEPSEEK_V32_MOE: DeepseekMoeDefaults = DeepseekMoeDefaults {
    dense: DenseLayers::LayerTypesElseFirstK(3),
    ..DEEPSEEK_V3_MOE
};

/// `Glm4MoeLiteConfig`'s (GLM-4.7-Flash's).
pub(super) const GLM_MOE_LITE: DeepseekMoeDefaults = DeepseekMoeDefaults {
    experts: 64,
    top_k: 4,
    inter: 1536,
    scale: 1.8,
    n_group: 1,
    topk_group: 1,
    dense: DenseLayers::LayerTypes,
    softmax: false,
    renorm: true,
};

/// `KimiLinearConfig`'s (Kimi Linear 48B-A3B's).
pub(super) const KIMI_LINEAR_MOE: DeepseekMoeDefaults = DeepseekMoeDefaults {
    experts: 256,
    top_k: 8,
    inter: 1024,
    scale: 2.446,
    n_group: 1,
    topk_group: 1,
    dense: DenseLayers::LayerTypesElseFirstK(1),
    softmax: false,
    renorm: true,
};

/// `DeepseekV3Config`'s.
pub(super) const DEEPSEEK_V3_MOE: DeepseekMoeDefaults = DeepseekMoeDefaults {
    experts: 256,
    top_k: 8,
    inter: 2048,
    scale: 2.5,
    n_group: 8,
    topk_group: 4,
    dense: DenseLayers::FirstK(3),
    softmax: false,
    renorm: true,
};

/// `MiMoV2FlashConfig`'s (its dense layers are read by `mimo_config`).
pub(super) const MIMO_MOE: DeepseekMoeDefaults = DeepseekMoeDefaults {
    experts: 256,
    top_k: 8,
    inter: 2048,
    scale: 1.0,
    n_group: 1,
    topk_group: 1,
    dense: DenseLayers::FirstK(1),
    softmax: false,
    renorm: true,
};

/// `Mistral4Config`'s (Mistral Small 4's geometry).
pub(super) const MISTRAL4_MOE: DeepseekMoeDefaults = DeepseekMoeDefaults {
    experts: 128,
    top_k: 4,
    inter: 2048,
    scale: 1.0,
    n_group: 1,
    topk_group: 1,
    dense: DenseLayers::FirstK(0),
    softmax: true,
    renorm: true,
};

/// `ExaoneMoeConfig`'s (K-EXAONE's): `num_experts` and `num_shared_experts` named so.
pub(super) const EXAONE_MOE: DeepseekMoeDefaults = DeepseekMoeDefaults {
    experts: 64,
    top_k: 8,
    inter: 1024,
    scale: 2.5,
    n_group: 1,
    topk_group: 1,
    dense: DenseLayers::LayerTypesElseFirstK(1),
    softmax: false,
    renorm: true,
};

/// `Dots1Config`'s (it names no expert counts: its releases do).
pub(super) const DOTS1_MOE: DeepseekMoeDefaults = DeepseekMoeDefaults {
    experts: 0,
    top_k: 0,
    inter: 1408,
    scale: 1.0,
    n_group: 1,
    topk_group: 1,
    dense: DenseLayers::FirstK(0),
    softmax: false,
    renorm: false,
};

/// DeepSeek-V3's MoE (also GLM-4.5's): `n_routed_experts` (alias `num_local_experts`) of
/// `moe_intermediate_size`, top `num_experts_per_tok` by the grouped sigmoid router (`n_group`,
/// `topk_group`, `norm_topk_prob`, `routed_scaling_factor`), a shared expert of
/// `moe_intermediate_size · n_shared_experts`; the dense layers ([`DenseLayers`]) are MLPs of
/// `intermediate_size`.
pub(super) fn deepseek_moe(
    cfg: &Cfg<'_>,
    num_layers: usize,
    d: &DeepseekMoeDefaults,
) -> Result<MoeSpec, ModelError> {
    let inter = cfg.usize_or("moe_intermediate_size", d.inter)?;
    // K-EXAONE names them `num_shared_experts` and `num_experts`.
    let shared_experts = first_usize(cfg, &["n_shared_experts", "num_shared_experts"], 1)?;
    let shared = inter
        .checked_mul(shared_experts)
        .ok_or_else(|| cfg.err("n_shared_experts", "too large"))?;
    let sparse_layers = match d.dense {
        DenseLayers::FirstK(k) => {
            let dense = cfg.usize_or("first_k_dense_replace", k)?;
            (0..num_layers).map(|i| i >= dense).collect()
        }
        DenseLayers::LayerTypes => mlp_layer_types(cfg, num_layers)?,
        DenseLayers::LayerTypesElseFirstK(k) => match cfg.get("mlp_layer_types") {
            Some(_) => mlp_layer_types(cfg, num_layers)?,
            None => {
                let dense = cfg.usize_or("first_k_dense_replace", k)?;
                (0..num_layers).map(|i| i >= dense).collect()
            }
        },
    };
    Ok(MoeSpec {
        num_experts: first_usize(
            cfg,
            &["n_routed_experts", "num_local_experts", "num_experts"],
            d.experts,
        )?,
        top_k: cfg.usize_or("num_experts_per_tok", d.top_k)?,
        expert_intermediate: inter,
        // transformers builds a zero-wide shared expert (adding zeros) for 0 shared experts.
        shared_intermediate: (shared > 0).then_some(shared),
        norm_topk_prob: cfg.bool_or("norm_topk_prob", d.renorm)?,
        sparse_layers,
        router: MoeRouter::Grouped {
            n_group: cfg.usize_or("n_group", d.n_group)?,
            topk_group: cfg.usize_or("topk_group", d.topk_group)?,
            scale: cfg.f64_or("routed_scaling_factor", d.scale)? as f32,
            softmax: d.softmax,
            bias: !d.softmax,
        },
    })
}

/// `mlp_layer_types` (`"dense"` / `"sparse"` per layer) as sparse flags; absent: layer 0
/// dense, the rest sparse.
pub(super) fn mlp_layer_types(cfg: &Cfg<'_>, num_layers: usize) -> Result<Vec<bool>, ModelError> {
    let Some(v) = cfg.get("mlp_layer_types") else {
        return Ok((0..num_layers).map(|i| i > 0).collect());
    };
    let kinds = v.as_array().filter(|a| a.len() == num_layers);
    let sparse: Option<Vec<bool>> = kinds.and_then(|a| {
        a.iter()
            .map(|k| match k.as_str() {
                Some("dense") => Some(false),
                Some("sparse") => Some(true),
                _ => None,
            })
            .collect()
    });
    sparse.ok_or_else(|| {
        let msg = format!("expected {num_layers} entries, each \"dense\" or \"sparse\"");
        cfg.err("mlp_layer_types", msg)
    })
}

/// The layer pattern of an attention-only MoE model (Qwen3-MoE, Mixtral, GLM-4.5,
/// MiniMax-M2): every layer attention with rotary `head_dim` (GLM-4.5: `partial_rotary_factor`
/// of it, default 0.5; MiniMax-M2: `rotary_dim`), the MoE geometry; `None` for other
/// architectures and for a Qwen3-MoE config with `num_experts` 0.
pub(super) fn attention_moe(
    cfg: &Cfg<'_>,
    arch: Architecture,
    head_dim: usize,
) -> Result<Option<HybridSpec>, ModelError> {
    let num_layers = cfg.num_layers()?;
    let (moe, rotary_dim) = match arch {
        Architecture::Qwen3Moe => (qwen_moe(cfg, arch, num_layers)?, head_dim),
        Architecture::Mixtral => (Some(mixtral_moe(cfg, num_layers)?), head_dim),
        Architecture::Glm4Moe => (
            Some(deepseek_moe(cfg, num_layers, &GLM_MOE)?),
            rotary_dim(cfg, head_dim, 0.5)?,
        ),
        Architecture::MiniMaxM2 => (
            Some(minimax_moe(cfg, num_layers)?),
            minimax_rotary_dim(cfg, head_dim)?,
        ),
        Architecture::Dots1 => (Some(deepseek_moe(cfg, num_layers, &DOTS1_MOE)?), head_dim),
        Architecture::ExaoneMoe => (Some(deepseek_moe(cfg, num_layers, &EXAONE_MOE)?), head_dim),
        Architecture::HyV3 => (
            Some(super::hunyuan_config::hy_v3_moe(cfg, num_layers)?),
            head_dim,
        ),
        Architecture::Ernie4_5Moe => (Some(super::ernie_config::moe(cfg, num_layers)?), head_dim),
        Architecture::HunYuanMoEV1 => {
            (Some(super::hunyuan_config::moe(cfg, num_layers)?), head_dim)
        }
        Architecture::Llama4 => (
            Some(super::llama4_config::llama4_moe(cfg, num_layers)?),
            head_dim,
        ),
        _ => (None, head_dim),
    };
    Ok(moe.map(|moe| HybridSpec {
        layers: vec![LayerKind::Attention; num_layers],
        rotary_dim,
        gdn: None,
        moe: Some(moe),
        mamba: None,
        nemotron_moe: None,
        mla: None,
    }))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::{Value, json};

    use super::super::{Architecture, ModelSpec, QkNorm};

    fn parse(v: &Value) -> ModelSpec {
        ModelSpec::from_json(v, Path::new("config.json"), "m".into()).unwrap()
    }

    /// Shaped as Qwen3-30B-A3B's config.json (transformers 4.51 field names).
    fn qwen3_30b_a3b() -> Value {
        json!({
            "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false,
            "decoder_sparse_step": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
            "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
            "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
            "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128,
            "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
            "rms_norm_eps": 1e-6, "rope_scaling": null, "rope_theta": 1000000.0,
            "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
            "use_sliding_window": false, "vocab_size": 151936
        })
    }

    #[test]
    fn qwen3_moe_geometry_and_sparse_layers() {
        let s = parse(&qwen3_30b_a3b());
        let h = s.hybrid.as_ref().unwrap();
        let m = h.moe.as_ref().unwrap();
        assert_eq!(
            (m.num_experts, m.top_k, m.expert_intermediate),
            (128, 8, 768)
        );
        assert!(m.norm_topk_prob && m.shared_intermediate.is_none());
        assert!(m.sparse_layers.iter().all(|&s| s) && m.sparse_layers.len() == 48);
        assert!(s.qk_norm == QkNorm::PerHead && !s.has_recurrent_layers());
        assert_eq!((s.head_dim, h.rotary_dim), (128, 128));
        // transformers 5 saves `num_experts` as `num_local_experts`; sparse step 2 and
        // mlp_only_layers make layers 1 and 5 of 0..6 the MoE ones.
        let mut v = qwen3_30b_a3b();
        let o = v.as_object_mut().unwrap();
        o.remove("num_experts");
        o.remove("norm_topk_prob");
        o.insert("num_local_experts".into(), json!(16));
        o.insert("num_hidden_layers".into(), json!(6));
        o.insert("decoder_sparse_step".into(), json!(2));
        o.insert("mlp_only_layers".into(), json!([3]));
        let s = parse(&v);
        let m = s.hybrid.unwrap().moe.unwrap();
        assert_eq!(m.num_experts, 16);
        assert!(!m.norm_topk_prob, "Qwen3MoeConfig's default");
        let sparse = vec![false, true, false, false, false, true];
        assert_eq!(m.sparse_layers, sparse);
    }

    /// Shaped as Mixtral-8x7B-v0.1's config.json.
    #[test]
    fn mixtral_geometry() {
        let v = json!({
            "architectures": ["MixtralForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
            "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
            "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
            "num_key_value_heads": 8, "num_local_experts": 8, "rope_theta": 1000000.0,
            "router_aux_loss_coef": 0.02, "sliding_window": null, "tie_word_embeddings": false,
            "torch_dtype": "bfloat16", "vocab_size": 32000
        });
        let s = parse(&v);
        assert_eq!(s.architecture, Architecture::Mixtral);
        assert_eq!((s.head_dim, s.rms_norm_eps), (128, 1e-5));
        let m = s.hybrid.unwrap().moe.unwrap();
        assert_eq!(
            (m.num_experts, m.top_k, m.expert_intermediate),
            (8, 2, 14336)
        );
        assert!(m.norm_topk_prob && m.shared_intermediate.is_none());
        let mut windowed = v.clone();
        windowed["sliding_window"] = json!(4096);
        let w = ModelSpec::from_json(&windowed, Path::new("config.json"), "m".into());
        assert_eq!(w.unwrap().sliding_window, Some(4096));
    }

    /// Shaped as Qwen3.5-35B-A3B's export: `Qwen3_5MoeForConditionalGeneration`, the language
    /// model under `text_config` (no `intermediate_size`: every layer is sparse).
    #[test]
    fn qwen3_5_moe_export_runs_its_text_config() {
        let layer_types: Vec<&str> = (0..40)
            .map(|i| match (i + 1) % 4 {
                0 => "full_attention",
                _ => "linear_attention",
            })
            .collect();
        let v = json!({
            "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
            "tie_word_embeddings": false,
            "text_config": {
                "attn_output_gate": true, "dtype": "bfloat16", "head_dim": 256,
                "hidden_act": "silu", "hidden_size": 2048, "layer_types": layer_types,
                "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
                "linear_num_key_heads": 16, "linear_num_value_heads": 32,
                "linear_value_head_dim": 128, "max_position_embeddings": 262144,
                "model_type": "qwen3_5_moe_text", "moe_intermediate_size": 512,
                "num_attention_heads": 16, "num_experts": 256, "num_experts_per_tok": 8,
                "num_hidden_layers": 40, "num_key_value_heads": 2,
                "rope_parameters": {"mrope_interleaved": true, "mrope_section": [11, 11, 10],
                    "partial_rotary_factor": 0.25, "rope_theta": 10000000, "rope_type": "default"},
                "shared_expert_intermediate_size": 512, "vocab_size": 248320
            },
            "vision_config": {"depth": 27, "hidden_size": 1152, "out_hidden_size": 2048}
        });
        let s = parse(&v);
        assert_eq!(s.architecture, Architecture::Qwen3_5Moe);
        let h = s.hybrid.as_ref().unwrap();
        let m = h.moe.as_ref().unwrap();
        assert_eq!(
            (m.num_experts, m.top_k, m.shared_intermediate),
            (256, 8, Some(512))
        );
        assert!(m.norm_topk_prob && m.sparse_layers.iter().all(|&s| s));
        assert_eq!((s.intermediate_size, h.rotary_dim), (512, 64));
        assert!(s.has_recurrent_layers());
    }

    /// GLM-4.5-Air as released (tests/fixtures/released_configs): every field hsx reads.
    #[test]
    fn glm_4_5_air_geometry_router_and_attention() {
        let s = parse(&super::super::released_config("glm-4.5-air.json"));
        assert_eq!(s.architecture, Architecture::Glm4Moe);
        assert_eq!(
            (s.num_layers, s.head_dim, s.intermediate_size),
            (46, 128, 10944)
        );
        assert_eq!((s.qkv_bias, s.o_bias), (true, false));
        assert_eq!(s.qk_norm, QkNorm::None);
        assert_eq!((s.rms_norm_eps, s.rope_theta), (1e-5, 1e6));
        let h = s.hybrid.as_ref().unwrap();
        assert_eq!(h.rotary_dim, 64);
        let m = h.moe.as_ref().unwrap();
        assert_eq!(
            (
                m.num_experts,
                m.top_k,
                m.expert_intermediate,
                m.shared_intermediate
            ),
            (128, 8, 1408, Some(1408))
        );
        assert!(!m.sparse_layers[0] && m.sparse_layers[1..].iter().all(|&s| s));
        let g = m.grouped().unwrap();
        assert_eq!(
            (g.n_group, g.topk_group, g.renorm, g.scale),
            (1, 1, true, 1.0)
        );
        assert!(!s.has_recurrent_layers());
    }

    /// GLM-4.5's fields and Glm4MoeConfig's defaults; a router transformers could not run and
    /// a non-positive scale are refused, naming the field.
    #[test]
    fn glm_4_5_fields_defaults_and_refusals() {
        let mut v = json!({
            "architectures": ["Glm4MoeForCausalLM"], "hidden_size": 5120, "head_dim": 128,
            "intermediate_size": 12288, "num_attention_heads": 96, "num_key_value_heads": 8,
            "num_hidden_layers": 92, "vocab_size": 151552, "first_k_dense_replace": 3,
            "n_routed_experts": 160, "n_shared_experts": 2, "moe_intermediate_size": 1536,
            "routed_scaling_factor": 2.5, "use_qk_norm": true, "n_group": 8, "topk_group": 4,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
                "partial_rotary_factor": 0.25}
        });
        let s = parse(&v);
        assert_eq!(s.qk_norm, QkNorm::PerHead);
        let h = s.hybrid.as_ref().unwrap();
        let m = h.moe.as_ref().unwrap();
        assert_eq!(
            (h.rotary_dim, m.top_k, m.shared_intermediate),
            (32, 8, Some(3072))
        );
        assert_eq!(m.sparse_layers.iter().filter(|&&s| !s).count(), 3);
        let g = m.grouped().unwrap();
        assert_eq!(
            (g.n_group, g.topk_group, g.renorm, g.scale),
            (8, 4, true, 2.5)
        );
        let refused = |v: &Value| {
            let e = ModelSpec::from_json(v, Path::new("config.json"), "m".into()).unwrap_err();
            e.to_string()
        };
        v["n_group"] = json!(7);
        assert!(refused(&v).contains("n_group"), "{}", refused(&v));
        v["n_group"] = json!(8);
        v["routed_scaling_factor"] = json!(0.0);
        assert!(
            refused(&v).contains("routed_scaling_factor"),
            "{}",
            refused(&v)
        );
        v["routed_scaling_factor"] = json!(1.0);
        v["n_shared_experts"] = json!(0);
        let s = parse(&v);
        assert_eq!(s.hybrid.unwrap().moe.unwrap().shared_intermediate, None);
    }
}
