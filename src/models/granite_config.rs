//! Granite's configs. `GraniteConfig` (Granite 3.x, `GraniteForCausalLM`) is Llama's plus the
//! multipliers ([`GraniteSpec`]), read by the dense reader. `GraniteMoeHybridConfig` (Granite
//! 4.0, `GraniteMoeHybridForCausalLM`) is read here with the class's defaults: per layer a
//! Mamba-2 mixer (`mamba`, or transformers 5's `linear_attention`) or attention (`attention` /
//! `full_attention`) without RoPE unless `position_embedding_type` is `rope`; then a SwiGLU
//! shared MLP (`shared_intermediate_size`), beside routed experts (`intermediate_size` each;
//! top-k of the logits, softmax over those) when `num_local_experts` > 0.
//!
//! `GraniteMoeConfig` / `GraniteMoeSharedConfig` (Granite 3.x MoE): [`parse_moe`].
//!
//! `BambaConfig` (`BambaForCausalLM`, whose Mamba-2 mixer Granite 4.0 took over, with the same
//! `mamba_*` fields) is read here too: attention at `attn_layer_indices` (RoPE on the first
//! half of each head: the class fixes `partial_rotary_factor` at 0.5), Mamba-2 elsewhere, each
//! followed by a SwiGLU MLP; no multipliers.

use serde_json::Value;

use super::config::{Cfg, default_eps, default_max_pos, shown};
use super::hybrid_config::{HybridSpec, LayerKind, MambaNorm, MambaSpec, MoeRouter, MoeSpec};
use super::{Architecture, ModelError, ModelSpec, QkNorm, WeightDtype};

/// Granite's multipliers (each 1 in the config classes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GraniteSpec {
    /// Scales the embedding rows (layer id 0 is the scaled embedding).
    pub embedding: f32,
    /// Scales each sublayer's output before the residual add.
    pub residual: f32,
    /// The attention's score scale, in place of `head_dim^-½`.
    pub attention: f64,
    /// HyperCLOVA X's Peri-LN: an RMSNorm on each sublayer's output (`post_norm1`,
    /// `post_norm2`) before the multiplier.
    pub post_norms: bool,
}

impl GraniteSpec {
    /// The attention's score factor over `head_dim^-½`.
    pub fn score_factor(&self, head_dim: usize) -> f64 {
        self.attention * (head_dim as f64).sqrt()
    }
}

/// `embedding_multiplier`, `residual_multiplier`, `attention_multiplier` (finite; the
/// attention's above 0).
pub(super) fn multipliers(cfg: &Cfg<'_>) -> Result<GraniteSpec, ModelError> {
    multipliers_or(cfg, 1.0)
}

/// [`multipliers`] with the attention multiplier `attention` where the config names none.
fn multipliers_or(cfg: &Cfg<'_>, attention: f64) -> Result<GraniteSpec, ModelError> {
    let read = |field: &str, default: f64, positive: bool| {
        let v = cfg.f64_or(field, default)?;
        match v.is_finite() && (!positive || v > 0.0) {
            true => Ok(v),
            false if positive => Err(cfg.err(field, format!("{v} (a finite value above 0)"))),
            false => Err(cfg.err(field, format!("{v} (a finite value)"))),
        }
    };
    Ok(GraniteSpec {
        embedding: read("embedding_multiplier", 1.0, false)? as f32,
        residual: read("residual_multiplier", 1.0, false)? as f32,
        attention: read("attention_multiplier", attention, true)?,
        post_norms: false,
    })
}

/// HyperCLOVA X's (`HyperCLOVAXConfig`): Granite's multipliers, the attention's `head_dim^-½`
/// by default, and Peri-LN's output norms where `use_post_norm` (its default).
pub(super) fn hyperclovax(cfg: &Cfg<'_>, head_dim: usize) -> Result<GraniteSpec, ModelError> {
    Ok(GraniteSpec {
        post_norms: cfg.bool_or("use_post_norm", true)?,
        ..multipliers_or(cfg, (head_dim as f64).powf(-0.5))?
    })
}

/// `GraniteSWAConfig`'s: Granite 3.x's fields (eps 1e-5, tied) with `layer_types` (else every
/// 4th layer from layer 0 full, the others sliding) of `sliding_window` (128) and a RoPE theta
/// per layer (`layer_rope_theta`, else the one theta; 0: that layer NoPE).
pub(super) fn parse_swa(cfg: &Cfg<'_>, name: String) -> Result<ModelSpec, ModelError> {
    let spec = super::dense_config::dense_spec(cfg, Architecture::GraniteSwa, name)?;
    swa_layers(cfg, spec)
}

/// Granite SWA's layers (and GraniteMoeSWA's): `layer_types`, else every 4th layer from 0
/// full, the others a window of `sliding_window` (128); each layer's RoPE theta from
/// `layer_rope_theta` (0: no RoPE), else the spec's.
fn swa_layers(cfg: &Cfg<'_>, mut spec: ModelSpec) -> Result<ModelSpec, ModelError> {
    let layers = spec.num_layers;
    let every_4th_full = (0..layers).map(|i| !i.is_multiple_of(4)).collect();
    let rope = (spec.rope_theta, spec.rope_scaling);
    let windows = super::olmo_config::layer_windows(cfg, every_4th_full, 128, rope)?;
    let field = "layer_rope_theta";
    let thetas = match cfg.get(field) {
        None => vec![spec.rope_theta; layers],
        Some(v) => (v.as_array().filter(|a| a.len() == layers))
            .and_then(|a| a.iter().map(|t| t.as_f64().filter(|t| *t >= 0.0)).collect())
            .ok_or_else(|| cfg.err(field, format!("expected {layers} thetas, each 0 or above")))?,
    };
    spec.nope_layers = Some(thetas.iter().map(|&t| t == 0.0).collect());
    spec.windows = Some(windows);
    spec.layer_thetas = Some(thetas);
    Ok(spec)
}

/// The spec of a `GraniteMoeHybridConfig`.
pub(super) fn parse_hybrid(cfg: &Cfg<'_>, name: String) -> Result<ModelSpec, ModelError> {
    let arch = Architecture::GraniteMoeHybrid;
    cfg.check_activation()?;
    let hidden = cfg.usize_or("hidden_size", 4096)?;
    let heads = cfg.usize_or("num_attention_heads", 32)?;
    if heads == 0 || !hidden.is_multiple_of(heads) {
        let m = format!("{heads} (must divide hidden_size {hidden})");
        return Err(cfg.err("num_attention_heads", m));
    }
    let layers = layer_kinds(cfg, cfg.num_layers_or(32)?)?;
    let rope = position_embedding(cfg)?;
    let (rope_theta, rope_scaling) = cfg.rope(arch)?;
    let mamba = mamba(cfg, hidden)?;
    let bias = cfg.bool_or("attention_bias", false)?;
    let head_dim = hidden / heads;
    let moe = experts(cfg, layers.len())?;
    Ok(ModelSpec {
        vocab_size: cfg.usize_or("vocab_size", 32000)?,
        hidden_size: hidden,
        num_layers: layers.len(),
        num_heads: heads,
        num_kv_heads: cfg.usize_or("num_key_value_heads", heads)?,
        head_dim,
        // Every layer's dense MLP is the shared one.
        intermediate_size: cfg.usize_or("shared_intermediate_size", 1024)?,
        rms_norm_eps: cfg.f64_or("rms_norm_eps", default_eps(arch))?,
        rope_theta,
        rope_scaling,
        qkv_bias: bias,
        o_bias: bias,
        mlp_bias: false,
        qk_norm: QkNorm::None,
        tie_word_embeddings: cfg.bool_or("tie_word_embeddings", false)?,
        max_position_embeddings: cfg.usize_or("max_position_embeddings", default_max_pos(arch))?,
        dtype: cfg.dtype()?.unwrap_or(WeightDtype::F32),
        hybrid: Some(mamba_hybrid(
            layers,
            if rope { head_dim } else { 0 },
            moe,
            mamba,
        )),
        granite: Some(multipliers(cfg)?),
        ..ModelSpec::base(name, arch)
    })
}

/// The spec of a `GraniteMoeConfig` (Granite 3.0 / 3.1 MoE, `GraniteMoeForCausalLM`) or a
/// `GraniteMoeSharedConfig` (`GraniteMoeSharedForCausalLM`): Granite 4.0's layers with RoPE
/// attention in every one, its routed experts in every layer, and (the shared class) its
/// shared MLP where `shared_intermediate_size` is above 0 (its default 0: none); or a
/// `GraniteMoeSWAConfig` (`GraniteMoeSWAForCausalLM`): the shared class's with Granite SWA's
/// layers ([`swa_layers`]).
pub(super) fn parse_moe(
    cfg: &Cfg<'_>,
    arch: Architecture,
    name: String,
) -> Result<ModelSpec, ModelError> {
    cfg.check_activation()?;
    let hidden = cfg.usize_or("hidden_size", 4096)?;
    let heads = cfg.usize_or("num_attention_heads", 32)?;
    if heads == 0 || !hidden.is_multiple_of(heads) {
        let m = format!("{heads} (must divide hidden_size {hidden})");
        return Err(cfg.err("num_attention_heads", m));
    }
    let layers = cfg.num_layers_or(32)?;
    let (rope_theta, rope_scaling) = cfg.rope(arch)?;
    let bias = cfg.bool_or("attention_bias", false)?;
    let head_dim = hidden / heads;
    let shared = match arch {
        Architecture::GraniteMoeShared | Architecture::GraniteMoeSwa => {
            cfg.usize_or("shared_intermediate_size", 0)?
        }
        _ => 0,
    };
    let mut moe = experts(cfg, layers)?
        .ok_or_else(|| cfg.err("num_local_experts", "0 (every layer is a MoE block)"))?;
    moe.shared_intermediate = (shared > 0).then_some(shared);
    let expert_intermediate = moe.expert_intermediate;
    let spec = ModelSpec {
        vocab_size: cfg.usize_or("vocab_size", 32000)?,
        hidden_size: hidden,
        num_layers: layers,
        num_heads: heads,
        num_kv_heads: cfg.usize_or("num_key_value_heads", heads)?,
        head_dim,
        // The shared MLP's where there is one (the experts' where not: read by nothing).
        intermediate_size: if shared > 0 {
            shared
        } else {
            expert_intermediate
        },
        rms_norm_eps: cfg.f64_or("rms_norm_eps", default_eps(arch))?,
        rope_theta,
        rope_scaling,
        qkv_bias: bias,
        o_bias: bias,
        mlp_bias: false,
        qk_norm: QkNorm::None,
        tie_word_embeddings: cfg.bool_or("tie_word_embeddings", false)?,
        max_position_embeddings: cfg.usize_or("max_position_embeddings", default_max_pos(arch))?,
        dtype: cfg.dtype()?.unwrap_or(WeightDtype::F32),
        hybrid: Some(HybridSpec {
            layers: vec![LayerKind::Attention; layers],
            rotary_dim: head_dim,
            gdn: None,
            moe: Some(moe),
            mamba: None,
            nemotron_moe: None,
            mamba1: None,
            mla: None,
        }),
        granite: Some(multipliers(cfg)?),
        ..ModelSpec::base(name, arch)
    };
    match arch {
        Architecture::GraniteMoeSwa => swa_layers(cfg, spec),
        _ => Ok(spec),
    }
}

/// The spec of a `BambaConfig`, with the class's defaults.
pub(super) fn parse_bamba(cfg: &Cfg<'_>, name: String) -> Result<ModelSpec, ModelError> {
    let arch = Architecture::Bamba;
    cfg.check_activation()?;
    let hidden = cfg.usize_or("hidden_size", 4096)?;
    let heads = cfg.usize_or("num_attention_heads", 32)?;
    if heads == 0 {
        return Err(cfg.err("num_attention_heads", "must be > 0"));
    }
    let head_dim = cfg.usize_or("head_dim", hidden / heads)?;
    let layers = attention_at(cfg, cfg.num_layers_or(32)?)?;
    let (rope_theta, rope_scaling) = cfg.rope(arch)?;
    let mamba = mamba(cfg, hidden)?;
    let bias = cfg.bool_or("attention_bias", false)?;
    Ok(ModelSpec {
        vocab_size: cfg.usize_or("vocab_size", 128_000)?,
        hidden_size: hidden,
        num_layers: layers.len(),
        num_heads: heads,
        num_kv_heads: cfg.usize_or("num_key_value_heads", 8)?,
        head_dim,
        intermediate_size: cfg.usize_or("intermediate_size", 14336)?,
        rms_norm_eps: cfg.f64_or("rms_norm_eps", default_eps(arch))?,
        rope_theta,
        rope_scaling,
        qkv_bias: bias,
        o_bias: bias,
        mlp_bias: cfg.bool_or("mlp_bias", false)?,
        qk_norm: QkNorm::None,
        tie_word_embeddings: cfg.bool_or("tie_word_embeddings", false)?,
        max_position_embeddings: cfg.usize_or("max_position_embeddings", default_max_pos(arch))?,
        dtype: cfg.dtype()?.unwrap_or(WeightDtype::F32),
        // `int(head_dim * 0.5)`, whatever the config's own factor says.
        hybrid: Some(mamba_hybrid(layers, head_dim / 2, None, mamba)),
        ..ModelSpec::base(name, arch)
    })
}

/// The hybrid part of a Granite 4.0, Bamba or Mamba-2 spec: its mixers, rotated dims, experts, and the
/// Mamba-2 geometry where some layer is Mamba-2 (an attention-only Granite-4.0-Micro carries
/// unused `mamba_*` fields).
pub(super) fn mamba_hybrid(
    layers: Vec<LayerKind>,
    rotary_dim: usize,
    moe: Option<MoeSpec>,
    mamba: MambaSpec,
) -> HybridSpec {
    HybridSpec {
        rotary_dim,
        gdn: None,
        moe,
        mamba: layers.contains(&LayerKind::Mamba2).then_some(mamba),
        nemotron_moe: None,
        mamba1: None,
        mla: None,
        layers,
    }
}

/// Bamba's layers: attention at `attn_layer_indices` (each below `n`), Mamba-2 elsewhere.
fn attention_at(cfg: &Cfg<'_>, n: usize) -> Result<Vec<LayerKind>, ModelError> {
    let field = "attn_layer_indices";
    let mut kinds = vec![LayerKind::Mamba2; n];
    let Some(v) = cfg.get(field) else {
        return Ok(kinds);
    };
    let bad = || cfg.err(field, format!("{} (layer indices below {n})", shown(v)));
    for i in v.as_array().ok_or_else(bad)? {
        let i = i.as_u64().map(|i| i as usize).filter(|&i| i < n);
        kinds[i.ok_or_else(bad)?] = LayerKind::Attention;
    }
    Ok(kinds)
}

/// Per layer its mixer, from `layer_types` (or its alias `layers_block_type`); the class's
/// default is every layer Mamba-2.
fn layer_kinds(cfg: &Cfg<'_>, n: usize) -> Result<Vec<LayerKind>, ModelError> {
    let field = match cfg.get("layer_types") {
        Some(_) => "layer_types",
        None => "layers_block_type",
    };
    let Some(list) = cfg.get(field) else {
        return Ok(vec![LayerKind::Mamba2; n]);
    };
    let bad = |v: &Value| {
        let m = format!("{} (each `mamba` or `attention`)", shown(v));
        cfg.err(field, m)
    };
    let list = list.as_array().ok_or_else(|| bad(list))?;
    let kinds = list
        .iter()
        .map(|v| match v.as_str() {
            Some("mamba" | "linear_attention") => Ok(LayerKind::Mamba2),
            Some("attention" | "full_attention") => Ok(LayerKind::Attention),
            _ => Err(bad(v)),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if kinds.len() != n {
        let m = format!("{} layer types for {n} layers", kinds.len());
        return Err(cfg.err(field, m));
    }
    Ok(kinds)
}

/// The attention rotates q and k (`rope`) or not (`null`, `nope`: the class builds no RoPE
/// for anything but `rope`; other names are refused rather than guessed).
fn position_embedding(cfg: &Cfg<'_>) -> Result<bool, ModelError> {
    match cfg.get("position_embedding_type") {
        None => Ok(false),
        Some(Value::String(s)) if s == "rope" => Ok(true),
        Some(Value::String(s)) if s == "nope" => Ok(false),
        Some(v) => Err(cfg.err(
            "position_embedding_type",
            format!("{} (null, `nope` or `rope`)", shown(v)),
        )),
    }
}

/// The Mamba-2 mixers' geometry (`mamba_*`, `time_step_limit`) with the inner width
/// `mamba_expand · hidden_size`, checked as the class checks it.
fn mamba(cfg: &Cfg<'_>, hidden: usize) -> Result<MambaSpec, ModelError> {
    let inner = cfg.usize_or("mamba_expand", 2)?.saturating_mul(hidden);
    mamba_of(cfg, inner, "mamba_expand · hidden_size")
}

/// The Mamba-2 mixers' geometry with the inner width `inner` (named `what` in errors):
/// `mamba_d_head · mamba_n_heads == inner`, as Bamba's, Granite 4.0's and Falcon-H1's classes
/// check it.
pub(super) fn mamba_of(cfg: &Cfg<'_>, inner: usize, what: &str) -> Result<MambaSpec, ModelError> {
    let heads = cfg.usize_or("mamba_n_heads", 128)?;
    if heads == 0 || !inner.is_multiple_of(heads) {
        let m = format!("{heads} (must divide {what} = {inner})");
        return Err(cfg.err("mamba_n_heads", m));
    }
    let head_dim = match cfg.get("mamba_d_head") {
        None => inner / heads,
        Some(Value::String(s)) if s == "auto" => inner / heads,
        Some(_) => cfg.usize_req("mamba_d_head")?,
    };
    if head_dim.checked_mul(heads) != Some(inner) {
        let m = format!("{head_dim} × {heads} heads is not {what} = {inner}");
        return Err(cfg.err("mamba_d_head", m));
    }
    Ok(MambaSpec {
        num_heads: heads,
        head_dim,
        state_size: cfg.usize_or("mamba_d_state", 256)?,
        n_groups: cfg.usize_or("mamba_n_groups", 1)?,
        conv_kernel: cfg.usize_or("mamba_d_conv", 4)?,
        time_step_min: time_step_floor(cfg)?,
        conv_bias: cfg.bool_or("mamba_conv_bias", true)?,
        proj_bias: cfg.bool_or("mamba_proj_bias", false)?,
        norm: MambaNorm::AfterGate,
    })
}

/// The lower clamp of `dt` from `time_step_limit` `[low, high]` (default `[0, ∞]`): hsx runs a
/// floor only, so an upper limit other than ∞ is refused.
pub(super) fn time_step_floor(cfg: &Cfg<'_>) -> Result<f64, ModelError> {
    let field = "time_step_limit";
    if cfg.has(field) && cfg.get(field).is_none() {
        return Err(cfg.err(
            field,
            "null (transformers' prefill needs a [low, high] pair)",
        ));
    }
    let Some(v) = cfg.get(field) else {
        return Ok(0.0);
    };
    let pair = v.as_array().filter(|a| a.len() == 2);
    let nums = pair.map(|a| a.iter().map(super::pyjson::value_f64).collect::<Vec<_>>());
    match nums.as_deref() {
        Some(&[Some(low), Some(high)])
            if low.is_finite() && low >= 0.0 && high == f64::INFINITY =>
        {
            Ok(low)
        }
        _ => Err(cfg.err(
            field,
            format!("{} (hsx runs [low ≥ 0, Infinity] only)", shown(v)),
        )),
    }
}

/// The routed experts when `num_local_experts` > 0 (every layer sparse; the shared MLP beside
/// them, ungated).
fn experts(cfg: &Cfg<'_>, layers: usize) -> Result<Option<MoeSpec>, ModelError> {
    let n = cfg.usize_or("num_local_experts", 8)?;
    if n == 0 {
        return Ok(None);
    }
    let top_k = cfg.usize_or("num_experts_per_tok", 2)?;
    if top_k == 0 || top_k > n {
        let m = format!("{top_k} (1 ..= num_local_experts {n})");
        return Err(cfg.err("num_experts_per_tok", m));
    }
    Ok(Some(MoeSpec {
        num_experts: n,
        top_k,
        expert_intermediate: cfg.usize_or("intermediate_size", 11008)?,
        shared_intermediate: Some(cfg.usize_or("shared_intermediate_size", 1024)?),
        // The softmax over the top-k logits: the softmax top-k, renormalised.
        norm_topk_prob: true,
        sparse_layers: vec![true; layers],
        router: MoeRouter::Softmax,
    }))
}

#[cfg(test)]
#[path = "granite_config_tests.rs"]
mod tests;
