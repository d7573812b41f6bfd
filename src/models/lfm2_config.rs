//! The configs of LFM2 (`Lfm2Config`) and LFM2-MoE (`Lfm2MoeConfig`): `layer_types` (`conv` /
//! `full_attention`; LFM2's default from `full_attn_idxs`, else every layer attention), the
//! short convolutions' `conv_L_cache` (3) and `conv_bias`, RMSNorms of `norm_eps` (1e-5),
//! heads of `hidden / heads`, RoPE theta 10⁶, tied embeddings (`tie_embedding` wins over
//! `tie_word_embeddings`, as the config class pops it). LFM2's MLP width is `block_ff_dim`
//! (else `intermediate_size`) adjusted as `Lfm2MLP` does where `block_auto_adjust_ff_dim`:
//! two thirds, times `block_ffn_dim_multiplier`, rounded up to `block_multiple_of`.
//! LFM2-MoE's first `num_dense_layers` (2) MLPs are `intermediate_size` wide as they are, the
//! rest `num_experts` (32) experts of `moe_intermediate_size`, the top `num_experts_per_tok` (4)
//! of their sigmoid scores (ranked with `expert_bias` where `use_expert_bias`), renormalised
//! over their sum + 1e-6 where `norm_topk_prob`, times `routed_scaling_factor`.

use super::config::{Architecture, Cfg};
use super::hybrid_config::{HybridSpec, LayerKind, MoeRouter, MoeSpec};
use super::{ModelError, ModelSpec, QkNorm};

/// What only LFM2's families have: the short convolutions' geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lfm2Spec {
    /// `conv_L_cache`: the conv's taps (its window is one fewer inputs).
    pub conv_kernel: usize,
    /// `conv_bias`: the conv and both projections of a short-conv layer are biased.
    pub conv_bias: bool,
}

/// `Lfm2MoeSparseMoeBlock`'s renormalising epsilon.
const MOE_RENORM_EPS: f32 = 1e-6;

pub(super) fn parse(
    cfg: &Cfg<'_>,
    arch: Architecture,
    name: String,
) -> Result<ModelSpec, ModelError> {
    let moe_family = arch == Architecture::Lfm2Moe;
    let hidden_size = cfg.usize_or("hidden_size", if moe_family { 2048 } else { 2560 })?;
    let num_heads = cfg.usize_or("num_attention_heads", 32)?;
    let num_layers = cfg.num_layers_or(32)?;
    let head_dim = cfg.usize_or("head_dim", hidden_size / num_heads.max(1))?;
    let conv_kernel = cfg.usize_or("conv_L_cache", 3)?;
    if conv_kernel < 2 {
        // A window of no inputs: no release has one.
        return Err(cfg.err("conv_L_cache", format!("{conv_kernel} (at least 2)")));
    }
    let layers = layer_kinds(cfg, arch, num_layers)?;
    let moe = match moe_family {
        true => Some(moe(cfg, num_layers)?),
        false => None,
    };
    let (rope_theta, rope_scaling) = cfg.rope(arch)?;
    let tie = match cfg.get("tie_embedding") {
        Some(_) => cfg.bool_or("tie_embedding", true)?,
        None => cfg.bool_or("tie_word_embeddings", true)?,
    };
    Ok(ModelSpec {
        vocab_size: cfg.usize_or("vocab_size", 65536)?,
        hidden_size,
        num_layers,
        num_heads,
        num_kv_heads: cfg.usize_or("num_key_value_heads", 8)?,
        head_dim,
        intermediate_size: match moe_family {
            true => cfg.usize_or("intermediate_size", 7168)?,
            false => mlp_width(cfg)?,
        },
        rms_norm_eps: cfg.f64_or("norm_eps", 1e-5)?,
        rope_theta,
        rope_scaling,
        qk_norm: QkNorm::PerHead,
        tie_word_embeddings: tie,
        max_position_embeddings: cfg.usize_or("max_position_embeddings", 128_000)?,
        dtype: cfg.dtype()?.unwrap_or(super::WeightDtype::F32),
        hybrid: Some(HybridSpec {
            layers,
            rotary_dim: head_dim,
            gdn: None,
            moe,
            mamba: None,
            nemotron_moe: None,
            mla: None,
        }),
        lfm2: Some(Lfm2Spec {
            conv_kernel,
            conv_bias: cfg.bool_or("conv_bias", false)?,
        }),
        ..ModelSpec::base(name, arch)
    })
}

/// Each layer's kind: `layer_types`, else (LFM2 only) attention at `full_attn_idxs` (every
/// layer where it names none, as `Lfm2Config` makes it) and short convolutions elsewhere.
fn layer_kinds(
    cfg: &Cfg<'_>,
    arch: Architecture,
    layers: usize,
) -> Result<Vec<LayerKind>, ModelError> {
    let field = "layer_types";
    if let Some(v) = cfg.get(field) {
        let list = v
            .as_array()
            .ok_or_else(|| cfg.err(field, "expected a list"))?;
        return (list.iter())
            .map(|t| match t.as_str() {
                Some("full_attention") => Ok(LayerKind::Attention),
                Some("conv") => Ok(LayerKind::ShortConv),
                _ => Err(cfg.err(field, format!("{t} (full_attention / conv)"))),
            })
            .collect();
    }
    if arch == Architecture::Lfm2Moe {
        // Lfm2MoeConfig has no default: its model cannot be built without them.
        return Err(cfg.err(field, "missing"));
    }
    let attention = match cfg.get("full_attn_idxs") {
        None => vec![true; layers],
        Some(v) => {
            let list =
                (v.as_array()).ok_or_else(|| cfg.err("full_attn_idxs", "expected a list"))?;
            let mut attention = vec![false; layers];
            for i in list {
                match i.as_u64().map(|i| i as usize).filter(|&i| i < layers) {
                    Some(i) => attention[i] = true,
                    None => return Err(cfg.err("full_attn_idxs", format!("{i} is not a layer"))),
                }
            }
            attention
        }
    };
    Ok(attention
        .into_iter()
        .map(|a| match a {
            true => LayerKind::Attention,
            false => LayerKind::ShortConv,
        })
        .collect())
}

/// LFM2's MLP width as `Lfm2MLP` computes it.
fn mlp_width(cfg: &Cfg<'_>) -> Result<usize, ModelError> {
    // `Lfm2Config` pops `block_ff_dim` into `intermediate_size`.
    let width = match cfg.usize_opt("block_ff_dim")? {
        Some(w) => w,
        None => cfg.usize_or("intermediate_size", 12288)?,
    };
    if !cfg.bool_or("block_auto_adjust_ff_dim", true)? {
        return Ok(width);
    }
    let width = (2.0 * width as f64 / 3.0) as usize;
    let field = "block_ffn_dim_multiplier";
    if cfg.is_null(field) {
        return Ok(width);
    }
    let width = (cfg.f64_or(field, 1.0)? * width as f64) as usize;
    let multiple = cfg.usize_or("block_multiple_of", 256)?;
    if multiple == 0 {
        return Err(cfg.err("block_multiple_of", "must be at least 1"));
    }
    Ok(width.div_ceil(multiple) * multiple)
}

/// LFM2-MoE's experts after its dense layers.
fn moe(cfg: &Cfg<'_>, layers: usize) -> Result<MoeSpec, ModelError> {
    let dense = cfg.usize_or("num_dense_layers", 2)?;
    Ok(MoeSpec {
        num_experts: cfg.usize_or("num_experts", 32)?,
        top_k: cfg.usize_or("num_experts_per_tok", 4)?,
        expert_intermediate: cfg.usize_or("moe_intermediate_size", 1792)?,
        shared_intermediate: None,
        norm_topk_prob: cfg.bool_or("norm_topk_prob", true)?,
        sparse_layers: (0..layers).map(|i| i >= dense).collect(),
        router: MoeRouter::Grouped {
            n_group: 1,
            topk_group: 1,
            scale: cfg.f64_or("routed_scaling_factor", 1.0)? as f32,
            softmax: false,
            bias: cfg.bool_or("use_expert_bias", true)?,
            renorm_eps: MOE_RENORM_EPS,
        },
    })
}

#[cfg(test)]
#[path = "lfm2_config_tests.rs"]
mod tests;
