//! Configs of checkpoints as they are released, before the per-family parsing:
//! - multimodal exports whose language model hsx runs text-only: `Qwen3_5ForConditionalGeneration`,
//!   `Qwen3_5MoeForConditionalGeneration`, `Qwen4ExpForConditionalGeneration`,
//!   `Qwen3VLForConditionalGeneration`,
//!   `Qwen3VLMoeForConditionalGeneration`, `Llama4ForConditionalGeneration`,
//!   `Gemma3ForConditionalGeneration`, `Gemma4ForConditionalGeneration`,
//!   `Gemma4UnifiedForConditionalGeneration`,
//!   `Mistral3ForConditionalGeneration`, `KimiK25ForConditionalGeneration`,
//!   `Exaone4_5_ForConditionalGeneration`,
//!   `Qwen2VLForConditionalGeneration` and `Qwen2_5_VLForConditionalGeneration` (the text
//!   fields under `text_config` — or, in Qwen2-VL's pre-v5 saves, at the top level — the
//!   weights under `model.language_model.*`, Llama-4's, Gemma-3's and Mistral-3's releases'
//!   and Kimi-K2.5's `language_model.model.*` (and `language_model.lm_head`), Qwen2-VL's
//!   releases' `model.*`;
//!   the vision tower left unread);
//!   other multimodal exports are refused;
//! - quantized checkpoints (`quantization_config`) are refused but for block-quantized FP8
//!   (dequantized at load, [`super::fp8_weights`]), compressed-tensors' packed integer and
//!   float8 weights ([`super::compressed_tensors`]) and gpt-oss's MXFP4 experts: hsx loads
//!   bf16 / f16 / f32.

use std::borrow::Cow;
use std::path::Path;

use serde_json::{Value, json};

use super::ModelError;

/// Multimodal exports run text-only: (export class, the text model's class).
pub(super) const TEXT_OF_MULTIMODAL: &[(&str, &str)] = &[
    ("Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM"),
    (
        "Qwen3_5MoeForConditionalGeneration",
        "Qwen3_5MoeForCausalLM",
    ),
    ("Qwen4ExpForConditionalGeneration", "Qwen4ExpForCausalLM"),
    // Qwen3's layers; MRoPE over text-only positions (t = h = w) is Qwen3's RoPE.
    ("Qwen3VLForConditionalGeneration", "Qwen3ForCausalLM"),
    ("Qwen3VLMoeForConditionalGeneration", "Qwen3MoeForCausalLM"),
    // Its text config is Llama4ForCausalLM's own class (`Llama4TextConfig`).
    ("Llama4ForConditionalGeneration", "Llama4ForCausalLM"),
    // Qwen2's layers (q/k/v biased); MRoPE over text-only positions is Qwen2's RoPE.
    ("Qwen2_5_VLForConditionalGeneration", "Qwen2ForCausalLM"),
    ("Qwen2VLForConditionalGeneration", "Qwen2ForCausalLM"),
    // Its text config is Gemma3ForCausalLM's own class (`Gemma3TextConfig`).
    ("Gemma3ForConditionalGeneration", "Gemma3ForCausalLM"),
    // Its text config is Gemma4ForCausalLM's own class (`Gemma4TextConfig`).
    ("Gemma4ForConditionalGeneration", "Gemma4ForCausalLM"),
    // Gemma 4 12B: its text config is Gemma4UnifiedForCausalLM's class.
    (
        "Gemma4UnifiedForConditionalGeneration",
        "Gemma4UnifiedForCausalLM",
    ),
    // Mistral-Small-3.1 / 3.2: a `mistral` text config (`MistralConfig`'s defaults); Ministral 3
    // and Devstral (Small) 2 a `ministral3` one, Mistral Small 4 a `mistral4` one
    // ([`MISTRAL3_TEXT`]).
    ("Mistral3ForConditionalGeneration", "MistralForCausalLM"),
    // Kimi-K2.5 / K2.6 (the name its remote code gives, and transformers' own): a DeepSeek-V3
    // text config (`model_type` `kimi_k2`, read as `deepseek_v3`).
    ("KimiK25ForConditionalGeneration", "DeepseekV3ForCausalLM"),
    ("Kimi_K25ForConditionalGeneration", "DeepseekV3ForCausalLM"),
    // EXAONE 4.5: an `exaone4` text config (`exaone4_5_text`, which transformers reads as one).
    ("Exaone4_5_ForConditionalGeneration", "Exaone4ForCausalLM"),
    // LFM2-VL / LFM2.5-VL: an `lfm2` text config.
    ("Lfm2VlForConditionalGeneration", "Lfm2ForCausalLM"),
    // LFM3-VL: an `lfm3` text config.
    ("Lfm3VlForConditionalGeneration", "Lfm3ForCausalLM"),
    // GLM-4.5V / 4.6V: GLM-4.5's layers (`glm4v_moe_text`), no q/k norm; MRoPE over text-only
    // positions is GLM-4.5's partial rotate-half RoPE.
    ("Glm4vMoeForConditionalGeneration", "Glm4MoeForCausalLM"),
];

/// `Mistral3ForConditionalGeneration`'s text classes by `text_config.model_type` (absent:
/// `mistral`, `Mistral3Config`'s default).
const MISTRAL3_TEXT: &[(&str, &str)] = &[
    ("mistral", "MistralForCausalLM"),
    ("ministral3", "Ministral3ForCausalLM"),
    ("mistral4", "Mistral4ForCausalLM"),
];

/// The text model's class of a `arch` export whose text config is `text`: the one
/// [`TEXT_OF_MULTIMODAL`] names, or for Mistral-3 exports the one its `model_type` names.
fn text_class(
    arch: &str,
    fixed: &'static str,
    text: &serde_json::Map<String, Value>,
    path: &Path,
) -> Result<&'static str, ModelError> {
    if arch != "Mistral3ForConditionalGeneration" {
        return Ok(fixed);
    }
    let kind = text
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or("mistral");
    let found = MISTRAL3_TEXT.iter().find(|(k, _)| *k == kind);
    found
        .map(|&(_, class)| class)
        .ok_or_else(|| ModelError::Unsupported {
            path: path.to_path_buf(),
            what: format!(
                "`{arch}` with text_config.model_type `{kind}` (hsx runs {})",
                MISTRAL3_TEXT
                    .iter()
                    .map(|(k, _)| *k)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
}

/// Exports whose class ties the LM head to the embedding unless the config says otherwise
/// (`Gemma3Config`'s, `Gemma4Config`'s and `Gemma4UnifiedConfig`'s default; the other export classes hsx runs default
/// to untied — but `Mistral3Config`, whose default is tied too: its releases name no tie and
/// carry their own `language_model.lm_head`, which transformers 5.24 keeps, finding two
/// tensors to tie).
const TIED_BY_DEFAULT: [&str; 5] = [
    "Gemma3ForConditionalGeneration",
    "Gemma4ForConditionalGeneration",
    "Gemma4UnifiedForConditionalGeneration",
    "Lfm2VlForConditionalGeneration",
    "Lfm3VlForConditionalGeneration",
];

/// Exports whose pre-v5 saves (every released checkpoint) keep the text fields at the top
/// level, without a `text_config`; their LM head is tied when the top level or the text config
/// says so (transformers' BC rule for them).
const QWEN2_VL: [&str; 2] = [
    "Qwen2_5_VLForConditionalGeneration",
    "Qwen2VLForConditionalGeneration",
];

/// Where a multimodal export's text config class reads a field otherwise than the text
/// model's class hsx parses it as: (field and the other names it is saved under, value,
/// forced). A forced value replaces the config's (the class ignores the field); the others
/// fill it in where no name of it is set (the class's default differs).
fn text_class_fields(export: &str) -> Vec<(&'static [&'static str], Value, bool)> {
    let theta = (&["rope_theta"][..], json!(500000.0), false);
    match export {
        "Qwen3VLForConditionalGeneration" => vec![theta],
        // Glm4vMoeTextConfig's defaults where Glm4MoeConfig's differ; its attention has no q/k
        // norm whatever the config says.
        "Glm4vMoeForConditionalGeneration" => vec![
            (&["vocab_size"][..], json!(151424), false),
            (&["max_position_embeddings"], json!(65536), false),
            (&["attention_bias"], json!(true), false),
            (&["use_qk_norm"], json!(false), true),
        ],
        a if QWEN2_VL.contains(&a) => vec![
            (&["rope_theta"][..], json!(1000000.0), false),
            (&["rms_norm_eps"], json!(1e-5), false),
            (&["vocab_size"], json!(152064), false),
        ],
        "Qwen3VLMoeForConditionalGeneration" => vec![
            theta,
            // Qwen3VLMoeTextTopKRouter always renormalises the top-k weights.
            (&["norm_topk_prob"], json!(true), true),
            (&["num_experts", "num_local_experts"], json!(60), false),
            (&["num_experts_per_tok"], json!(4), false),
            (&["moe_intermediate_size"], json!(1408), false),
        ],
        _ => Vec::new(),
    }
}

/// Top-level fields of a multimodal config that describe its language model too (taken when
/// `text_config` does not set them).
const SHARED_FIELDS: &[&str] = &["dtype", "torch_dtype", "quantization_config"];

fn first_architecture(value: &Value) -> &str {
    value
        .get("architectures")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The config hsx parses: `value` itself, or for a multimodal export it runs, its `text_config`
/// as a text model's config. Refuses other multimodal exports and quantized checkpoints.
pub(super) fn text_model_config<'a>(
    value: &'a Value,
    path: &Path,
) -> Result<Cow<'a, Value>, ModelError> {
    reject_quantized(value, path)?;
    let arch = first_architecture(value);
    let text_arch = TEXT_OF_MULTIMODAL.iter().find(|(mm, _)| *mm == arch);
    let has_vision = value.get("vision_config").is_some_and(|v| !v.is_null());
    let Some(&(_, text_arch)) = text_arch else {
        if has_vision || arch.ends_with("ForConditionalGeneration") {
            return Err(ModelError::Unsupported {
                path: path.to_path_buf(),
                what: format!(
                    "multimodal checkpoint `{arch}` (hsx runs the language model of {} only)",
                    TEXT_OF_MULTIMODAL
                        .iter()
                        .map(|(mm, _)| *mm)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
        return Ok(Cow::Borrowed(value));
    };
    let mut text = match value.get("text_config") {
        Some(Value::Object(t)) => t.clone(),
        None | Some(Value::Null) if QWEN2_VL.contains(&arch) => legacy_text_config(value),
        _ => {
            return Err(ModelError::Field {
                path: path.to_path_buf(),
                field: "text_config".into(),
                message: format!(
                    "missing or not an object (a `{arch}` config keeps its language model there)"
                ),
            });
        }
    };
    for field in SHARED_FIELDS {
        if let Some(v) = value.get(*field).filter(|v| !v.is_null()) {
            text.entry(field.to_string()).or_insert_with(|| v.clone());
        }
    }
    // The export's model ties its LM head by its own config (false by default in every
    // export class hsx runs but Gemma-3's), whatever its text config says (transformers 5.24,
    // checked) — but Qwen2-VL's and Qwen2.5-VL's, which also tie where the text config says so.
    let tie = |v: &serde_json::Map<String, Value>| {
        v.get("tie_word_embeddings").and_then(Value::as_bool) == Some(true)
    };
    // `Lfm2VlConfig` pops `tie_embedding` over `tie_word_embeddings`.
    let lfm2_tie = (arch == "Lfm2VlForConditionalGeneration")
        .then(|| value.get("tie_embedding"))
        .flatten();
    let top = match lfm2_tie
        .or(value.get("tie_word_embeddings"))
        .and_then(Value::as_bool)
    {
        Some(t) => t,
        None => TIED_BY_DEFAULT.contains(&arch),
    };
    let tied = top || (QWEN2_VL.contains(&arch) && tie(&text));
    text.insert("tie_word_embeddings".into(), Value::from(tied));
    // LFM2's own alias, which its text class would read over the export's decision.
    text.remove("tie_embedding");
    if QWEN2_VL.contains(&arch) {
        plain_mrope(&mut text);
    }
    for (names, v, forced) in text_class_fields(arch) {
        if forced
            || !names
                .iter()
                .any(|n| text.get(*n).is_some_and(|x| !x.is_null()))
        {
            text.insert(names[0].into(), v);
        }
    }
    let text_arch = text_class(arch, text_arch, &text, path)?;
    text.insert("architectures".into(), Value::from(vec![text_arch]));
    reject_quantized(&Value::Object(text.clone()), path)?;
    tracing::info!(
        "{arch}: running its language model only ({text_arch}); the vision tower is not read"
    );
    Ok(Cow::Owned(Value::Object(text)))
}

/// A pre-v5 Qwen2-VL / Qwen2.5-VL config: the text fields are the top level's (transformers
/// builds the text config from them); the vision tower's are left behind.
fn legacy_text_config(value: &Value) -> serde_json::Map<String, Value> {
    let mut text = value.as_object().cloned().unwrap_or_default();
    text.remove("vision_config");
    text
}

/// Qwen2-VL's rope type `mrope` (pre-v5 `rope_scaling: {"type": "mrope", "mrope_section"}`) is
/// the default RoPE over text-only positions: transformers reads it as `default`.
fn plain_mrope(text: &mut serde_json::Map<String, Value>) {
    for field in ["rope_scaling", "rope_parameters"] {
        let Some(Value::Object(rope)) = text.get_mut(field) else {
            continue;
        };
        let kind = |k: &str| rope.get(k).and_then(Value::as_str) == Some("mrope");
        if kind("type") || kind("rope_type") {
            rope.remove("type");
            rope.insert("rope_type".into(), json!("default"));
        }
    }
}

/// A `quantization_config` other than none: refused, naming the method.
fn reject_quantized(value: &Value, path: &Path) -> Result<(), ModelError> {
    let Some(q) = value.get("quantization_config").filter(|q| !q.is_null()) else {
        return Ok(());
    };
    let method = q.get("quant_method").and_then(Value::as_str);
    // gpt-oss's MXFP4 experts are dequantized at load (models::mxfp4), FP8 weights too
    // (models::fp8_weights, which checks the rest of the config; not gpt-oss's experts,
    // stored transposed and stacked, and never released in FP8).
    let gpt_oss = first_architecture(value) == "GptOssForCausalLM";
    // compressed-tensors: its integer and float8 weights are dequantized at load
    // (models::compressed_tensors, which checks the rest of the config).
    if method == Some("none")
        || (method == Some("fp8") && !gpt_oss)
        || method == Some("compressed-tensors")
        || (method == Some("mxfp4") && gpt_oss)
    {
        return Ok(());
    }
    Err(ModelError::Unsupported {
        path: path.to_path_buf(),
        what: format!(
            "quantized checkpoint (quantization_config, quant_method `{}`): hsx loads bf16, f16 \
             and f32 weights, block-quantized FP8 (`fp8`), compressed-tensors' packed integer and \
             float8 weights and gpt-oss's MXFP4 experts; use the unquantized release of the model",
            method.unwrap_or("?")
        ),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn text_of(v: &Value) -> Result<Value, ModelError> {
        text_model_config(v, Path::new("config.json")).map(Cow::into_owned)
    }

    #[test]
    fn qwen3_5_export_runs_its_text_config() {
        let v = json!({
            "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
            "tie_word_embeddings": true, "vision_config": {"depth": 2},
            "text_config": {"hidden_size": 64, "dtype": "bfloat16", "tie_word_embeddings": false}
        });
        let t = text_of(&v).unwrap();
        assert_eq!(t["architectures"], json!(["Qwen3_5ForCausalLM"]));
        assert_eq!(t["hidden_size"], 64);
        assert_eq!(t["dtype"], "bfloat16");
        // The top level's tie wins over text_config's (the export's model ties by its own
        // config), and is false where absent.
        assert_eq!(t["tie_word_embeddings"], true);
        let mut untied = v.clone();
        untied
            .as_object_mut()
            .unwrap()
            .remove("tie_word_embeddings");
        untied["text_config"]["tie_word_embeddings"] = json!(true);
        assert_eq!(text_of(&untied).unwrap()["tie_word_embeddings"], false);
        let mut no_text = v.clone();
        no_text.as_object_mut().unwrap().remove("text_config");
        let e = text_of(&no_text).unwrap_err().to_string();
        assert!(e.contains("text_config"), "{e}");
    }

    /// The shape of the released Qwen3.5-27B export (sizes as public conversion code states
    /// them, e.g. THUDM/slime scripts/models/qwen3.5-27B.sh; field layout as transformers 5
    /// writes a `Qwen3_5Config`): parsed through `ModelSpec::from_json`.
    #[test]
    fn qwen3_5_27b_shaped_export_parses() {
        let layer_types: Vec<&str> = (0..64)
            .map(|i| match (i + 1) % 4 {
                0 => "full_attention",
                _ => "linear_attention",
            })
            .collect();
        let v = json!({
            "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
            "image_token_id": 248056, "tie_word_embeddings": false,
            "text_config": {
                "attention_bias": false, "attn_output_gate": true, "dtype": "bfloat16",
                "full_attention_interval": 4, "head_dim": 256, "hidden_act": "silu",
                "hidden_size": 5120, "intermediate_size": 17408, "layer_types": layer_types,
                "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
                "linear_num_key_heads": 16, "linear_num_value_heads": 48,
                "linear_value_head_dim": 128, "mamba_ssm_dtype": "float32",
                "max_position_embeddings": 262144, "model_type": "qwen3_5_text",
                "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": false,
                "num_attention_heads": 24, "num_hidden_layers": 64, "num_key_value_heads": 4,
                "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-6,
                "rope_parameters": {"mrope_interleaved": true, "mrope_section": [11, 11, 10],
                    "partial_rotary_factor": 0.25, "rope_theta": 10000000, "rope_type": "default"},
                "tie_word_embeddings": false, "vocab_size": 248320
            },
            "vision_config": {"depth": 27, "hidden_size": 1152, "out_hidden_size": 5120}
        });
        let s =
            super::super::ModelSpec::from_json(&v, Path::new("config.json"), "m".into()).unwrap();
        let h = s.hybrid.as_ref().unwrap();
        assert_eq!(
            (s.num_layers, s.hidden_size, s.vocab_size),
            (64, 5120, 248320)
        );
        assert_eq!((s.num_heads, s.num_kv_heads, s.head_dim), (24, 4, 256));
        assert_eq!(h.rotary_dim, 64);
        assert_eq!(h.gdn.as_ref().unwrap().num_v_heads, 48);
        assert_eq!(s.rope_theta, 1e7);
    }

    /// Shaped as GLM-4.5V's config: GLM-4.5's layers, MRoPE sections in the RoPE object
    /// (plain RoPE over text positions), no q/k norm even where a config names one, and
    /// Glm4vMoeTextConfig's defaults where fields are absent.
    #[test]
    fn glm4v_moe_export_runs_as_glm4_moe() {
        let mut v = json!({
            "architectures": ["Glm4vMoeForConditionalGeneration"], "model_type": "glm4v_moe",
            "vision_config": {"depth": 24, "hidden_size": 1536},
            "text_config": {
                "model_type": "glm4v_moe_text", "attention_bias": true,
                "first_k_dense_replace": 1, "head_dim": 128, "hidden_size": 4096,
                "intermediate_size": 10944, "moe_intermediate_size": 1408, "n_group": 1,
                "n_routed_experts": 128, "n_shared_experts": 1, "norm_topk_prob": true,
                "num_attention_heads": 96, "num_experts_per_tok": 8, "num_hidden_layers": 46,
                "num_key_value_heads": 8, "rms_norm_eps": 1e-5,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                    "partial_rotary_factor": 0.5, "mrope_section": [8, 12, 12]},
                "routed_scaling_factor": 1.0, "topk_group": 1, "torch_dtype": "bfloat16",
                "use_qk_norm": true
            }
        });
        let spec =
            |v: &Value| super::super::ModelSpec::from_json(v, Path::new("config.json"), "m".into());
        let s = spec(&v).unwrap();
        assert_eq!(s.architecture.hf_name(), "Glm4MoeForCausalLM");
        assert_eq!((s.head_dim, s.rotated_dims(), s.rope_theta), (128, 64, 1e4));
        assert_eq!(s.qk_norm, super::super::QkNorm::None);
        assert!(s.qkv_bias && !s.o_bias && !s.tie_word_embeddings);
        assert_eq!((s.vocab_size, s.max_position_embeddings), (151424, 65536));
        let m = s.hybrid.unwrap().moe.unwrap();
        assert_eq!(
            (m.num_experts, m.top_k, m.sparse_layers[..2].to_vec()),
            (128, 8, vec![false, true])
        );
        v["text_config"]["vocab_size"] = json!(151552);
        assert_eq!(spec(&v).unwrap().vocab_size, 151552);
    }

    /// Qwen3-VL-MoE as released (tests/fixtures/released_configs): Qwen3-MoE layers whose
    /// router always renormalises, and Qwen3VLMoeTextConfig's defaults where fields are absent.
    #[test]
    fn qwen3_vl_moe_export_runs_as_qwen3_moe() {
        let mut v = super::super::released_config("qwen3-vl-30b-a3b-instruct.json");
        let spec =
            |v: &Value| super::super::ModelSpec::from_json(v, Path::new("config.json"), "m".into());
        let s = spec(&v).unwrap();
        assert_eq!(s.architecture.hf_name(), "Qwen3MoeForCausalLM");
        assert_eq!((s.num_layers, s.head_dim, s.rope_theta), (48, 128, 5e6));
        assert!(!s.tie_word_embeddings);
        let m = s.hybrid.unwrap().moe.unwrap();
        assert_eq!(
            (m.num_experts, m.top_k, m.expert_intermediate),
            (128, 8, 768)
        );
        assert!(m.norm_topk_prob && m.sparse_layers.iter().all(|&s| s));
        let t = v["text_config"].as_object_mut().unwrap();
        t.insert("norm_topk_prob".into(), json!(false));
        t.insert("num_local_experts".into(), t["num_experts"].clone());
        for k in [
            "num_experts",
            "num_experts_per_tok",
            "moe_intermediate_size",
            "rope_theta",
        ] {
            t.remove(k);
        }
        let s = spec(&v).unwrap();
        assert_eq!(s.rope_theta, 5e5, "Qwen3VLMoeTextConfig's default_theta");
        let m = s.hybrid.unwrap().moe.unwrap();
        assert!(
            m.norm_topk_prob,
            "the router renormalises whatever the field says"
        );
        assert_eq!(
            (m.num_experts, m.top_k, m.expert_intermediate),
            (128, 4, 1408)
        );
        v["text_config"]
            .as_object_mut()
            .unwrap()
            .remove("num_local_experts");
        assert_eq!(
            spec(&v).unwrap().hybrid.unwrap().moe.unwrap().num_experts,
            60
        );
    }

    /// Qwen2.5-VL as released (pre-v5): the text fields at the top level, `rope_scaling`
    /// `mrope` (plain RoPE over text positions), the class's defaults; tied where the top level
    /// or a text config says so (its BC rule; Qwen3-VL's top level alone decides).
    #[test]
    fn qwen2_5_vl_flat_config_runs_as_qwen2() {
        let v = json!({
            "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
            "hidden_size": 64, "num_hidden_layers": 4, "tie_word_embeddings": true,
            "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
            "vision_config": {"depth": 2}, "torch_dtype": "bfloat16"
        });
        let t = text_of(&v).unwrap();
        assert_eq!(t["architectures"], json!(["Qwen2ForCausalLM"]));
        assert_eq!(
            (&t["hidden_size"], &t["torch_dtype"]),
            (&json!(64), &json!("bfloat16"))
        );
        assert_eq!(t["rope_scaling"]["rope_type"], "default");
        assert!(t["rope_scaling"].get("type").is_none() && t.get("vision_config").is_none());
        assert_eq!(
            (&t["rope_theta"], &t["rms_norm_eps"]),
            (&json!(1e6), &json!(1e-5))
        );
        assert_eq!(t["tie_word_embeddings"], true);
        let nested = |top: bool, arch: &str| {
            let v = json!({"architectures": [arch], "tie_word_embeddings": top,
                "text_config": {"hidden_size": 64, "tie_word_embeddings": true}});
            text_of(&v).unwrap()["tie_word_embeddings"].clone()
        };
        assert_eq!(nested(false, "Qwen2_5_VLForConditionalGeneration"), true);
        assert_eq!(nested(false, "Qwen2VLForConditionalGeneration"), true);
        assert_eq!(nested(false, "Qwen3VLForConditionalGeneration"), false);
        // Gemma3Config ties by default: an export naming no tie is tied, one naming false not.
        let gemma = |top: Option<bool>| {
            let mut v = json!({"architectures": ["Gemma3ForConditionalGeneration"],
                "text_config": {"hidden_size": 64}});
            if let Some(t) = top {
                v["tie_word_embeddings"] = json!(t);
            }
            text_of(&v).unwrap()["tie_word_embeddings"].clone()
        };
        assert_eq!(
            (gemma(None), gemma(Some(false))),
            (json!(true), json!(false))
        );
    }

    /// LFM2-VL and LFM3-VL tie by default; LFM2-VL's top-level `tie_embedding` wins over
    /// `tie_word_embeddings`; the text config's own tie (LFM2's `tie_embedding` too) is not
    /// read (transformers 5.24, checked on each combination).
    #[test]
    fn lfm_exports_tie_by_their_top_level() {
        let lfm = |arch: &str, top: Value, text_tie: Value| {
            let mut v = json!({"architectures": [arch],
                "text_config": {"model_type": "lfm2", "hidden_size": 64}});
            for (k, x) in top.as_object().unwrap() {
                v[k] = x.clone();
            }
            for (k, x) in text_tie.as_object().unwrap() {
                v["text_config"][k] = x.clone();
            }
            let t = text_of(&v).unwrap();
            assert!(t.get("tie_embedding").is_none());
            t["tie_word_embeddings"].as_bool().unwrap()
        };
        let (l2, l3) = (
            "Lfm2VlForConditionalGeneration",
            "Lfm3VlForConditionalGeneration",
        );
        assert!(lfm(l2, json!({}), json!({"tie_embedding": false})));
        assert!(lfm(l3, json!({}), json!({"tie_word_embeddings": false})));
        assert!(!lfm(l2, json!({"tie_word_embeddings": false}), json!({})));
        assert!(!lfm(l2, json!({"tie_embedding": false}), json!({})));
        let both = json!({"tie_embedding": true, "tie_word_embeddings": false});
        assert!(lfm(l2, both.clone(), json!({})));
        // Not LFM3-VL's field.
        assert!(!lfm(l3, both, json!({})));
    }

    /// Mistral-Small-3.1 as released: its `mistral` text config as `MistralForCausalLM`, the
    /// release's dtype, untied (the release names no tie and carries its own head).
    #[test]
    fn mistral3_export_runs_its_mistral_text_config() {
        let v = super::super::released_config("mistral-small-3.1-24b-instruct-2503.json");
        let t = text_of(&v).unwrap();
        assert_eq!(t["architectures"], json!(["MistralForCausalLM"]));
        assert_eq!(
            (&t["torch_dtype"], &t["tie_word_embeddings"]),
            (&json!("bfloat16"), &json!(false))
        );
        let s = super::super::ModelSpec::from_json(&v, Path::new("c.json"), "m".into()).unwrap();
        assert_eq!(
            (s.head_dim, s.rope_theta, s.sliding_window),
            (128, 1e9, None)
        );
        assert_eq!(
            (s.rms_norm_eps, s.vocab_size, s.num_layers),
            (1e-5, 131_072, 40)
        );
    }

    #[test]
    fn other_multimodal_and_quantized_checkpoints_are_refused() {
        for arch in [
            "LlavaForConditionalGeneration",
            "Gemma3nForConditionalGeneration",
        ] {
            let v = json!({"architectures": [arch], "text_config": {}, "vision_config": {}});
            let e = text_of(&v).unwrap_err().to_string();
            assert!(e.contains(arch) && e.contains("multimodal"), "{e}");
        }
        // NVIDIA's FP8 releases (ModelOpt's per-tensor scales) are not the block format.
        let v = json!({"architectures": ["NemotronHForCausalLM"],
            "quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8"}});
        let e = text_of(&v).unwrap_err().to_string();
        assert!(e.contains("quantized") && e.contains("modelopt"), "{e}");
        let fp8 = json!({"quant_method": "fp8", "weight_block_size": [128, 128]});
        let v = json!({"architectures": ["Qwen3ForCausalLM"], "quantization_config": fp8});
        assert!(text_of(&v).is_ok());
        // A multimodal export's quantization_config describes its language model too.
        let v = json!({"architectures": ["Qwen3_5ForConditionalGeneration"],
            "text_config": {}, "quantization_config": fp8});
        assert_eq!(text_of(&v).unwrap()["quantization_config"], fp8);
        let v = json!({"architectures": ["LlamaForCausalLM"], "quantization_config": null});
        assert!(text_of(&v).is_ok());
    }
}
