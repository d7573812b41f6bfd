//! The configs of Cohere's families (`CohereConfig`, `Cohere2Config`, `Cohere2MoeConfig`):
//! Llama's fields with LayerNorms of `layer_norm_eps` (1e-5; Cohere 2 MoE's RMSNorms where it
//! names `rms_norm_eps`), tied embeddings, RoPE on interleaved pairs, heads of `hidden / heads`
//! (Cohere 2 MoE: `head_dim`, 128). Cohere 2's layers from `layer_types`, else every
//! `sliding_window_pattern`-th (4) full: the sliding ones with a `sliding_window` (4096) and
//! RoPE, the full ones without RoPE. Cohere 2 MoE's first `first_k_dense_replace` layers dense
//! (`prefix_dense_intermediate_size` wide; full attention with RoPE where
//! `prefix_dense_sliding_window_pattern` is 1), its experts as [`moe`] says.

use super::config::{Architecture, Cfg};
use super::hybrid_config::{DEFAULT_RENORM_EPS, GroupRank, MoeRouter, MoeSpec};
use super::{ModelError, ModelSpec, QkNorm};
use crate::kernels::device::NormKind;

/// What only Cohere's families have.
#[derive(Debug, Clone, PartialEq)]
pub struct CohereSpec {
    /// Cohere 2 MoE's `shared_expert_combination_strategy` `average`: the block's output is
    /// `(routed + shared) / 2` (else their sum).
    pub moe_average: bool,
}

pub(super) fn parse(
    cfg: &Cfg<'_>,
    arch: Architecture,
    name: String,
) -> Result<ModelSpec, ModelError> {
    let mut spec = super::dense_config::dense_spec(cfg, arch, name)?;
    // Command R+: q and k LayerNormed per head, each head with its own weights (Cohere 2's
    // classes have no such field).
    if arch == Architecture::Cohere && cfg.bool_or("use_qk_norm", false)? {
        spec.qk_norm = QkNorm::HeadLayerNorm;
    }
    let rms_eps = (arch == Architecture::Cohere2Moe)
        .then(|| cfg.get("rms_norm_eps").filter(|v| !v.is_null()))
        .flatten();
    (spec.norm, spec.rms_norm_eps) = match rms_eps {
        Some(_) => (NormKind::Rms, cfg.f64_or("rms_norm_eps", 1e-5)?),
        None => (NormKind::Layer, cfg.f64_or("layer_norm_eps", 1e-5)?),
    };
    if arch == Architecture::Cohere2 {
        // Cohere2Config sets head_dim to hidden / heads whatever the config says.
        spec.head_dim = spec.hidden_size / spec.num_heads.max(1);
    }
    spec.mlp_bias = false;
    spec.parallel_residual = true;
    if arch == Architecture::Cohere {
        return Ok(spec);
    }
    let layers = spec.num_layers;
    let dense = dense_layers(cfg, layers)?;
    let rope = (spec.rope_theta, spec.rope_scaling);
    let w = super::olmo_config::layer_windows(cfg, sliding_pattern(cfg, layers)?, 4096, rope)?;
    let force_rope = arch == Architecture::Cohere2Moe
        && cfg.usize_or("prefix_dense_sliding_window_pattern", 1)? == 1;
    let roped = (0..layers).map(|i| w.sliding[i] || (force_rope && dense[i]));
    spec.nope_layers = Some(roped.map(|r| !r).collect());
    spec.windows = Some(w);
    if arch == Architecture::Cohere2Moe {
        let prefix = cfg.usize_opt("prefix_dense_intermediate_size")?;
        spec.intermediate_size = prefix.unwrap_or(spec.intermediate_size);
        let field = "shared_expert_combination_strategy";
        let average = match cfg.str_or(field, "average")? {
            "average" => true,
            "sum" => false,
            other => return Err(cfg.err(field, format!("{other:?} (average / sum)"))),
        };
        // Without shared experts the routed output is the block's, as it is.
        let shared = cfg.usize_or("num_shared_experts", 0)? > 0;
        spec.cohere = Some(CohereSpec {
            moe_average: average && shared,
        });
    }
    Ok(spec)
}

/// Cohere 2 MoE's dense layers: `mlp_layer_types`, else the first `first_k_dense_replace` (0);
/// none for Cohere 2.
fn dense_layers(cfg: &Cfg<'_>, layers: usize) -> Result<Vec<bool>, ModelError> {
    if cfg.architecture()? != Architecture::Cohere2Moe {
        return Ok(vec![false; layers]);
    }
    let sparse = match cfg.get("mlp_layer_types") {
        Some(_) => super::moe_config::mlp_layer_types(cfg, layers)?,
        None => {
            let first = cfg.usize_or("first_k_dense_replace", 0)?;
            (0..layers).map(|i| i >= first).collect()
        }
    };
    Ok(sparse.into_iter().map(|s| !s).collect())
}

/// The sliding layers where the config names no `layer_types`: every
/// `sliding_window_pattern`-th (4) layer full — Cohere 2 MoE's counted after its first
/// `first_k_dense_replace` (0) layers, whose own pattern is `prefix_dense_sliding_window_pattern`
/// (1: all full), as `Cohere2MoeConfig` makes them.
fn sliding_pattern(cfg: &Cfg<'_>, layers: usize) -> Result<Vec<bool>, ModelError> {
    let pattern = |field: &str, default: usize| -> Result<usize, ModelError> {
        match cfg.usize_or(field, default)? {
            0 => Err(cfg.err(field, "must be at least 1")),
            n => Ok(n),
        }
    };
    let every = pattern("sliding_window_pattern", 4)?;
    let (prefix, every_prefix) = match cfg.architecture()? {
        Architecture::Cohere2Moe => (
            cfg.usize_or("first_k_dense_replace", 0)?.min(layers),
            pattern("prefix_dense_sliding_window_pattern", 1)?,
        ),
        _ => (0, 1),
    };
    Ok((0..layers)
        .map(|i| match i < prefix {
            true => !(i + 1).is_multiple_of(every_prefix),
            false => !(i - prefix + 1).is_multiple_of(every),
        })
        .collect())
}

/// Cohere 2 MoE's experts: `num_experts` (8) of `intermediate_size`, the top
/// `num_experts_per_tok` (2) of the router's logits weighted by their softmax (always
/// renormalised) or, with `expert_selection_fn` `sigmoid`, by their sigmoid (renormalised where
/// `norm_topk_prob`), beside `num_shared_experts` (0) shared experts as one MLP.
pub(super) fn moe(cfg: &Cfg<'_>, layers: usize) -> Result<MoeSpec, ModelError> {
    let inter = cfg.usize_req("intermediate_size")?;
    let shared = inter
        .checked_mul(cfg.usize_or("num_shared_experts", 0)?)
        .ok_or_else(|| cfg.err("num_shared_experts", "too large"))?;
    let sigmoid = match cfg.str_or("expert_selection_fn", "softmax")? {
        "softmax" => false,
        "sigmoid" => true,
        other => {
            return Err(cfg.err(
                "expert_selection_fn",
                format!("{other:?} (softmax / sigmoid)"),
            ));
        }
    };
    Ok(MoeSpec {
        num_experts: cfg.usize_or("num_experts", 8)?,
        top_k: cfg.usize_or("num_experts_per_tok", 2)?,
        expert_intermediate: inter,
        shared_intermediate: (shared > 0).then_some(shared),
        norm_topk_prob: !sigmoid || cfg.bool_or("norm_topk_prob", true)?,
        sparse_layers: dense_layers(cfg, layers)?.into_iter().map(|d| !d).collect(),
        // One group, no bias: the top-k of the logits is the top-k of their sigmoid, and the
        // softmax of the top-k logits the renormalised top-k of their softmax.
        router: MoeRouter::Grouped {
            n_group: 1,
            topk_group: 1,
            scale: 1.0,
            softmax: !sigmoid,
            bias: false,
            renorm_eps: DEFAULT_RENORM_EPS,
            group_rank: GroupRank::TopTwoSum,
        },
    })
}

#[cfg(test)]
#[path = "cohere_config_tests.rs"]
mod tests;
