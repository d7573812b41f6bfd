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
    // ([`TEXT_BY_MODEL_TYPE`]).
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
    // GLM-4.1V / GLM-4.6V-Flash: GLM-4-0414's layers (`glm4v_text`); MRoPE over text-only
    // positions is GLM-4's interleaved partial RoPE.
    ("Glm4vForConditionalGeneration", "Glm4ForCausalLM"),
    // Their text classes by `model_type` ([`TEXT_BY_MODEL_TYPE`]); here the default's.
    ("InternVLForConditionalGeneration", "Qwen2ForCausalLM"),
    ("LlavaOnevisionForConditionalGeneration", "Qwen2ForCausalLM"),
    ("AyaVisionForConditionalGeneration", "Cohere2ForCausalLM"),
    (
        "Cohere2VisionForConditionalGeneration",
        "Cohere2ForCausalLM",
    ),
];

/// Exports whose text class follows `text_config.model_type`: (export, the config class's
/// default model type, (model type, text class) pairs hsx runs).
type ByModelType = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);
const TEXT_BY_MODEL_TYPE: &[ByModelType] = &[
    // Mistral-Small-3.1 / 3.2, Ministral 3, Devstral (Small) 2, Mistral Small 4.
    (
        "Mistral3ForConditionalGeneration",
        "mistral",
        &[
            ("mistral", "MistralForCausalLM"),
            ("ministral3", "Ministral3ForCausalLM"),
            ("mistral4", "Mistral4ForCausalLM"),
        ],
    ),
    // InternVL 3 / 3.5 (their `-hf` exports).
    (
        "InternVLForConditionalGeneration",
        "qwen2",
        &[
            ("qwen2", "Qwen2ForCausalLM"),
            ("qwen3", "Qwen3ForCausalLM"),
            ("qwen3_moe", "Qwen3MoeForCausalLM"),
            ("llama", "LlamaForCausalLM"),
            ("gpt_oss", "GptOssForCausalLM"),
        ],
    ),
    // LLaVA-OneVision.
    (
        "LlavaOnevisionForConditionalGeneration",
        "qwen2",
        &[("qwen2", "Qwen2ForCausalLM")],
    ),
    // Aya Vision 8B (Command R7B's layers) and 32B (Aya Expanse's).
    (
        "AyaVisionForConditionalGeneration",
        "cohere2",
        &[
            ("cohere2", "Cohere2ForCausalLM"),
            ("cohere", "CohereForCausalLM"),
        ],
    ),
    // Command A Vision.
    (
        "Cohere2VisionForConditionalGeneration",
        "cohere2",
        &[("cohere2", "Cohere2ForCausalLM")],
    ),
];

/// The text model's class of a `arch` export whose text config is `text`: the one
/// [`TEXT_OF_MULTIMODAL`] names, or for the exports of [`TEXT_BY_MODEL_TYPE`] the one its
/// `model_type` names.
fn text_class(
    arch: &str,
    fixed: &'static str,
    text: &serde_json::Map<String, Value>,
    path: &Path,
) -> Result<&'static str, ModelError> {
    let Some(&(_, default, classes)) = TEXT_BY_MODEL_TYPE.iter().find(|(a, _, _)| *a == arch)
    else {
        return Ok(fixed);
    };
    let kind = text
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or(default);
    let found = classes.iter().find(|(k, _)| *k == kind);
    found
        .map(|&(_, class)| class)
        .ok_or_else(|| ModelError::Unsupported {
            path: path.to_path_buf(),
            what: format!(
                "`{arch}` with text_config.model_type `{kind}` (hsx runs {})",
                classes
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
const TIED_BY_DEFAULT: [&str; 8] = [
    "Gemma3ForConditionalGeneration",
    "Gemma4ForConditionalGeneration",
    "Gemma4UnifiedForConditionalGeneration",
    "Lfm2VlForConditionalGeneration",
    "Lfm3VlForConditionalGeneration",
    "InternVLForConditionalGeneration",
    "AyaVisionForConditionalGeneration",
    "Cohere2VisionForConditionalGeneration",
];

/// Exports that also tie where their text config says so (checked in transformers 5.24):
/// Qwen2-VL's and Qwen2.5-VL's (their BC rule), LLaVA-OneVision's.
const TIED_BY_TEXT_TOO: [&str; 3] = [
    "Qwen2_5_VLForConditionalGeneration",
    "Qwen2VLForConditionalGeneration",
    "LlavaOnevisionForConditionalGeneration",
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
        // Glm4vTextConfig's defaults; its attention biases q / k / v whatever the config says
        // (`head_dim`: [`glm4v_head_dim`]).
        "Glm4vForConditionalGeneration" => vec![
            (&["rms_norm_eps"][..], json!(1e-5), false),
            (&["max_position_embeddings"], json!(32768), false),
            (&["partial_rotary_factor"], json!(1.0), false),
            (&["attention_bias"], json!(true), true),
        ],
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
    // The export's model ties its LM head by its own config (its class's default where it
    // names none: [`TIED_BY_DEFAULT`]), whatever its text config says (transformers 5.24,
    // checked) — but [`TIED_BY_TEXT_TOO`]'s, which also tie where the text config says so.
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
    let tied = top || (TIED_BY_TEXT_TOO.contains(&arch) && tie(&text));
    text.insert("tie_word_embeddings".into(), Value::from(tied));
    // LFM2's own alias, which its text class would read over the export's decision.
    text.remove("tie_embedding");
    if QWEN2_VL.contains(&arch) {
        plain_mrope(&mut text);
    }
    if arch == "Glm4vForConditionalGeneration" {
        glm4v_head_dim(&mut text);
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

/// GLM-4.1V's text attention takes heads of `hidden_size / num_attention_heads` whatever
/// `head_dim` says (`Glm4vTextConfig`'s 4096 and 32 where absent), and so does its RoPE.
fn glm4v_head_dim(text: &mut serde_json::Map<String, Value>) {
    let of = |k: &str, default: u64| text.get(k).and_then(Value::as_u64).unwrap_or(default);
    let (hidden, heads) = (of("hidden_size", 4096), of("num_attention_heads", 32));
    if let Some(hd) = hidden.checked_div(heads) {
        text.insert("head_dim".into(), Value::from(hd));
    }
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
#[path = "export_config_tests.rs"]
mod tests;
