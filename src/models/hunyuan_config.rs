//! HunYuan's config fields beyond Llama's (`HunYuanDenseV1Config`, `HunYuanMoEV1Config`): its
//! NTK-alpha RoPE, its experts, and the release fields transformers does not run (refused).
//! The rest (per-head q / k norms after RoPE, `head_dim`) is read by `dense_config`. Also HY
//! V3's experts (`HYV3Config`), Tencent's next family.

use super::ModelError;
use super::config::{Architecture, Cfg};
use super::hybrid_config::{MoeRouter, MoeSpec, first_usize};
use crate::kernels::dtype::RopeScaling;

/// (theta, scaling) of HunYuan's RoPE: `dynamic` with an `alpha` (the releases' NTK-alpha, which
/// transformers runs as `ntk_alpha`) is plain RoPE at the fixed base
/// `rope_theta · alpha^(head_dim / (head_dim - 2))`; other types as every family reads them
/// (`dynamic` without `alpha`, a length-dependent scaling, is refused there).
pub(super) fn rope(
    cfg: &Cfg<'_>,
    arch: Architecture,
    head_dim: usize,
) -> Result<(f64, RopeScaling), ModelError> {
    refuse_cla(cfg)?;
    let Some((field, params)) = cfg.rope_object() else {
        return cfg.rope(arch);
    };
    let sub = |k: &str| params.get(k).filter(|v| !v.is_null());
    let kind = sub("rope_type")
        .or_else(|| sub("type"))
        .and_then(|v| v.as_str());
    // Python's truthiness: an alpha of 0 counts as none.
    let alpha = sub("alpha").and_then(|v| v.as_f64()).filter(|&a| a != 0.0);
    let (Some("dynamic"), Some(alpha)) = (kind, alpha) else {
        return cfg.rope(arch);
    };
    let theta = match sub("rope_theta") {
        Some(v) => v.as_f64(),
        None => Some(cfg.f64_or("rope_theta", 10000.0)?),
    };
    let base = theta
        .filter(|_| head_dim > 2)
        .map(|t| t * alpha.powf(head_dim as f64 / (head_dim as f64 - 2.0)))
        .filter(|b| b.is_finite() && *b > 0.0);
    let msg = format!("alpha {alpha} over heads of {head_dim}: no finite positive RoPE base");
    let base = base.ok_or_else(|| cfg.err(field, msg))?;
    Ok((base, RopeScaling::None))
}

/// Cross-layer attention (`use_cla`: layers reading an earlier layer's keys and values), which
/// the releases turn off and transformers does not build.
fn refuse_cla(cfg: &Cfg<'_>) -> Result<(), ModelError> {
    match cfg.bool_or("use_cla", false)? {
        true => Err(ModelError::Unsupported {
            path: cfg.path_buf(),
            what: "HunYuan's cross-layer attention (use_cla)".into(),
        }),
        false => Ok(()),
    }
}

/// HunYuan-MoE's experts (`HunYuanMoEV1Config`): in every layer `num_experts` (alias
/// `num_local_experts`) of `intermediate_size`, the top `moe_topk` (alias
/// `num_experts_per_tok`; a per-layer list of one value, as released) of the softmax of
/// `gate.wg`'s logits, renormalised, beside one shared MLP of `intermediate_size`
/// (`shared_mlp`). The releases' `moe_intermediate_size` and `num_shared_expert` are not read:
/// transformers sizes experts and shared MLP by `intermediate_size`.
pub(super) fn moe(cfg: &Cfg<'_>, num_layers: usize) -> Result<MoeSpec, ModelError> {
    let inter = cfg.usize_req("intermediate_size")?;
    Ok(MoeSpec {
        num_experts: first_usize(cfg, &["num_experts", "num_local_experts"], 1)?,
        top_k: top_k(cfg)?,
        expert_intermediate: inter,
        shared_intermediate: Some(inter),
        norm_topk_prob: true,
        sparse_layers: vec![true; num_layers],
        router: MoeRouter::HunYuan,
    })
}

/// `moe_topk`: a number, or a per-layer list of one value (hsx runs one top-k per model).
fn top_k(cfg: &Cfg<'_>) -> Result<usize, ModelError> {
    let field = ["moe_topk", "num_experts_per_tok"]
        .into_iter()
        .find(|f| cfg.get(f).is_some_and(|v| !v.is_null()));
    let Some(field) = field else {
        return Ok(1);
    };
    let Some(list) = cfg.get(field).and_then(|v| v.as_array()) else {
        return cfg.usize_req(field);
    };
    let values: Option<Vec<u64>> = list.iter().map(|v| v.as_u64()).collect();
    match values.as_deref() {
        Some([first, rest @ ..]) if rest.iter().all(|v| v == first) => Ok(*first as usize),
        _ => Err(cfg.err(field, "expected a number or a list of one number per layer")),
    }
}

/// HY V3's experts (`HYV3Config`): `num_experts` (192) of `moe_intermediate_size` (1536), the
/// top `num_experts_per_tok` (8) of the sigmoid of the logits ranked with
/// `e_score_correction_bias`, renormalised and times `router_scaling_factor` (2.826), beside
/// `num_shared_experts` (1) shared experts as one plain MLP; the dense layers by
/// `mlp_layer_types` (default: layer 0).
pub(super) fn hy_v3_moe(cfg: &Cfg<'_>, num_layers: usize) -> Result<MoeSpec, ModelError> {
    let inter = cfg.usize_or("moe_intermediate_size", 1536)?;
    let shared = inter
        .checked_mul(cfg.usize_or("num_shared_experts", 1)?)
        .ok_or_else(|| cfg.err("num_shared_experts", "too large"))?;
    Ok(MoeSpec {
        num_experts: first_usize(cfg, &["num_experts", "num_local_experts"], 192)?,
        top_k: cfg.usize_or("num_experts_per_tok", 8)?,
        expert_intermediate: inter,
        // transformers builds a zero-wide shared MLP (adding zeros) for 0 shared experts.
        shared_intermediate: (shared > 0).then_some(shared),
        norm_topk_prob: true,
        sparse_layers: super::moe_config::mlp_layer_types(cfg, num_layers)?,
        router: MoeRouter::sigmoid(cfg.f64_or("router_scaling_factor", 2.826)? as f32),
    })
}

#[cfg(test)]
#[path = "hunyuan_config_tests.rs"]
mod tests;
