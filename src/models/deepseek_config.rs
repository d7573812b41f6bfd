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
use super::hybrid_config::{HybridSpec, LayerKind, rotary_dim};
use super::moe_config::{
    AXK1_MOE, DEEPSEEK_V3_MOE, DEEPSEEK_V32_MOE, DeepseekMoeDefaults, GLM_MOE_DSA, GLM_MOE_LITE,
    KIMI_LINEAR_MOE, MISTRAL4_MOE, deepseek_moe,
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
    let f = match architecture {
        Architecture::Glm4MoeLite => &GLM_4_MOE_LITE,
        Architecture::Mistral4 => &MISTRAL4,
        Architecture::KimiLinear => &KIMI_LINEAR,
        Architecture::DeepseekV32 => &DEEPSEEK_V32,
        Architecture::GlmMoeDsa => &GLM_MOE_DSA_FAMILY,
        Architecture::Axk1 => &AXK1,
        Architecture::Youtu => &YOUTU,
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
        // The sparse-attention classes always rotate interleaved pairs (no `rope_interleave`).
        interleave: architecture.has_sparse_attention() || cfg.bool_or("rope_interleave", true)?,
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
            moe: match architecture {
                Architecture::Youtu => None,
                _ => Some(deepseek_moe(cfg, num_layers, &f.moe)?),
            },
            mamba: None,
            nemotron_moe: None,
            mla: Some(mla),
        }),
        sliding_window: cfg.sliding_window(architecture, max_position_embeddings)?,
        query_temperature: super::mistral_config::query_temperature(cfg, architecture)?,
        ..ModelSpec::base(name, architecture)
    })
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
mod tests {
    use std::path::Path;

    use serde_json::{Value, json};

    use super::super::{Architecture, ModelSpec, WeightDtype};
    use super::MlaSpec;

    fn parse(v: &Value) -> Result<ModelSpec, String> {
        ModelSpec::from_json(v, Path::new("config.json"), "m".into()).map_err(|e| e.to_string())
    }

    /// DeepSeek-V3's published geometry (`DeepseekV3Config`'s defaults are its values) and its
    /// FP8 blocks, as its config.json names them.
    fn deepseek_v3() -> Value {
        json!({
            "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
            "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
            "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
            "n_shared_experts": 1, "n_routed_experts": 256, "routed_scaling_factor": 2.5,
            "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
            "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4,
            "num_experts_per_tok": 8, "first_k_dense_replace": 3, "norm_topk_prob": true,
            "scoring_func": "sigmoid", "topk_method": "noaux_tc", "hidden_act": "silu",
            "max_position_embeddings": 163840, "rms_norm_eps": 1e-6, "rope_theta": 10000,
            "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                "type": "yarn"},
            "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 129280,
            "num_nextn_predict_layers": 1,
            "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                "quant_method": "fp8", "weight_block_size": [128, 128]}
        })
    }

    #[test]
    fn deepseek_v3_heads_latents_router_and_scale() {
        let s = parse(&deepseek_v3()).unwrap();
        assert_eq!(s.architecture, Architecture::DeepseekV3);
        assert_eq!((s.num_heads, s.num_kv_heads, s.head_dim), (128, 128, 192));
        let h = s.hybrid.as_ref().unwrap();
        let mla = h.mla.as_ref().unwrap();
        assert_eq!((mla.q_lora, mla.kv_lora), (Some(1536), 512));
        assert_eq!((mla.dims.nope, mla.dims.rope, mla.dims.v), (128, 64, 128));
        assert!(mla.dims.interleave);
        assert_eq!(h.rotary_dim, 64);
        // transformers: (0.1 · 1.0 · ln 40 + 1)².
        let m = 0.1 * 40f64.ln() + 1.0;
        assert!(
            (mla.score_factor - m * m).abs() < 1e-12,
            "{}",
            mla.score_factor
        );
        let moe = h.moe.as_ref().unwrap();
        assert_eq!(
            (moe.num_experts, moe.top_k, moe.shared_intermediate),
            (256, 8, Some(2048))
        );
        assert_eq!(moe.sparse_layers.iter().filter(|&&s| !s).count(), 3);
        let g = moe.grouped().unwrap();
        assert_eq!((g.n_group, g.topk_group, g.scale), (8, 4, 2.5));
        let fp8 = s.fp8.unwrap();
        assert_eq!((fp8.rows, fp8.cols, s.dtype), (128, 128, WeightDtype::Bf16));
    }

    #[test]
    fn defaults_plain_rope_and_refusals_name_the_field() {
        let mut v = json!({"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 4,
            "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 512,
            "q_lora_rank": null, "rope_interleave": false});
        let s = parse(&v).unwrap();
        let mla = s.hybrid.as_ref().unwrap().mla.clone().unwrap();
        assert_eq!((mla.q_lora, mla.score_factor), (None, 1.0));
        assert!(!mla.dims.interleave);
        v["v_head_dim"] = json!(193);
        assert!(parse(&v).unwrap_err().contains("v_head_dim"));
        v["v_head_dim"] = json!(128);
        v["qk_rope_head_dim"] = json!(7);
        assert!(parse(&v).unwrap_err().contains("qk_rope_head_dim"));
        v["qk_rope_head_dim"] = json!(64);
        v["attention_bias"] = json!(true);
        assert!(parse(&v).unwrap_err().contains("attention_bias"));
        v["attention_bias"] = json!(false);
        v["kv_lora_rank"] = json!(0);
        assert!(parse(&v).unwrap_err().contains("kv_lora_rank"));
        v["kv_lora_rank"] = json!(512);
        v["n_group"] = json!(7);
        assert!(parse(&v).unwrap_err().contains("n_group"));
    }

    fn mla(v: &Value) -> MlaSpec {
        parse(v).unwrap().hybrid.unwrap().mla.unwrap()
    }

    /// `Glm4MoeLiteConfig`'s defaults are GLM-4.7-Flash's geometry; `mlp_layer_types` alone
    /// says which layers are dense (the class ignores `first_k_dense_replace`).
    #[test]
    fn glm_4_moe_lite_defaults_and_layer_types() {
        let mut v = json!({"architectures": ["Glm4MoeLiteForCausalLM"], "num_hidden_layers": 47});
        let s = parse(&v).unwrap();
        assert_eq!(s.architecture, Architecture::Glm4MoeLite);
        assert_eq!(
            (s.vocab_size, s.hidden_size, s.intermediate_size),
            (154880, 2048, 10240)
        );
        assert_eq!((s.num_heads, s.head_dim, s.rms_norm_eps), (20, 256, 1e-5));
        assert_eq!(s.max_position_embeddings, 202752);
        let h = s.hybrid.as_ref().unwrap();
        let m = h.mla.as_ref().unwrap();
        assert_eq!((m.q_lora, m.kv_lora), (Some(768), 512));
        assert_eq!((m.dims.nope, m.dims.rope, m.dims.v), (192, 64, 256));
        let moe = h.moe.as_ref().unwrap();
        assert_eq!(
            (moe.num_experts, moe.top_k, moe.expert_intermediate),
            (64, 4, 1536)
        );
        assert_eq!(moe.shared_intermediate, Some(1536));
        let g = moe.grouped().unwrap();
        assert_eq!((g.n_group, g.topk_group, g.scale), (1, 1, 1.8));
        assert!(!moe.sparse_layers[0] && moe.sparse_layers[1..].iter().all(|&s| s));
        v["num_hidden_layers"] = json!(3);
        v["first_k_dense_replace"] = json!(2);
        v["mlp_layer_types"] = json!(["sparse", "dense", "sparse"]);
        let moe = parse(&v).unwrap().hybrid.unwrap().moe.unwrap();
        assert_eq!(moe.sparse_layers, [true, false, true]);
        for bad in [
            json!(["sparse", "dense"]),
            json!(["sparse", "moe", "dense"]),
        ] {
            v["mlp_layer_types"] = bad;
            assert!(parse(&v).unwrap_err().contains("mlp_layer_types"));
        }
    }

    /// An absent `q_lora_rank` is the class default (q through its latent), a null one means
    /// `q_proj`. Fewer kv heads than q heads, and a partial rotary factor, are refused: the
    /// expanded heads and the rotated dims would not line up (transformers fails on both).
    #[test]
    fn q_latent_default_kv_heads_and_rotary_factor() {
        let mut v = json!({"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 4});
        assert_eq!(mla(&v).q_lora, Some(1536));
        v["q_lora_rank"] = Value::Null;
        assert_eq!(mla(&v).q_lora, None);
        v["num_key_value_heads"] = json!(8);
        assert!(parse(&v).unwrap_err().contains("num_key_value_heads"));
        v["num_key_value_heads"] = json!(128);
        v["partial_rotary_factor"] = json!(0.5);
        assert!(parse(&v).unwrap_err().contains("partial_rotary_factor"));
        v["partial_rotary_factor"] = json!(1.0);
        assert_eq!(mla(&v).dims.rope, 64);
    }

    /// DeepSeek-V3.2 and GLM-5 (DeepSeek Sparse Attention): the classes' geometry, interleaved
    /// pairs whatever `rope_interleave` says, their whole context (the indexer's selection runs
    /// past `index_topk`); a null q latent is refused by name (the indexer's own fields:
    /// dsa_config_tests.rs).
    #[test]
    fn sparse_attention_families_parse_with_their_indexer() {
        let mut v = json!({"architectures": ["DeepseekV32ForCausalLM"], "num_hidden_layers": 5,
            "rope_interleave": false});
        let s = parse(&v).unwrap();
        assert_eq!(
            (s.architecture, s.num_heads, s.head_dim),
            (Architecture::DeepseekV32, 128, 192)
        );
        assert_eq!(s.max_position_embeddings, 163840);
        let m = s.hybrid.as_ref().unwrap().mla.clone().unwrap();
        let dsa = m.dsa.unwrap();
        assert_eq!((m.q_lora, dsa.topk, dsa.heads), (Some(1536), 2048, 64));
        assert!(m.dims.interleave && !dsa.interleave);
        let moe = s.hybrid.unwrap().moe.unwrap();
        assert_eq!(moe.sparse_layers, [false, false, false, true, true]);
        v["mlp_layer_types"] = json!(["dense", "sparse", "sparse", "sparse", "dense"]);
        v["index_topk"] = json!(64);
        v["max_position_embeddings"] = json!(4096);
        let s = parse(&v).unwrap();
        assert_eq!(s.max_position_embeddings, 4096);
        let moe = s.hybrid.unwrap().moe.unwrap();
        assert_eq!(moe.sparse_layers, [false, true, true, true, false]);
        v["q_lora_rank"] = Value::Null;
        assert!(parse(&v).unwrap_err().contains("q_lora_rank"));

        let glm = json!({"architectures": ["GlmMoeDsaForCausalLM"], "num_hidden_layers": 78});
        let s = parse(&glm).unwrap();
        assert_eq!(
            (s.vocab_size, s.hidden_size, s.num_heads, s.rms_norm_eps),
            (154880, 6144, 64, 1e-5)
        );
        assert_eq!(s.max_position_embeddings, 202752);
        let m = s.hybrid.as_ref().unwrap().mla.clone().unwrap();
        let dsa = m.dsa.unwrap();
        assert_eq!((m.q_lora, m.kv_lora, dsa.topk), (Some(2048), 512, 2048));
        assert!(dsa.interleave && dsa.heads == 32);
        assert_eq!((m.dims.nope, m.dims.rope, m.dims.v), (192, 64, 256));
        let moe = s.hybrid.unwrap().moe.unwrap();
        assert_eq!(
            (moe.num_experts, moe.top_k, moe.expert_intermediate),
            (256, 8, 2048)
        );
        assert_eq!(moe.grouped().unwrap().scale, 2.5);
        assert_eq!(moe.sparse_layers.iter().filter(|&&s| !s).count(), 3);
        // DeepSeek-V3 itself has no indexer.
        let v3 = json!({"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 4,
            "index_topk": 8});
        assert_eq!(mla(&v3).dsa, None);
    }

    /// AXK1Config's geometry; its MoE layers from `mlp_layer_types`, else from the legacy
    /// `first_k_dense_replace` (1) and `moe_layer_freq` (1); q always through its latent.
    #[test]
    fn axk1_defaults_layer_pattern_and_q_latent() {
        let mut v = json!({"architectures": ["AXK1ForCausalLM"], "num_hidden_layers": 6});
        let s = parse(&v).unwrap();
        assert_eq!(s.architecture, Architecture::Axk1);
        assert_eq!((s.vocab_size, s.num_heads, s.head_dim), (163840, 64, 192));
        assert_eq!(s.max_position_embeddings, 32768);
        let h = s.hybrid.as_ref().unwrap();
        assert_eq!(h.mla.as_ref().unwrap().q_lora, Some(1536));
        let m = h.moe.as_ref().unwrap();
        assert_eq!(
            (m.num_experts, m.top_k, m.shared_intermediate),
            (192, 8, Some(2048))
        );
        assert_eq!(m.sparse_layers, [false, true, true, true, true, true]);
        v["first_k_dense_replace"] = json!(2);
        v["moe_layer_freq"] = json!(2);
        let sparse = |v: &Value| parse(v).unwrap().hybrid.unwrap().moe.unwrap().sparse_layers;
        assert_eq!(sparse(&v), [false, false, true, false, true, false]);
        v["mlp_layer_types"] = json!(["dense", "sparse", "dense", "sparse", "dense", "sparse"]);
        assert_eq!(sparse(&v), [false, true, false, true, false, true]);
        v["moe_layer_freq"] = json!(0);
        v.as_object_mut().unwrap().remove("mlp_layer_types");
        assert!(parse(&v).unwrap_err().contains("moe_layer_freq"));
        v["moe_layer_freq"] = json!(1);
        v["q_lora_rank"] = json!(null);
        assert!(parse(&v).unwrap_err().contains("q_lora_rank"));
    }

    /// YoutuConfig: DeepSeek-V3's attention fields in Llama's dense layers, tied by default.
    #[test]
    fn youtu_is_dense_with_latent_attention() {
        let s =
            parse(&json!({"architectures": ["YoutuForCausalLM"], "num_hidden_layers": 4})).unwrap();
        assert_eq!(s.architecture, Architecture::Youtu);
        assert_eq!(
            (s.hidden_size, s.num_heads, s.intermediate_size),
            (2048, 16, 6144)
        );
        assert!(s.tie_word_embeddings);
        let h = s.hybrid.as_ref().unwrap();
        assert!(h.moe.is_none());
        let mla = h.mla.as_ref().unwrap();
        assert_eq!(
            (mla.q_lora, mla.kv_lora, mla.dims.rope),
            (Some(1536), 512, 64)
        );
    }
}
