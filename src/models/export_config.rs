//! Configs of checkpoints as they are released, before the per-family parsing:
//! - multimodal exports whose language model hsx runs text-only: `Qwen3_5ForConditionalGeneration`
//!   and `Qwen3_5MoeForConditionalGeneration` (the text fields under `text_config`, the weights
//!   under `model.language_model.*`, the vision tower `model.visual.*` left unread); other
//!   multimodal exports are refused;
//! - quantized checkpoints (`quantization_config`) are refused but for block-quantized FP8
//!   (dequantized at load, [`super::fp8_weights`]) and gpt-oss's MXFP4 experts: hsx loads
//!   bf16 / f16 / f32.

use std::borrow::Cow;
use std::path::Path;

use serde_json::Value;

use super::ModelError;

/// Multimodal exports run text-only: (export class, the text model's class).
pub(super) const TEXT_OF_MULTIMODAL: &[(&str, &str)] = &[
    ("Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM"),
    (
        "Qwen3_5MoeForConditionalGeneration",
        "Qwen3_5MoeForCausalLM",
    ),
];

/// Top-level fields of a multimodal config that describe its language model too (taken when
/// `text_config` does not set them).
const SHARED_FIELDS: &[&str] = &[
    "tie_word_embeddings",
    "dtype",
    "torch_dtype",
    "quantization_config",
];

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
    text.insert("architectures".into(), Value::from(vec![text_arch]));
    reject_quantized(&Value::Object(text.clone()), path)?;
    tracing::info!(
        "{arch}: running its language model only ({text_arch} from text_config, weights \
         model.language_model.* and lm_head); the vision tower (model.visual.*) is not read"
    );
    Ok(Cow::Owned(Value::Object(text)))
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
    if method == Some("none")
        || (method == Some("fp8") && !gpt_oss)
        || (method == Some("mxfp4") && gpt_oss)
    {
        return Ok(());
    }
    Err(ModelError::Unsupported {
        path: path.to_path_buf(),
        what: format!(
            "quantized checkpoint (quantization_config, quant_method `{}`): hsx loads bf16, f16 \
             and f32 weights, block-quantized FP8 (`fp8`) and gpt-oss's MXFP4 experts; use the \
             unquantized release of the model",
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
        // text_config's own value wins over the top level's.
        assert_eq!(t["tie_word_embeddings"], false);
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

    #[test]
    fn other_multimodal_and_quantized_checkpoints_are_refused() {
        for arch in [
            "Llama4ForConditionalGeneration",
            "Qwen3VLMoeForConditionalGeneration",
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
