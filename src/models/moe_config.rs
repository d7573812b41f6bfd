//! The MoE fields of `config.json` -> [`MoeSpec`], for the families with routed experts:
//! Qwen3-Next and Qwen3.5-MoE (hybrid layers, a gated shared expert), Qwen3-MoE and Mixtral
//! (attention-only layers, no shared expert). Defaults are the transformers config classes'.

use super::ModelError;
use super::config::{Architecture, Cfg};
use super::hybrid_config::{HybridSpec, LayerKind, MoeSpec, first_usize};

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
    // Qwen3.5-MoE makes every layer sparse and always renormalises (its config has neither
    // field; transformers would ignore them).
    let (norm_topk_prob, sparse_layers) = match arch {
        Architecture::Qwen3_5Moe => (true, vec![true; num_layers]),
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
    })
}

/// The layer pattern of an attention-only MoE model (Qwen3-MoE, Mixtral): every layer
/// attention with full rotary `head_dim`, the MoE geometry; `None` for other architectures
/// and for a Qwen3-MoE config with `num_experts` 0.
pub(super) fn attention_moe(
    cfg: &Cfg<'_>,
    arch: Architecture,
    head_dim: usize,
) -> Result<Option<HybridSpec>, ModelError> {
    let num_layers = cfg.num_layers()?;
    let moe = match arch {
        Architecture::Qwen3Moe => qwen_moe(cfg, arch, num_layers)?,
        Architecture::Mixtral => Some(mixtral_moe(cfg, num_layers)?),
        _ => None,
    };
    Ok(moe.map(|moe| HybridSpec {
        layers: vec![LayerKind::Attention; num_layers],
        rotary_dim: head_dim,
        gdn: None,
        moe: Some(moe),
        mamba: None,
    }))
}
