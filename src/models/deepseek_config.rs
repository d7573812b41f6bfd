//! `DeepseekV3ForCausalLM` (DeepSeek-V3 / R1, Kimi-K2, Moonlight, …) and
//! `Glm4MoeLiteForCausalLM` (GLM-4.7-Flash): `config.json` -> [`ModelSpec`] with multi-head
//! latent attention ([`MlaSpec`]) in every layer and DeepSeek-V3's MoE in the sparse layers
//! (DeepSeek: from `first_k_dense_replace` on; GLM: as `mlp_layer_types` says). Defaults are
//! each config class's ([`MlaFamily`]).
//!
//! The spec's attention fields describe the heads the attention kernels see: `num_heads` q,
//! k and v heads (k and v are expanded from the latent, one per q head) of `qk_nope_head_dim +
//! qk_rope_head_dim`, v zero-padded to it; `rotary_dim` is `qk_rope_head_dim`.

use super::ModelError;
use super::config::{
    Architecture, Cfg, ModelSpec, QkNorm, RopeScaling, WeightDtype, default_max_pos,
};
use super::dsa_config::{DsaSpec, dsa_spec};
use super::hybrid_config::{GroupRank, HybridSpec, LayerKind, MoeRouter, MoeSpec, rotary_dim};
use super::moe_config::{
    AXK1_MOE, DEEPSEEK_V2_MOE, DEEPSEEK_V3_MOE, DEEPSEEK_V32_MOE, DeepseekMoeDefaults, GLM_MOE_DSA,
    GLM_MOE_LITE, KIMI_LINEAR_MOE, MISTRAL4_MOE, deepseek_moe,
};
use crate::kernels::device::MlaDims;

/// Multi-head latent attention's geometry.
#[derive(Debug, Clone, PartialEq)]
pub struct MlaSpec {
    /// `q_lora_rank`: q through `q_a_proj` -> `q_a_layernorm` -> `q_b_proj`; `None`: `q_proj`.
    pub q_lora: Option<usize>,
    /// `kv_lora_rank`: the latent `kv_a_proj_with_mqa` makes before `kv_b_proj` expands it.
    pub kv_lora: usize,
    pub dims: MlaDims,
    /// The softmax scale's factor over `head_dim^-0.5`: YaRN's `mscale(factor,
    /// mscale_all_dim)²` (transformers' `yarn_apply_mscale`), else 1.
    pub score_factor: f64,
    /// DeepSeek Sparse Attention's indexer (DeepSeek-V3.2, GLM-5).
    pub dsa: Option<DsaSpec>,
}

/// A config class's defaults for the fields a config may leave out.
struct MlaFamily {
    vocab: usize,
    hidden: usize,
    intermediate: usize,
    heads: usize,
    nope: usize,
    rope: usize,
    v: usize,
    /// 0: `q_proj` (no LoRA) by default.
    q_lora: usize,
    kv_lora: usize,
    eps: f64,
    moe: DeepseekMoeDefaults,
}

/// `DeepseekV3Config`'s.
const DEEPSEEK_V3: MlaFamily = MlaFamily {
    vocab: 129280,
    hidden: 7168,
    intermediate: 18432,
    heads: 128,
    nope: 128,
    rope: 64,
    v: 128,
    q_lora: 1536,
    kv_lora: 512,
    eps: 1e-6,
    moe: DEEPSEEK_V3_MOE,
};

/// `DeepseekV2Config`'s.
const DEEPSEEK_V2: MlaFamily = MlaFamily {
    vocab: 102400,
    hidden: 4096,
    intermediate: 11008,
    heads: 32,
    nope: 128,
    rope: 64,
    v: 128,
    q_lora: 1536,
    kv_lora: 512,
    eps: 1e-6,
    moe: DEEPSEEK_V2_MOE,
};

/// `Glm4MoeLiteConfig`'s (GLM-4.7-Flash's geometry).
const GLM_4_MOE_LITE: MlaFamily = MlaFamily {
    vocab: 154880,
    hidden: 2048,
    intermediate: 10240,
    heads: 20,
    nope: 192,
    rope: 64,
    v: 256,
    q_lora: 768,
    kv_lora: 512,
    eps: 1e-5,
    moe: GLM_MOE_LITE,
};

/// `DeepseekV32Config`'s: DeepSeek-V3's geometry.
const DEEPSEEK_V32: MlaFamily = MlaFamily {
    moe: DEEPSEEK_V32_MOE,
    ..DEEPSEEK_V3
};

/// `AXK1Config`'s (A.X K1's geometry).
const AXK1: MlaFamily = MlaFamily {
    vocab: 163840,
    heads: 64,
    moe: AXK1_MOE,
    ..DEEPSEEK_V3
};

/// `YoutuConfig`'s (Youtu-LLM 2B's geometry; no experts).
const YOUTU: MlaFamily = MlaFamily {
    vocab: 128256,
    hidden: 2048,
    intermediate: 6144,
    heads: 16,
    ..DEEPSEEK_V3
};

/// `GlmMoeDsaConfig`'s (GLM-5's geometry).
const GLM_MOE_DSA_FAMILY: MlaFamily = MlaFamily {
    vocab: 154880,
    hidden: 6144,
    intermediate: 12288,
    heads: 64,
    nope: 192,
    rope: 64,
    v: 256,
    q_lora: 2048,
    kv_lora: 512,
    eps: 1e-5,
    moe: GLM_MOE_DSA,
};

/// `Mistral4Config`'s (Mistral Small 4's geometry).
const MISTRAL4: MlaFamily = MlaFamily {
    vocab: 131072,
    hidden: 4096,
    intermediate: 12288,
    heads: 32,
    nope: 64,
    rope: 64,
    v: 128,
    q_lora: 1024,
    kv_lora: 256,
    eps: 1e-6,
    moe: MISTRAL4_MOE,
};

/// `KimiLinearConfig`'s (Kimi Linear 48B-A3B's attention layers; q without a LoRA).
const KIMI_LINEAR: MlaFamily = MlaFamily {
    vocab: 163840,
    hidden: 2304,
    intermediate: 9216,
    heads: 32,
    nope: 128,
    rope: 64,
    v: 128,
    q_lora: 0,
    kv_lora: 512,
    eps: 1e-5,
    moe: KIMI_LINEAR_MOE,
};

/// The spec of a `DeepseekV3ForCausalLM`, `Glm4MoeLiteForCausalLM` or `Mistral4ForCausalLM`
/// config (and of `KimiLinearForCausalLM`'s attention layers and MoE: [`super::kimi_config`]).
pub(super) fn parse(
    cfg: &Cfg<'_>,
    architecture: Architecture,
    name: String,
) -> Result<ModelSpec, ModelError> {
    // DeepSeek-V2's router: whether it is group-limited (checked before anything is read).
    let v2_group_limited = match architecture {
        Architecture::DeepseekV2 => Some(deepseek_v2_router(cfg)?),
        _ => None,
    };
    let f = match architecture {
        Architecture::Glm4MoeLite => &GLM_4_MOE_LITE,
        Architecture::Mistral4 => &MISTRAL4,
        Architecture::KimiLinear => &KIMI_LINEAR,
        Architecture::DeepseekV32 => &DEEPSEEK_V32,
        Architecture::GlmMoeDsa => &GLM_MOE_DSA_FAMILY,
        Architecture::Axk1 => &AXK1,
        Architecture::Youtu => &YOUTU,
        Architecture::DeepseekV2 => &DEEPSEEK_V2,
        _ => &DEEPSEEK_V3,
    };
    cfg.check_activation()?;
    if cfg.bool_or("attention_bias", false)? {
        return Err(ModelError::Unsupported {
            path: cfg.path_buf(),
            what: "attention_bias in multi-head latent attention (no released model has it)".into(),
        });
    }
    let num_layers = cfg.num_layers()?;
    let num_heads = cfg.usize_or("num_attention_heads", f.heads)?;
    // Every head gets its own k and v from the latent; transformers' attention fails on a
    // config naming fewer kv heads.
    if cfg.usize_or("num_key_value_heads", num_heads)? != num_heads {
        let msg = "multi-head latent attention has one k / v head per q head";
        return Err(cfg.err("num_key_value_heads", msg));
    }
    let (rope_theta, rope_scaling) = cfg.rope(architecture)?;
    let dims = MlaDims {
        heads: num_heads,
        nope: cfg.usize_or("qk_nope_head_dim", f.nope)?,
        rope: cfg.usize_or("qk_rope_head_dim", f.rope)?,
        v: cfg.usize_or("v_head_dim", f.v)?,
        // The sparse-attention classes and DeepSeek-V2's (complex pairs) always rotate
        // interleaved pairs (no `rope_interleave`).
        interleave: architecture.has_sparse_attention()
            || architecture == Architecture::DeepseekV2
            || cfg.bool_or("rope_interleave", true)?,
    };
    if dims.rope == 0 || !dims.rope.is_multiple_of(2) || dims.v == 0 || dims.v > dims.head_dim() {
        let msg = format!(
            "qk_rope_head_dim {} (even, > 0), v_head_dim {} (1..=qk_nope_head_dim + \
             qk_rope_head_dim: hsx pads v heads to the q / k heads)",
            dims.rope, dims.v
        );
        return Err(cfg.err("v_head_dim", msg));
    }
    // The rotary table spans `qk_rope_head_dim · partial_rotary_factor` dims (Mistral 4: the
    // whole head's, the factor `qk_rope_head_dim / head_dim` by default) and is applied to all
    // `qk_rope_head_dim` of them: transformers runs only a factor giving those.
    let (over, factor) = match architecture {
        Architecture::Mistral4 => (dims.head_dim(), dims.rope as f64 / dims.head_dim() as f64),
        _ => (dims.rope, 1.0),
    };
    if rotary_dim(cfg, over, factor)? != dims.rope {
        let msg = "multi-head latent attention rotates all qk_rope_head_dim dims";
        return Err(cfg.err("partial_rotary_factor", msg));
    }
    let mla = MlaSpec {
        q_lora: q_lora_rank(cfg, f.q_lora)?,
        kv_lora: cfg.usize_or("kv_lora_rank", f.kv_lora)?,
        dims,
        score_factor: score_factor(cfg, rope_scaling)?,
        dsa: dsa_spec(cfg, architecture, num_layers, dims.rope)?,
    };
    if mla.q_lora == Some(0) || mla.kv_lora == 0 {
        return Err(cfg.err("kv_lora_rank", "q_lora_rank and kv_lora_rank must be > 0"));
    }
    if (mla.dsa.is_some() || architecture == Architecture::Axk1) && mla.q_lora.is_none() {
        let msg = "null: DeepSeek Sparse Attention's classes and A.X K1's always project q \
                   through q_a_proj";
        return Err(cfg.err("q_lora_rank", msg));
    }
    let max_position_embeddings =
        cfg.usize_or("max_position_embeddings", default_max_pos(architecture))?;
    Ok(ModelSpec {
        vocab_size: cfg.usize_or("vocab_size", f.vocab)?,
        hidden_size: cfg.usize_or("hidden_size", f.hidden)?,
        num_layers,
        num_heads,
        num_kv_heads: num_heads,
        head_dim: dims.head_dim(),
        intermediate_size: cfg.usize_or("intermediate_size", f.intermediate)?,
        rms_norm_eps: cfg.f64_or("rms_norm_eps", f.eps)?,
        rope_theta,
        rope_scaling,
        qkv_bias: false,
        o_bias: false,
        mlp_bias: false,
        qk_norm: QkNorm::None,
        tie_word_embeddings: cfg
            .bool_or("tie_word_embeddings", architecture == Architecture::Youtu)?,
        max_position_embeddings,
        dtype: cfg.dtype()?.unwrap_or(WeightDtype::F32),
        hybrid: Some(HybridSpec {
            layers: vec![LayerKind::Attention; num_layers],
            rotary_dim: dims.rope,
            gdn: None,
            // Youtu's layers are all dense (`YoutuConfig` has no expert fields).
            moe: match (architecture, v2_group_limited) {
                (Architecture::Youtu, _) => None,
                (_, Some(group_limited)) => Some(deepseek_v2_moe(
                    deepseek_moe(cfg, num_layers, &f.moe)?,
                    group_limited,
                )),
                _ => Some(deepseek_moe(cfg, num_layers, &f.moe)?),
            },
            mamba: None,
            nemotron_moe: None,
            mamba1: None,
            mla: Some(mla),
        }),
        sliding_window: cfg.sliding_window(architecture, max_position_embeddings)?,
        query_temperature: super::mistral_config::query_temperature(cfg, architecture)?,
        ..ModelSpec::base(name, architecture)
    })
}

/// What `DeepseekV2TopkRouter` runs: `topk_method` `greedy` (the top-k of the softmax over
/// every expert) or `group_limited_greedy` (the top-k inside the `topk_group` groups with the
/// best single scores: V2 / V2.5), a `num_experts_per_tok` (the class has none), unbiased MLPs.
/// Returns whether the router is group-limited.
fn deepseek_v2_router(cfg: &Cfg<'_>) -> Result<bool, ModelError> {
    let field = "topk_method";
    let group_limited = match cfg.str_or(field, "greedy")? {
        "greedy" => false,
        "group_limited_greedy" => true,
        other => {
            return Err(ModelError::Unsupported {
                path: cfg.path_buf(),
                what: format!(
                    "DeepSeek-V2's topk_method `{other}` (greedy or group_limited_greedy)"
                ),
            });
        }
    };
    cfg.usize_req("num_experts_per_tok")?;
    if cfg.bool_or("mlp_bias", false)? {
        return Err(ModelError::Unsupported {
            path: cfg.path_buf(),
            what: "DeepSeek-V2's mlp_bias (no release has it)".into(),
        });
    }
    Ok(group_limited)
}

/// DeepSeek-V2's router as it runs: never renormalised whatever `norm_topk_prob` says; the
/// greedy one over every expert whatever `n_group` says, the group-limited one ranking the
/// groups by their best expert.
fn deepseek_v2_moe(mut m: MoeSpec, group_limited: bool) -> MoeSpec {
    m.norm_topk_prob = false;
    if let MoeRouter::Grouped {
        n_group,
        topk_group,
        group_rank,
        ..
    } = &mut m.router
    {
        match group_limited {
            true => *group_rank = GroupRank::Best,
            false => (*n_group, *topk_group) = (1, 1),
        }
    }
    m
}

/// `q_lora_rank`: the config class's default when absent, `None` (q through `q_proj`) when
/// null.
fn q_lora_rank(cfg: &Cfg<'_>, default: usize) -> Result<Option<usize>, ModelError> {
    match cfg.has("q_lora_rank") {
        true => cfg.usize_opt("q_lora_rank"),
        // A family without a q LoRA by default (Kimi Linear) has 0 here.
        false => Ok((default > 0).then_some(default)),
    }
}

/// `yarn_get_mscale(factor, mscale_all_dim)²` for a YaRN rope with a nonzero `mscale_all_dim`
/// (in `rope_parameters` or `rope_scaling`), else 1.
fn score_factor(cfg: &Cfg<'_>, scaling: RopeScaling) -> Result<f64, ModelError> {
    let RopeScaling::Yarn { factor, .. } = scaling else {
        return Ok(1.0);
    };
    let all_dim = (cfg.rope_object())
        .and_then(|(_, p)| p.get("mscale_all_dim"))
        .filter(|v| !v.is_null());
    let m = match all_dim {
        None => return Ok(1.0),
        Some(v) => super::pyjson::value_f64(v)
            .ok_or_else(|| cfg.err("rope_scaling.mscale_all_dim", "expected a number"))?,
    };
    if m == 0.0 || factor <= 1.0 {
        return Ok(1.0);
    }
    let mscale = 0.1 * m * factor.ln() + 1.0;
    let f = mscale * mscale;
    match f.is_finite() && f > 0.0 {
        true => Ok(f),
        false => Err(cfg.err(
            "rope_scaling.mscale_all_dim",
            format!("{m} gives a scale {f}"),
        )),
    }
}

#[cfg(test)]
#[path = "deepseek_config_tests.rs"]
mod tests;
