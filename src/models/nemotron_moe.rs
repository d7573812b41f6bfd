//! Nemotron 3's MoE blocks (`moe` / `E` in a Nemotron-H layer pattern): the config fields as
//! transformers' `NemotronHConfig` names them (and their defaults), their checks, and the
//! block's weights (`backbone.layers.{i}.mixer.{gate,experts.{e},shared_experts,fc1_latent_proj,
//! fc2_latent_proj}`). `n_shared_experts` and `moe_shared_expert_overlap` are read by
//! transformers' config only: its model always builds one shared expert, so hsx does too.

use super::config::Cfg;
use super::hybrid_config::LayerKind;
use super::layers::mlp::Activation;
use super::layers::nemotron_moe::Relu2Expert;
use super::layers::{Loader, Mlp, NemotronMoe};
use super::{ModelError, ModelSpec};
use crate::kernels::Device;
use crate::kernels::routing::{GroupRank, GroupedTopK, RouterScore};

/// The MoE geometry and router of a Nemotron 3 model.
#[derive(Debug, Clone, PartialEq)]
pub struct NemotronMoeSpec {
    pub num_experts: usize,
    pub router: GroupedTopK,
    pub expert_intermediate: usize,
    pub shared_intermediate: usize,
    /// `moe_latent_size`: the routed experts run on `fc1_latent_proj(x)`.
    pub latent: Option<usize>,
}

/// The MoE fields of a Nemotron-H config with `moe` blocks in `layers` (else `None`).
pub(super) fn parse(
    cfg: &Cfg<'_>,
    layers: &[LayerKind],
) -> Result<Option<NemotronMoeSpec>, ModelError> {
    if !layers.contains(&LayerKind::Moe) {
        return Ok(None);
    }
    let num_experts = match cfg.usize_opt("n_routed_experts")? {
        Some(n) => n,
        None => cfg.usize_or("num_local_experts", 8)?,
    };
    let scale = cfg.f64_or("routed_scaling_factor", 1.0)?;
    Ok(Some(NemotronMoeSpec {
        num_experts,
        router: GroupedTopK {
            top_k: cfg.usize_or("num_experts_per_tok", 2)?,
            n_group: cfg.usize_or("n_group", 1)?,
            topk_group: cfg.usize_or("topk_group", 1)?,
            renorm: cfg.bool_or("norm_topk_prob", true)?,
            renorm_eps: crate::kernels::routing::DEFAULT_RENORM_EPS,
            group_rank: GroupRank::TopTwoSum,
            scale: scale as f32,
            score: RouterScore::Sigmoid,
        },
        expert_intermediate: cfg.usize_or("moe_intermediate_size", 7688)?,
        shared_intermediate: cfg.usize_or("moe_shared_expert_intermediate_size", 7688)?,
        latent: cfg.usize_opt("moe_latent_size")?,
    }))
}

/// The geometry: `Err((field, why))`.
pub(super) fn check(m: &NemotronMoeSpec, hidden: usize) -> Result<(), (&'static str, String)> {
    if m.num_experts == 0 {
        return Err(("n_routed_experts", "must be > 0".into()));
    }
    m.router
        .group_size(m.num_experts)
        .map_err(|e| ("n_group", e))?;
    if m.expert_intermediate == 0 || m.shared_intermediate == 0 {
        let msg = format!(
            "expert {} / shared expert {}: both must be > 0",
            m.expert_intermediate, m.shared_intermediate
        );
        return Err(("moe_intermediate_size", msg));
    }
    if !(m.router.scale.is_finite() && m.router.scale > 0.0) {
        let msg = format!("{} must be a positive number", m.router.scale);
        return Err(("routed_scaling_factor", msg));
    }
    match m.latent {
        // The experts' rows share the hidden-wide MoE buffers.
        Some(l) if l == 0 || l > hidden => Err((
            "moe_latent_size",
            format!("{l} (hsx runs latent sizes 1..={hidden}, the hidden size)"),
        )),
        _ => Ok(()),
    }
}

/// The MoE block of `{px}` (`backbone.layers.{i}.mixer`).
pub(super) fn load<D: Device>(
    ld: &Loader<'_, D>,
    px: &str,
    spec: &ModelSpec,
    m: &NemotronMoeSpec,
) -> Result<NemotronMoe<D>, ModelError> {
    let (h, b) = (spec.hidden_size, spec.mlp_bias);
    let width = m.latent.unwrap_or(h);
    let inter = m.expert_intermediate;
    let experts = (0..m.num_experts)
        .map(|e| {
            let x = format!("{px}.experts.{e}");
            Ok(Relu2Expert {
                up: ld.linear1(&format!("{x}.up_proj"), inter, width, false)?,
                down: ld.linear1(&format!("{x}.down_proj"), width, inter, false)?,
            })
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    let latent = match m.latent {
        Some(l) => Some((
            ld.linear1(&format!("{px}.fc1_latent_proj"), l, h, b)?,
            ld.linear1(&format!("{px}.fc2_latent_proj"), h, l, b)?,
        )),
        None => None,
    };
    let si = m.shared_intermediate;
    Ok(NemotronMoe {
        router: ld.linear1(&format!("{px}.gate"), m.num_experts, h, false)?,
        bias: ld.vector(&format!("{px}.gate.e_score_correction_bias"), m.num_experts)?,
        choice: m.router,
        experts,
        latent,
        width,
        inter,
        shared: Mlp {
            up: ld.linear1(&format!("{px}.shared_experts.up_proj"), si, h, b)?,
            down: ld.linear1(&format!("{px}.shared_experts.down_proj"), h, si, b)?,
            act: Activation::Relu2,
            inter: si,
        },
    })
}
