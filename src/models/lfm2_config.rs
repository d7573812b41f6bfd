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
//!
//! LFM3 (`Lfm3Config`) adds `sliding_attention` layers (a `sliding_window` of 256) to the kinds
//! — by default layer i is full where i % 4 == 2, sliding where i % 4 == 0 (past 0), else a
//! short convolution (`conv_L_cache` 7) — each kind's RoPE from `rope_parameters` (sliding:
//! theta 10⁴; full: proportional over half of each head, theta 10⁶), heads of `head_dim` (128),
//! Qwen3's attention (`attention_bias`) with a sigmoid gate per head (`use_attention_gate`),
//! sandwich norms (`use_sandwich_norm`) and an MLP of `intermediate_size` (7680) as it is;
//! `tie_embedding` is not read (its class does not pop it).

use super::config::{Architecture, Cfg};
use super::gemma4_config::kind_ropes;
use super::hybrid_config::{GroupRank, HybridSpec, LayerKind, MoeRouter, MoeSpec};
use super::{Gemma4Rope, ModelError, ModelSpec, QkNorm};

/// What only LFM2's families have: the short convolutions' geometry, LFM3's attention.
#[derive(Debug, Clone, PartialEq)]
pub struct Lfm2Spec {
    /// `conv_L_cache`: the conv's taps (its window is one fewer inputs).
    pub conv_kernel: usize,
    /// `conv_bias`: the conv and both projections of a short-conv layer are biased.
    pub conv_bias: bool,
    /// LFM3's (`None`: LFM2's attention, full and with one RoPE).
    pub lfm3: Option<Lfm3Attention>,
}

/// LFM3's attention layers.
#[derive(Debug, Clone, PartialEq)]
pub struct Lfm3Attention {
    /// Per layer: a sliding attention layer.
    pub sliding: Vec<bool>,
    pub window: usize,
    /// The sliding layers' RoPE, the full layers'.
    pub ropes: (Gemma4Rope, Gemma4Rope),
    /// `use_attention_gate`: each head's output times `sigmoid(g_proj(x))`.
    pub gate: bool,
    /// `use_sandwich_norm`: each sublayer's output RMS-normed before the residual add.
    pub sandwich: bool,
}

/// `Lfm2MoeSparseMoeBlock`'s renormalising epsilon.
const MOE_RENORM_EPS: f32 = 1e-6;

/// A config class's defaults: (hidden, layers, heads, KV heads, vocab, conv taps).
fn defaults(arch: Architecture) -> (usize, usize, usize, usize, usize, usize) {
    match arch {
        Architecture::Lfm2Moe => (2048, 32, 32, 8, 65536, 3),
        Architecture::Lfm3 => (2048, 24, 16, 4, 128_000, 7),
        _ => (2560, 32, 32, 8, 65536, 3),
    }
}

pub(super) fn parse(
    cfg: &Cfg<'_>,
    arch: Architecture,
    name: String,
) -> Result<ModelSpec, ModelError> {
    let (hidden, layers, heads, kv_heads, vocab, taps) = defaults(arch);
    let hidden_size = cfg.usize_or("hidden_size", hidden)?;
    let num_heads = cfg.usize_or("num_attention_heads", heads)?;
    let num_layers = cfg.num_layers_or(layers)?;
    let default_head_dim = match arch {
        Architecture::Lfm3 => 128,
        _ => hidden_size / num_heads.max(1),
    };
    let head_dim = cfg.usize_or("head_dim", default_head_dim)?;
    let conv_kernel = cfg.usize_or("conv_L_cache", taps)?;
    if conv_kernel < 2 {
        // A window of no inputs: no release has one.
        return Err(cfg.err("conv_L_cache", format!("{conv_kernel} (at least 2)")));
    }
    let kinds = layer_kinds(cfg, arch, num_layers)?;
    let moe = match arch == Architecture::Lfm2Moe {
        true => Some(moe(cfg, num_layers)?),
        false => None,
    };
    let (rope_theta, rope_scaling) = match arch {
        // Per kind (`Lfm3Attention::ropes`).
        Architecture::Lfm3 => (1e6, super::RopeScaling::None),
        _ => cfg.rope(arch)?,
    };
    let lfm3 = match arch {
        Architecture::Lfm3 => Some(lfm3_attention(cfg, &kinds)?),
        _ => None,
    };
    // `Lfm2Config` / `Lfm2MoeConfig` pop `tie_embedding` over `tie_word_embeddings`.
    let tie = match cfg
        .get("tie_embedding")
        .filter(|_| arch != Architecture::Lfm3)
    {
        Some(_) => cfg.bool_or("tie_embedding", true)?,
        None => cfg.bool_or("tie_word_embeddings", true)?,
    };
    let biased = arch == Architecture::Lfm3 && cfg.bool_or("attention_bias", false)?;
    Ok(ModelSpec {
        vocab_size: cfg.usize_or("vocab_size", vocab)?,
        hidden_size,
        num_layers,
        num_heads,
        num_kv_heads: cfg.usize_or("num_key_value_heads", kv_heads)?,
        head_dim,
        intermediate_size: match arch {
            Architecture::Lfm2Moe => cfg.usize_or("intermediate_size", 7168)?,
            Architecture::Lfm3 => cfg.usize_or("intermediate_size", 7680)?,
            _ => mlp_width(cfg)?,
        },
        // `Lfm3Config` maps `rms_norm_eps` onto `norm_eps`.
        rms_norm_eps: match cfg.get("norm_eps") {
            None if arch == Architecture::Lfm3 => cfg.f64_or("rms_norm_eps", 1e-5)?,
            _ => cfg.f64_or("norm_eps", 1e-5)?,
        },
        rope_theta,
        rope_scaling,
        qkv_bias: biased,
        o_bias: biased,
        qk_norm: QkNorm::PerHead,
        tie_word_embeddings: tie,
        max_position_embeddings: cfg.usize_or("max_position_embeddings", 128_000)?,
        dtype: cfg.dtype()?.unwrap_or(super::WeightDtype::F32),
        hybrid: Some(HybridSpec {
            layers: kinds.iter().map(|k| k.layer_kind()).collect(),
            rotary_dim: head_dim,
            gdn: None,
            moe,
            mamba: None,
            nemotron_moe: None,
            mamba1: None,
            mla: None,
        }),
        lfm2: Some(Lfm2Spec {
            conv_kernel,
            conv_bias: cfg.bool_or("conv_bias", false)?,
            lfm3,
        }),
        ..ModelSpec::base(name, arch)
    })
}

/// A layer's `layer_types` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Conv,
    Full,
    Sliding,
}

impl Kind {
    fn layer_kind(self) -> LayerKind {
        match self {
            Self::Conv => LayerKind::ShortConv,
            Self::Full | Self::Sliding => LayerKind::Attention,
        }
    }
}

/// LFM3's attention: the sliding layers' window, each kind's RoPE (`Lfm3Config`'s defaults:
/// sliding theta 10⁴, full proportional over half of each head with theta 10⁶), the gate and
/// the sandwich norms (both on by default).
fn lfm3_attention(cfg: &Cfg<'_>, kinds: &[Kind]) -> Result<Lfm3Attention, ModelError> {
    let sliding: Vec<bool> = kinds.iter().map(|&k| k == Kind::Sliding).collect();
    let window = super::olmo_config::window_of(cfg, 256, &sliding)?;
    let global = Gemma4Rope::Proportional {
        theta: 1e6,
        partial: 0.5,
        factor: 1.0,
    };
    Ok(Lfm3Attention {
        sliding,
        window,
        ropes: kind_ropes(cfg, (Gemma4Rope::Default { theta: 1e4 }, global))?,
        gate: cfg.bool_or("use_attention_gate", true)?,
        sandwich: cfg.bool_or("use_sandwich_norm", true)?,
    })
}

/// Each layer's kind: `layer_types`, else the class's pattern — LFM3's, or (LFM2) attention at
/// `full_attn_idxs` (every layer where it names none, as `Lfm2Config` makes it) and short
/// convolutions elsewhere; LFM2-MoE has none.
fn layer_kinds(cfg: &Cfg<'_>, arch: Architecture, layers: usize) -> Result<Vec<Kind>, ModelError> {
    let field = "layer_types";
    if let Some(v) = cfg.get(field) {
        let list = v
            .as_array()
            .ok_or_else(|| cfg.err(field, "expected a list"))?;
        let sliding_ok = arch == Architecture::Lfm3;
        return (list.iter())
            .map(|t| match t.as_str() {
                Some("full_attention") => Ok(Kind::Full),
                Some("conv") => Ok(Kind::Conv),
                Some("sliding_attention") if sliding_ok => Ok(Kind::Sliding),
                _ => Err(cfg.err(
                    field,
                    format!(
                        "{t} (full_attention / conv{})",
                        match sliding_ok {
                            true => " / sliding_attention",
                            false => "",
                        }
                    ),
                )),
            })
            .collect();
    }
    match arch {
        // Lfm2MoeConfig has no default: its model cannot be built without them.
        Architecture::Lfm2Moe => return Err(cfg.err(field, "missing")),
        Architecture::Lfm3 => {
            return Ok((0..layers)
                .map(|i| match i % 4 {
                    2 => Kind::Full,
                    0 if i > 0 => Kind::Sliding,
                    _ => Kind::Conv,
                })
                .collect());
        }
        _ => {}
    }
    let mut kinds = match cfg.get("full_attn_idxs") {
        None => return Ok(vec![Kind::Full; layers]),
        Some(_) => vec![Kind::Conv; layers],
    };
    let field = "full_attn_idxs";
    let list = (cfg.get(field).and_then(|v| v.as_array()))
        .ok_or_else(|| cfg.err(field, "expected a list"))?;
    for i in list {
        match i.as_u64().map(|i| i as usize).filter(|&i| i < layers) {
            Some(i) => kinds[i] = Kind::Full,
            None => return Err(cfg.err(field, format!("{i} is not a layer"))),
        }
    }
    Ok(kinds)
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
            group_rank: GroupRank::TopTwoSum,
        },
    })
}

#[cfg(test)]
#[path = "lfm2_config_tests.rs"]
mod tests;
