//! The MoE fields of `config.json` -> [`MoeSpec`], for the families with routed experts:
//! Qwen3-Next and Qwen3.5-MoE (hybrid layers, a gated shared expert), Qwen3-MoE and Mixtral
//! (attention-only layers, no shared expert), GLM-4.5 (attention-only layers, DeepSeek-V3's
//! grouped sigmoid router, a plain shared expert), MiniMax-M2 (attention-only layers, a
//! sigmoid router with a correction bias, no shared expert). Defaults are the transformers
//! config classes'.

use super::ModelError;
use super::config::{Architecture, Cfg};
use super::hybrid_config::{
    DEFAULT_RENORM_EPS, GroupRank, HybridSpec, LayerKind, MoeRouter, MoeSpec, first_usize,
    rotary_dim,
};
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
        Architecture::Qwen2Moe => (60, 4, 1408, false),
        Architecture::Mellum => (64, 8, 896, true),
        _ => (128, 8, 768, false),
    };
    // Qwen3MoeConfig maps `num_experts` to `num_local_experts`, the name transformers 5 saves.
    let num_experts = first_usize(cfg, &["num_experts", "num_local_experts"], experts)?;
    if num_experts == 0 {
        return Ok(None);
    }
    let shared = match arch {
        Architecture::Qwen3Moe | Architecture::Mellum => None,
        Architecture::Qwen2Moe => Some(cfg.usize_or("shared_expert_intermediate_size", 5632)?),
        _ => Some(cfg.usize_or("shared_expert_intermediate_size", 512)?),
    };
    // Qwen3.5-MoE and Qwen4-Exp make every layer sparse and always renormalise (its config has neither
    // field; transformers would ignore them).
    let (norm_topk_prob, sparse_layers) = match arch {
        Architecture::Qwen3_5Moe | Architecture::Qwen4Exp => (true, vec![true; num_layers]),
        // MellumConfig: `mlp_layer_types`, else every layer sparse.
        Architecture::Mellum => (
            cfg.bool_or("norm_topk_prob", renorm)?,
            match cfg.get("mlp_layer_types") {
                Some(_) => mlp_layer_types(cfg, num_layers)?,
                None => vec![true; num_layers],
            },
        ),
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

/// OLMoE's and FlexOlmo's: `num_experts` (alias `num_local_experts`) of `intermediate_size`
/// in every layer, top `num_experts_per_tok` of the softmax, renormalised where
/// `norm_topk_prob` (default false), no shared expert; `(experts, top_k)` the class defaults.
fn olmoe_moe(
    cfg: &Cfg<'_>,
    num_layers: usize,
    (experts, top_k): (usize, usize),
) -> Result<MoeSpec, ModelError> {
    Ok(MoeSpec {
        num_experts: first_usize(cfg, &["num_experts", "num_local_experts"], experts)?,
        top_k: cfg.usize_or("num_experts_per_tok", top_k)?,
        expert_intermediate: cfg.usize_req("intermediate_size")?,
        shared_intermediate: None,
        norm_topk_prob: cfg.bool_or("norm_topk_prob", false)?,
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
    /// None (`SolarOpenConfig`, which has no `first_k_dense_replace`).
    None,
    /// Those `mlp_layer_types` names `"dense"`, else all but layers from
    /// `first_k_dense_replace` (this default) on at multiples of `moe_layer_freq` (1):
    /// `AXK1Config`.
    LayerTypesElseFirstKEvery(usize),
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

/// `SolarOpenConfig`'s: GLM-4.5's router, experts in every layer.
pub(super) const SOLAR_OPEN_MOE: DeepseekMoeDefaults = DeepseekMoeDefaults {
    inter: 1280,
    dense: DenseLayers::None,
    ..GLM_MOE
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

/// `DeepseekV2Config`'s: softmax scores, no groups (`topk_method` `greedy`: what
/// `deepseek_config` accepts), never renormalised; `num_experts_per_tok` has no default.
pub(super) const DEEPSEEK_V2_MOE: DeepseekMoeDefaults = DeepseekMoeDefaults {
    experts: 64,
    top_k: 0,
    inter: 1407,
    scale: 1.0,
    n_group: 1,
    topk_group: 1,
    dense: DenseLayers::FirstK(0),
    softmax: true,
    renorm: false,
};

/// `AXK1Config`'s (A.X K1's geometry).
pub(super) const AXK1_MOE: DeepseekMoeDefaults = DeepseekMoeDefaults {
    experts: 192,
    dense: DenseLayers::LayerTypesElseFirstKEvery(1),
    ..DEEPSEEK_V3_MOE
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
        DenseLayers::None => vec![true; num_layers],
        DenseLayers::LayerTypesElseFirstKEvery(k) => match cfg.get("mlp_layer_types") {
            Some(_) => mlp_layer_types(cfg, num_layers)?,
            None => {
                let dense = cfg.usize_or("first_k_dense_replace", k)?;
                let every = cfg.usize_or("moe_layer_freq", 1)?;
                if every == 0 {
                    return Err(cfg.err("moe_layer_freq", "must be at least 1"));
                }
                (0..num_layers)
                    .map(|i| i >= dense && i.is_multiple_of(every))
                    .collect()
            }
        },
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
            renorm_eps: DEFAULT_RENORM_EPS,
            group_rank: GroupRank::TopTwoSum,
        },
    })
}

/// Llama's RoPE over the whole head (Solar Open's attention): a `partial_rotary_factor` below
/// 1, which transformers' Llama attention cannot apply (the tables are narrower than the
/// heads), refused.
fn whole_head_rotary(cfg: &Cfg<'_>, head_dim: usize) -> Result<usize, ModelError> {
    match rotary_dim(cfg, head_dim, 1.0)? {
        d if d == head_dim => Ok(d),
        d => Err(cfg.err(
            "partial_rotary_factor",
            format!("rotates {d} of {head_dim} dims; Llama's attention rotates whole heads"),
        )),
    }
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
        Architecture::Qwen3Moe | Architecture::Qwen2Moe | Architecture::Mellum => {
            (qwen_moe(cfg, arch, num_layers)?, head_dim)
        }
        Architecture::Olmoe => (Some(olmoe_moe(cfg, num_layers, (64, 8))?), head_dim),
        Architecture::Afmoe => (Some(super::afmoe_config::moe(cfg, num_layers)?), head_dim),
        Architecture::Cohere2Moe => (Some(super::cohere_config::moe(cfg, num_layers)?), head_dim),
        Architecture::FlexOlmo => (Some(olmoe_moe(cfg, num_layers, (7, 5))?), head_dim),
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
        Architecture::SolarOpen => (
            Some(deepseek_moe(cfg, num_layers, &SOLAR_OPEN_MOE)?),
            whole_head_rotary(cfg, head_dim)?,
        ),
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
        mamba1: None,
        mla: None,
    }))
}

#[cfg(test)]
#[path = "moe_config_tests.rs"]
mod tests;
