//! Gemma 4's text config (`Gemma4TextConfig`, `gemma4_text`: `Gemma4ForCausalLM` and the
//! language model of `Gemma4ForConditionalGeneration` exports; `Gemma4UnifiedTextConfig`,
//! `gemma4_unified_text`: Gemma 4 12B's), with the class's defaults.
//! Per layer: sliding-window or full attention (`layer_types`, else every 6th layer full; the
//! last layer is always full, as the class forces it), each kind with its RoPE
//! (`rope_parameters.{sliding,full}_attention`: `default`, or `proportional` — a share of the
//! pairs of the whole head rotating). The full layers have their own head size and KV heads:
//! released configs name `global_head_dim` and (with `attention_k_eq_v`)
//! `num_global_key_value_heads`; configs saved by transformers name them per layer
//! (`per_layer_config`). The E2B / E4B's per-layer embeddings (`hidden_size_per_layer_input`)
//! and the last `num_kv_shared_layers` layers sharing keys and values; the unified class has no
//! per-layer embeddings or MoE block. Refused by name: bidirectional attention over text.

use serde_json::Value;

use super::config::{Cfg, default_eps, default_max_pos, shown};
use super::{Architecture, ModelError, ModelSpec, QkNorm, RopeScaling, WeightDtype};
use crate::kernels::rope::Rope;

/// Gemma 4's per-layer attention and MoE block.
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma4Spec {
    /// Per layer: sliding-window attention (`sliding_attention`), else full.
    pub sliding: Vec<bool>,
    /// Per layer: (head_dim, KV heads).
    pub geometry: Vec<(usize, usize)>,
    /// The sliding layers see keys `pos - window + 1 ..= pos`.
    pub window: usize,
    /// The sliding layers' RoPE and the full layers'.
    pub local_rope: Gemma4Rope,
    pub global_rope: Gemma4Rope,
    /// The full layers' values are their keys' projection (no `v_proj`).
    pub k_eq_v: bool,
    /// The MoE block beside each layer's dense MLP (`enable_moe_block`).
    pub moe: Option<Gemma4Experts>,
    /// E2B / E4B's per-layer embeddings (`hidden_size_per_layer_input` > 0).
    pub ple: Option<Gemma4Ple>,
    /// Per layer: the earlier layer whose keys and values it attends over instead of its own
    /// (the last `num_kv_shared_layers` layers: the last unshared layer of their kind).
    pub kv_from: Vec<Option<usize>>,
    /// The KV-sharing layers' MLPs are `2 · intermediate_size` wide (`use_double_wide_mlp`).
    pub double_wide: bool,
}

/// Per-layer embeddings: `dim` values per layer and token, from a `[vocab, layers · dim]`
/// table (`embed_tokens_per_layer`) and a projection of the embedded token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gemma4Ple {
    pub dim: usize,
    pub vocab: usize,
}

/// One layer kind's RoPE over its whole head (Gemma 4's, LFM3's).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Gemma4Rope {
    Default {
        theta: f64,
    },
    /// The first `⌊partial · head_dim / 2⌋` pairs rotate, the others pass through; every
    /// frequency divided by `factor`.
    Proportional {
        theta: f64,
        partial: f64,
        factor: f64,
    },
}

impl Gemma4Rope {
    /// Its table for heads of `head_dim`.
    pub fn table(self, head_dim: usize) -> Rope {
        match self {
            Self::Default { theta } => Rope::new(head_dim, theta, RopeScaling::None),
            Self::Proportional {
                theta,
                partial,
                factor,
            } => Rope::proportional(head_dim, theta, partial, factor),
        }
    }
}

/// The routed experts of a Gemma 4 MoE layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gemma4Experts {
    pub experts: usize,
    pub top_k: usize,
    /// Each expert's intermediate size.
    pub inter: usize,
}

impl Gemma4Spec {
    /// The KV cache's width: the widest layer's KV heads (a narrower layer's heads repeat
    /// to fill it: [`Gemma4Spec::kv_repeat`]).
    pub fn kv_dim(&self) -> usize {
        self.geometry.iter().map(|&(d, k)| d * k).max().unwrap_or(0)
    }

    /// How often layer `i`'s KV heads repeat to fill [`Gemma4Spec::kv_dim`].
    pub fn kv_repeat(&self, i: usize) -> usize {
        let (d, k) = self.geometry[i];
        self.kv_dim() / (d * k)
    }

    /// Layer `i`'s KV cache layer: its own index, or the layer it shares keys and values with
    /// (the sharing layers are the last ones, so the unshared ones are layers 0..n).
    pub fn kv_layer(&self, i: usize) -> usize {
        self.kv_from[i].unwrap_or(i)
    }

    /// Layer `i`'s MLP width for a model of `inter`.
    pub fn mlp_width(&self, i: usize, inter: usize) -> usize {
        match self.double_wide && self.kv_from[i].is_some() {
            true => 2 * inter,
            false => inter,
        }
    }

    /// The largest head size of any layer.
    pub fn max_head_dim(&self) -> usize {
        self.geometry.iter().map(|g| g.0).max().unwrap_or(0)
    }
}

const FULL: &str = "full_attention";
const SLIDING: &str = "sliding_attention";

/// The spec of a Gemma 4 text config.
pub(super) fn parse(
    cfg: &Cfg<'_>,
    arch: Architecture,
    name: String,
) -> Result<ModelSpec, ModelError> {
    // Gemma4UnifiedTextConfig has no per-layer embeddings or MoE block (its model builds
    // neither whatever the config says), windows of 1024 by default.
    let unified = arch == Architecture::Gemma4Unified;
    refuse_unsupported(cfg)?;
    let layers = cfg.num_layers_or(30)?;
    let heads = cfg.usize_or("num_attention_heads", 8)?;
    let head_dim = cfg.usize_or("head_dim", 256)?;
    let sliding = sliding_layers(cfg, layers)?;
    let k_eq_v = cfg.bool_or("attention_k_eq_v", false)?;
    let geometry = geometry(cfg, &sliding, (head_dim, k_eq_v))?;
    let window = cfg.usize_or("sliding_window", if unified { 1024 } else { 512 })?;
    // A null window is not the class's default: transformers' sliding mask refuses it.
    if window == 0 || cfg.is_null("sliding_window") {
        return Err(cfg.err("sliding_window", "must be at least 1"));
    }
    let global = Gemma4Rope::Proportional {
        theta: 1e6,
        partial: 0.25,
        factor: 1.0,
    };
    let (local_rope, global_rope) = kind_ropes(cfg, (Gemma4Rope::Default { theta: 1e4 }, global))?;
    let vocab = cfg.usize_or("vocab_size", 262_144)?;
    let kv_from = kv_sharing(cfg, &sliding)?;
    let g = Gemma4Spec {
        sliding,
        geometry,
        window,
        local_rope,
        global_rope,
        k_eq_v,
        moe: if unified { None } else { moe(cfg)? },
        ple: if unified { None } else { ple(cfg, vocab)? },
        kv_from,
        double_wide: cfg.bool_or("use_double_wide_mlp", false)?,
    };
    check_geometry(cfg, &g, heads)?;
    let bias = cfg.bool_or("attention_bias", false)?;
    Ok(ModelSpec {
        vocab_size: vocab,
        hidden_size: cfg.usize_or("hidden_size", 2304)?,
        num_layers: layers,
        num_heads: heads,
        num_kv_heads: g.kv_dim() / head_dim,
        head_dim,
        intermediate_size: cfg.usize_or("intermediate_size", 9216)?,
        rms_norm_eps: cfg.f64_or("rms_norm_eps", default_eps(arch))?,
        rope_theta: match global_rope {
            Gemma4Rope::Default { theta } | Gemma4Rope::Proportional { theta, .. } => theta,
        },
        rope_scaling: RopeScaling::None,
        qkv_bias: bias,
        o_bias: bias,
        mlp_bias: false,
        qk_norm: QkNorm::PerHead,
        tie_word_embeddings: cfg.bool_or("tie_word_embeddings", true)?,
        max_position_embeddings: cfg.usize_or("max_position_embeddings", default_max_pos(arch))?,
        dtype: cfg.dtype()?.unwrap_or(WeightDtype::F32),
        gemma4: Some(g),
        ..ModelSpec::base(name, arch)
    })
}

/// What Gemma 4's class allows but hsx does not run.
fn refuse_unsupported(cfg: &Cfg<'_>) -> Result<(), ModelError> {
    let unsupported = |what: String| ModelError::Unsupported {
        path: cfg.path_buf(),
        what,
    };
    match cfg.get("use_bidirectional_attention") {
        None => {}
        Some(v) if v.as_str() == Some("vision") => {} // text tokens stay causal
        Some(v) => {
            return Err(unsupported(format!(
                "bidirectional attention (use_bidirectional_attention {})",
                shown(v)
            )));
        }
    }
    match cfg.get("hidden_activation") {
        None => Ok(()),
        Some(v) if v.as_str() == Some("gelu_pytorch_tanh") => Ok(()),
        Some(v) => Err(unsupported(format!(
            "hidden_activation {} (only gelu_pytorch_tanh)",
            shown(v)
        ))),
    }
}

/// `hidden_size_per_layer_input` (`Gemma4TextConfig`'s default 256; 0: none) and the table's
/// rows, which must cover the vocabulary (transformers indexes it by every token id).
fn ple(cfg: &Cfg<'_>, vocab: usize) -> Result<Option<Gemma4Ple>, ModelError> {
    let dim = cfg.usize_or("hidden_size_per_layer_input", 256)?;
    if dim == 0 || cfg.is_null("hidden_size_per_layer_input") {
        return Ok(None);
    }
    let rows = cfg.usize_or("vocab_size_per_layer_input", 262_144)?;
    if rows < vocab {
        let field = "vocab_size_per_layer_input";
        return Err(cfg.err(field, format!("{rows} rows for a vocabulary of {vocab}")));
    }
    Ok(Some(Gemma4Ple { dim, vocab: rows }))
}

/// `Gemma4TextConfig.kv_sharing_modes`: the last `num_kv_shared_layers` layers attend over the
/// keys and values of the last earlier layer of their kind, which must exist (the class raises
/// otherwise; sharing every layer leaves none to produce them).
fn kv_sharing(cfg: &Cfg<'_>, sliding: &[bool]) -> Result<Vec<Option<usize>>, ModelError> {
    let field = "num_kv_shared_layers";
    let shared = cfg.usize_or(field, 0)?;
    let layers = sliding.len();
    let first = layers.checked_sub(shared).filter(|&f| f > 0 || shared == 0);
    let first = first.ok_or_else(|| cfg.err(field, format!("{shared} of {layers} layers")))?;
    (0..layers)
        .map(|i| match i < first {
            true => Ok(None),
            false => (0..first)
                .rev()
                .find(|&j| sliding[j] == sliding[i])
                .map(Some)
                .ok_or_else(|| {
                    let kind = if sliding[i] { SLIDING } else { FULL };
                    cfg.err(
                        field,
                        format!("layer {i}: no unshared {kind} layer before it"),
                    )
                }),
        })
        .collect()
}

/// `layer_types`, else every 6th layer full; the last layer full whatever they say
/// (`Gemma4TextConfig` forces it, with a warning).
fn sliding_layers(cfg: &Cfg<'_>, layers: usize) -> Result<Vec<bool>, ModelError> {
    let mut sliding = match cfg.sliding_layer_types(layers)? {
        Some(s) => s,
        None => (0..layers).map(|i| !(i + 1).is_multiple_of(6)).collect(),
    };
    if let Some(last) = sliding.last_mut() {
        *last = false;
    }
    Ok(sliding)
}

/// Each layer's (head_dim, KV heads): `per_layer_config`'s overrides where the config has
/// them, else the full layers' `global_head_dim` (512) and, with `attention_k_eq_v`,
/// `num_global_key_value_heads`.
fn geometry(
    cfg: &Cfg<'_>,
    sliding: &[bool],
    (head_dim, k_eq_v): (usize, bool),
) -> Result<Vec<(usize, usize)>, ModelError> {
    let kv_heads = cfg.usize_or("num_key_value_heads", 4)?;
    let mut geometry = vec![(head_dim, kv_heads); sliding.len()];
    let field = "per_layer_config";
    let Some(per_layer) = cfg.get(field) else {
        let global = cfg.usize_or("global_head_dim", 512)?;
        let global_kv = match k_eq_v {
            true => cfg.usize_or("num_global_key_value_heads", kv_heads)?,
            false => kv_heads,
        };
        for (g, _) in geometry.iter_mut().zip(sliding).filter(|(_, s)| !**s) {
            *g = (global, global_kv);
        }
        return Ok(geometry);
    };
    let map = (per_layer.as_object()).ok_or_else(|| cfg.err(field, "expected an object"))?;
    for (key, overrides) in map {
        let at = |k: &str| format!("{field}.{key}.{k}");
        let layer = key
            .parse::<usize>()
            .ok()
            .filter(|&i| i < sliding.len())
            .ok_or_else(|| cfg.err(field, format!("layer `{key}` of {}", sliding.len())))?;
        let obj = overrides
            .as_object()
            .ok_or_else(|| cfg.err(&at(""), "expected an object"))?;
        for (k, v) in obj {
            let n = v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| cfg.err(&at(k), format!("expected a count, found {}", shown(v))));
            match k.as_str() {
                "head_dim" => geometry[layer].0 = n?,
                "num_key_value_heads" => geometry[layer].1 = n?,
                _ => {
                    return Err(ModelError::Unsupported {
                        path: cfg.path_buf(),
                        what: format!("a per-layer `{k}` ({})", at(k)),
                    });
                }
            }
        }
    }
    Ok(geometry)
}

/// Every layer's heads fit the cache: its KV width divides the widest, and its heads repeated
/// that often still divide the query heads; one head size per layer kind (its RoPE's).
fn check_geometry(cfg: &Cfg<'_>, g: &Gemma4Spec, heads: usize) -> Result<(), ModelError> {
    let kv_dim = g.kv_dim();
    for (i, &(d, k)) in g.geometry.iter().enumerate() {
        let fits = d > 0 && k > 0 && d.is_multiple_of(2) && kv_dim.is_multiple_of(d * k);
        if !fits || !heads.is_multiple_of(k * (kv_dim / (d * k))) {
            return Err(cfg.err(
                "per_layer_config",
                format!(
                    "layer {i}: {k} KV heads of {d} for {heads} query heads (other layers' KV \
                     width {kv_dim})"
                ),
            ));
        }
        if let Some(j) = g.kv_from[i].filter(|&j| g.geometry[j] != (d, k)) {
            let (dj, kj) = g.geometry[j];
            return Err(cfg.err(
                "per_layer_config",
                format!("layer {i}: {k} KV heads of {d} sharing layer {j}'s {kj} of {dj}"),
            ));
        }
        let first_of_kind = g.sliding.iter().position(|&s| s == g.sliding[i]);
        if first_of_kind.is_some_and(|j| g.geometry[j].0 != d) {
            return Err(cfg.err(
                "per_layer_config",
                format!("layer {i}: head_dim {d} differs from other layers of its kind"),
            ));
        }
    }
    Ok(())
}

/// (sliding layers', full layers') RoPE from `rope_parameters.{sliding,full}_attention`, the
/// config class's `(local, global)` where absent (`Gemma4TextConfig`'s: theta 1e4; proportional
/// over 0.25, theta 1e6; `Lfm3Config`'s the same over 0.5).
pub(super) fn kind_ropes(
    cfg: &Cfg<'_>,
    (local, global): (Gemma4Rope, Gemma4Rope),
) -> Result<(Gemma4Rope, Gemma4Rope), ModelError> {
    let field = "rope_parameters";
    let Some(params) = cfg.get(field) else {
        return Ok((local, global));
    };
    let obj = (params.as_object()).ok_or_else(|| cfg.err(field, "expected an object"))?;
    if let Some(k) = obj.keys().find(|k| *k != FULL && *k != SLIDING) {
        return Err(cfg.err(
            field,
            format!("entry `{k}` (expected `{FULL}` / `{SLIDING}`)"),
        ));
    }
    let of = |kind: &str, default| match obj.get(kind).filter(|v| !v.is_null()) {
        Some(p) => rope_of(cfg, &format!("{field}.{kind}"), p),
        None => Ok(default),
    };
    Ok((of(SLIDING, local)?, of(FULL, global)?))
}

fn rope_of(cfg: &Cfg<'_>, field: &str, p: &Value) -> Result<Gemma4Rope, ModelError> {
    let num = |k: &str, default: f64| match p.get(k).filter(|v| !v.is_null()) {
        None => Ok(default),
        Some(v) => v
            .as_f64()
            .filter(|x| x.is_finite() && *x > 0.0)
            .ok_or_else(|| cfg.err(&format!("{field}.{k}"), format!("{} (above 0)", shown(v)))),
    };
    let theta = num("rope_theta", 1e4)?;
    match p
        .get("rope_type")
        .and_then(|v| v.as_str())
        .unwrap_or("default")
    {
        // Gemma 4's default RoPE rotates the whole head: a partial_rotary_factor is not read.
        "default" => Ok(Gemma4Rope::Default { theta }),
        "proportional" => Ok(Gemma4Rope::Proportional {
            theta,
            partial: match num("partial_rotary_factor", 1.0)? {
                x if x <= 1.0 => x,
                x => {
                    return Err(cfg.err(
                        &format!("{field}.partial_rotary_factor"),
                        format!("{x} (at most 1)"),
                    ));
                }
            },
            factor: num("factor", 1.0)?,
        }),
        other => Err(ModelError::Unsupported {
            path: cfg.path_buf(),
            what: format!("{field}: rope type `{other}` (`default`, `proportional`)"),
        }),
    }
}

/// `enable_moe_block`'s experts (`num_experts`, `top_k_experts`, `moe_intermediate_size`).
fn moe(cfg: &Cfg<'_>) -> Result<Option<Gemma4Experts>, ModelError> {
    if !cfg.bool_or("enable_moe_block", false)? {
        return Ok(None);
    }
    let m = Gemma4Experts {
        experts: cfg.usize_req("num_experts")?,
        top_k: cfg.usize_req("top_k_experts")?,
        inter: cfg.usize_req("moe_intermediate_size")?,
    };
    if m.top_k == 0 || m.top_k > m.experts || m.inter == 0 {
        return Err(cfg.err(
            "top_k_experts",
            format!(
                "{} of {} experts of {} (at least one of at least one)",
                m.top_k, m.experts, m.inter
            ),
        ));
    }
    Ok(Some(m))
}

#[cfg(test)]
#[path = "gemma4_config_tests.rs"]
mod tests;
