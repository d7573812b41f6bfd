//! `config.json` of gpt-oss (`GptOssForCausalLM`, transformers `GptOssConfig`) -> a
//! [`ModelSpec`] with a [`GptOssSpec`]: `layer_types` (default: even layers sliding, odd
//! full), `sliding_window` (default 128), `num_local_experts` / `num_experts_per_tok`,
//! `swiglu_alpha` / `swiglu_limit`, YaRN in `rope_parameters` / `rope_scaling` (default
//! gpt-oss's own when absent), biased attention (`attention_bias`, default true), and MXFP4
//! experts when `quantization_config.quant_method` is `mxfp4`.

use serde_json::Value;

use super::ModelError;
use super::config::{
    Architecture, Cfg, ModelSpec, QkNorm, RopeScaling, WeightDtype, default_max_pos,
};

/// The gpt-oss part of a [`ModelSpec`].
#[derive(Debug, Clone, PartialEq)]
pub struct GptOssSpec {
    /// Per layer: the sliding window (keys `pos - window + 1 ..= pos`), `None` for full
    /// attention.
    pub windows: Vec<Option<usize>>,
    pub num_experts: usize,
    pub top_k: usize,
    /// The experts' `gate · sigmoid(alpha · gate) · (up + 1)` after clamping gate above and up
    /// on both sides at `limit`.
    pub swiglu_alpha: f64,
    pub swiglu_limit: f64,
    /// Experts stored as MXFP4 `*_blocks` + `*_scales`.
    pub mxfp4: bool,
}

/// gpt-oss's RoPE when the config names none (transformers `GptOssConfig.__post_init__`).
const DEFAULT_YARN: RopeScaling = RopeScaling::Yarn {
    factor: 32.0,
    beta_fast: 32.0,
    beta_slow: 1.0,
    original_max_position_embeddings: 4096.0,
    truncate: false,
    // 0.1 · ln(32) + 1
    attention_factor: 1.346_573_590_279_972_6,
};

pub(super) fn parse(cfg: &Cfg<'_>, value: &Value, name: String) -> Result<ModelSpec, ModelError> {
    cfg.check_activation()?;
    let num_layers = cfg.num_layers()?;
    let hidden_size = cfg.usize_req("hidden_size")?;
    let num_heads = cfg.usize_or("num_attention_heads", 64)?;
    let has_rope = cfg.rope_object().is_some();
    let (rope_theta, rope_scaling) = match has_rope {
        true => cfg.rope(Architecture::GptOss)?,
        false => (cfg.f64_or("rope_theta", 150000.0)?, DEFAULT_YARN),
    };
    let bias = cfg.bool_or("attention_bias", true)?;
    let gpt_oss = GptOssSpec {
        windows: windows(cfg, num_layers)?,
        num_experts: cfg.usize_or("num_local_experts", 128)?,
        top_k: cfg.usize_or("num_experts_per_tok", 4)?,
        swiglu_alpha: cfg.f64_or("swiglu_alpha", 1.702)?,
        swiglu_limit: cfg.f64_or("swiglu_limit", 7.0)?,
        mxfp4: is_mxfp4(value),
    };
    check(cfg, &gpt_oss)?;
    Ok(ModelSpec {
        vocab_size: cfg.usize_req("vocab_size")?,
        hidden_size,
        num_layers,
        num_heads,
        num_kv_heads: cfg.usize_or("num_key_value_heads", num_heads)?,
        head_dim: cfg.usize_or("head_dim", hidden_size / num_heads.max(1))?,
        intermediate_size: cfg.usize_req("intermediate_size")?,
        rms_norm_eps: cfg.f64_or("rms_norm_eps", 1e-5)?,
        rope_theta,
        rope_scaling,
        qkv_bias: bias,
        o_bias: bias,
        mlp_bias: true,
        qk_norm: QkNorm::None,
        tie_word_embeddings: cfg.bool_or("tie_word_embeddings", false)?,
        max_position_embeddings: cfg.usize_or(
            "max_position_embeddings",
            default_max_pos(Architecture::GptOss),
        )?,
        dtype: cfg.dtype()?.unwrap_or(WeightDtype::F32),
        gpt_oss: Some(gpt_oss),
        ..ModelSpec::base(name, Architecture::GptOss)
    })
}

fn is_mxfp4(value: &Value) -> bool {
    let method = value
        .get("quantization_config")
        .and_then(|q| q.get("quant_method"));
    method.and_then(Value::as_str) == Some("mxfp4")
}

/// Per-layer windows from `layer_types` and `sliding_window`.
fn windows(cfg: &Cfg<'_>, num_layers: usize) -> Result<Vec<Option<usize>>, ModelError> {
    let window = cfg.usize_or("sliding_window", 128)?;
    let sliding = match cfg.sliding_layer_types(num_layers)? {
        Some(sliding) => sliding,
        None => (0..num_layers).map(|i| i % 2 == 0).collect(),
    };
    if window == 0 && sliding.contains(&true) {
        return Err(cfg.err("sliding_window", "must be > 0"));
    }
    Ok(sliding.iter().map(|&s| s.then_some(window)).collect())
}

const MAX_EXPERTS: usize = 1 << 16;

fn check(cfg: &Cfg<'_>, g: &GptOssSpec) -> Result<(), ModelError> {
    // Released models have at most a few hundred experts; per-expert lists are made from it.
    if g.num_experts > MAX_EXPERTS {
        let m = format!("{} is more than hsx accepts ({MAX_EXPERTS})", g.num_experts);
        return Err(cfg.err("num_local_experts", m));
    }
    if g.num_experts == 0 || g.top_k == 0 || g.top_k > g.num_experts {
        let m = format!("top-{} of {} experts", g.top_k, g.num_experts);
        return Err(cfg.err("num_experts_per_tok", m));
    }
    let finite = |v: f64| v.is_finite() && v > 0.0;
    if !finite(g.swiglu_alpha) || !finite(g.swiglu_limit) {
        let m = format!(
            "alpha {} / limit {} must be > 0",
            g.swiglu_alpha, g.swiglu_limit
        );
        return Err(cfg.err("swiglu_limit", m));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::json;

    use super::*;

    /// openai/gpt-oss-20b's config.json as released (rope in the old `rope_scaling` field;
    /// field for field as a public test suite vendors it).
    fn released_20b() -> Value {
        json!({
          "architectures": ["GptOssForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
          "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
          "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
          "intermediate_size": 2880,
          "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention",
            "sliding_attention", "full_attention", "sliding_attention", "full_attention",
            "sliding_attention", "full_attention", "sliding_attention", "full_attention",
            "sliding_attention", "full_attention", "sliding_attention", "full_attention",
            "sliding_attention", "full_attention", "sliding_attention", "full_attention",
            "sliding_attention", "full_attention", "sliding_attention", "full_attention"],
          "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
          "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
          "num_local_experts": 32, "output_router_logits": false, "pad_token_id": 199999,
          "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn",
            "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
          "rms_norm_eps": 1e-05,
          "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
            "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": false},
          "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
          "swiglu_limit": 7.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
          "transformers_version": "4.55.0.dev0", "use_cache": true, "vocab_size": 201088
        })
    }

    fn parse(v: &Value) -> Result<ModelSpec, ModelError> {
        ModelSpec::from_json(v, Path::new("config.json"), "m".into())
    }

    #[test]
    fn released_20b_config_is_accepted() {
        let s = parse(&released_20b()).unwrap();
        let g = s.gpt_oss.as_ref().unwrap();
        assert_eq!((s.num_layers, s.head_dim, s.num_kv_heads), (24, 64, 8));
        assert_eq!((g.num_experts, g.top_k, g.mxfp4), (32, 4, true));
        assert_eq!(g.windows[0], Some(128));
        assert_eq!(g.windows[1], None);
        assert_eq!(s.rope_theta, 150000.0);
        let RopeScaling::Yarn {
            factor,
            truncate,
            attention_factor,
            ..
        } = s.rope_scaling
        else {
            panic!("{:?}", s.rope_scaling)
        };
        assert!(factor == 32.0 && !truncate);
        assert!((attention_factor - (0.1 * 32f64.ln() + 1.0)).abs() < 1e-12);
        assert!(s.qkv_bias && s.o_bias && s.dtype == WeightDtype::Bf16);
    }

    #[test]
    fn bad_options_name_the_field() {
        let mut v = released_20b();
        v["layer_types"] = json!(["sliding_attention", "chunked_attention"]);
        let e = parse(&v).unwrap_err().to_string();
        assert!(e.contains("layer_types"), "{e}");
        let mut v = released_20b();
        v["num_experts_per_tok"] = json!(64);
        let e = parse(&v).unwrap_err().to_string();
        assert!(e.contains("num_experts_per_tok"), "{e}");
        let mut v = released_20b();
        v["quantization_config"] = json!({"quant_method": "fp8"});
        let e = parse(&v).unwrap_err().to_string();
        assert!(e.contains("fp8"), "{e}");
    }
}
