//! `FalconH1Config` (`FalconH1ForCausalLM`: Falcon-H1, Falcon-H1R) -> [`ModelSpec`], with the
//! class's defaults. Every layer is [`LayerKind::MambaAttention`]: a Mamba-2 mixer (the
//! `mamba_*` fields as Bamba's, its inner width `mamba_d_ssm` — 1024 when the config names
//! none, `mamba_expand · hidden_size` when it is null) and RoPE attention (`head_dim`, all of
//! it rotated) side by side, then a SwiGLU MLP. The µP multipliers ([`FalconH1Spec`]) are
//! read here and folded into the weights by [`super::falcon_h1`].

use serde_json::Value;

use super::config::{Cfg, default_eps, default_max_pos, shown};
use super::granite_config::mamba_of;
use super::hybrid_config::{HybridSpec, LayerKind, MambaNorm};
use super::{Architecture, ModelError, ModelSpec, QkNorm, WeightDtype};

/// Falcon-H1's multipliers (1 where the config names none). transformers multiplies
/// activations by them; each is linear in a projection's input or output.
#[derive(Debug, Clone, PartialEq)]
pub struct FalconH1Spec {
    /// Scales the embedding rows (layer id 0 is the scaled embedding).
    pub embedding: f32,
    /// The attention's input (`attention_in_multiplier`), keys (`key_multiplier`) and output
    /// (`attention_out_multiplier`).
    pub attention_in: f64,
    pub key: f64,
    pub attention_out: f64,
    /// The Mamba-2 mixer's input and output.
    pub ssm_in: f64,
    pub ssm_out: f64,
    /// `ssm_multipliers`: the z, x, B, C and dt columns of `in_proj`'s output (transformers'
    /// `mup_vector`).
    pub ssm: [f64; 5],
    /// `mlp_multipliers`: the gate projection's output and the down projection's output.
    pub mlp_gate: f64,
    pub mlp_down: f64,
    /// The Mamba-2 `out_proj` bias (`projectors_bias`; `in_proj`'s is `mamba_proj_bias`).
    pub projectors_bias: bool,
}

/// The spec of a `FalconH1Config`.
pub(super) fn parse(cfg: &Cfg<'_>, name: String) -> Result<ModelSpec, ModelError> {
    let arch = Architecture::FalconH1;
    cfg.check_activation()?;
    let hidden = cfg.usize_or("hidden_size", 4096)?;
    let heads = cfg.usize_or("num_attention_heads", 32)?;
    if heads == 0 {
        return Err(cfg.err("num_attention_heads", "must be > 0"));
    }
    let kv_heads = match cfg.is_null("num_key_value_heads") {
        true => heads,
        false => cfg.usize_or("num_key_value_heads", 8)?,
    };
    let head_dim = cfg.usize_or("head_dim", hidden / heads)?;
    let layers = cfg.num_layers_or(32)?;
    let (rope_theta, rope_scaling) = cfg.rope(arch)?;
    let inner = match cfg.is_null("mamba_d_ssm") {
        true => cfg.usize_or("mamba_expand", 2)?.saturating_mul(hidden),
        false => cfg.usize_or("mamba_d_ssm", 1024)?,
    };
    let mut mamba = mamba_of(cfg, inner, "mamba_d_ssm")?;
    mamba.norm = match (
        cfg.bool_or("mamba_rms_norm", false)?,
        cfg.bool_or("mamba_norm_before_gate", true)?,
    ) {
        (false, _) => MambaNorm::None,
        (true, true) => MambaNorm::BeforeGate,
        (true, false) => MambaNorm::AfterGate,
    };
    let bias = cfg.bool_or("attention_bias", false)?;
    Ok(ModelSpec {
        vocab_size: cfg.usize_or("vocab_size", 128_000)?,
        hidden_size: hidden,
        num_layers: layers,
        num_heads: heads,
        num_kv_heads: kv_heads,
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
        hybrid: Some(HybridSpec {
            layers: vec![LayerKind::MambaAttention; layers],
            rotary_dim: head_dim,
            gdn: None,
            moe: None,
            mamba: Some(mamba),
            nemotron_moe: None,
            mamba1: None,
            mla: None,
        }),
        falcon_h1: Some(multipliers(cfg)?),
        ..ModelSpec::base(name, arch)
    })
}

/// The multipliers, each finite; `lm_head_multiplier` (not applied: hsx's greedy tokens
/// are the logits' argmax, which a positive factor keeps) must be above 0.
fn multipliers(cfg: &Cfg<'_>) -> Result<FalconH1Spec, ModelError> {
    let one = |field: &str| finite(cfg, field, cfg.f64_or(field, 1.0)?);
    let head = one("lm_head_multiplier")?;
    if head <= 0.0 {
        let m = format!("{head} (hsx's greedy tokens need a factor above 0)");
        return Err(cfg.err("lm_head_multiplier", m));
    }
    let [mlp_gate, mlp_down] = list::<2>(cfg, "mlp_multipliers")?;
    Ok(FalconH1Spec {
        embedding: one("embedding_multiplier")? as f32,
        attention_in: one("attention_in_multiplier")?,
        key: one("key_multiplier")?,
        attention_out: one("attention_out_multiplier")?,
        ssm_in: one("ssm_in_multiplier")?,
        ssm_out: one("ssm_out_multiplier")?,
        ssm: list::<5>(cfg, "ssm_multipliers")?,
        mlp_gate,
        mlp_down,
        projectors_bias: cfg.bool_or("projectors_bias", false)?,
    })
}

fn finite(cfg: &Cfg<'_>, field: &str, v: f64) -> Result<f64, ModelError> {
    match v.is_finite() {
        true => Ok(v),
        false => Err(cfg.err(field, format!("{v} (a finite value)"))),
    }
}

/// A list of `N` finite numbers (all 1 when the config names none or null).
fn list<const N: usize>(cfg: &Cfg<'_>, field: &str) -> Result<[f64; N], ModelError> {
    let Some(v) = cfg.get(field) else {
        return Ok([1.0; N]);
    };
    let bad = || {
        cfg.err(
            field,
            format!("{} (a list of {N} finite numbers)", shown(v)),
        )
    };
    let items = v.as_array().filter(|a| a.len() == N).ok_or_else(bad)?;
    let mut out = [1.0; N];
    for (o, item) in out.iter_mut().zip(items) {
        *o = Value::as_f64(item)
            .filter(|x| x.is_finite())
            .ok_or_else(bad)?;
    }
    Ok(out)
}

#[cfg(test)]
#[path = "falcon_h1_config_tests.rs"]
mod tests;
