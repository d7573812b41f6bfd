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
    let s = super::super::ModelSpec::from_json(&v, Path::new("config.json"), "m".into()).unwrap();
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

/// InternVL, LLaVA-OneVision, Aya Vision and Command A Vision take their text class from
/// `text_config.model_type` (the config class's default where absent); an unknown one is
/// refused by name. Ties as transformers 5.24 ties them (checked on every combination): by
/// the top level (tied by default) for InternVL / Aya Vision / Command A Vision, by the top
/// level or the text config for LLaVA-OneVision (untied by default).
#[test]
fn exports_by_text_model_type_and_their_ties() {
    let export = |arch: &str, kind: Option<&str>, top: Option<bool>, text_tie: Option<bool>| {
        let mut v = json!({"architectures": [arch], "text_config": {"hidden_size": 64}});
        if let Some(k) = kind {
            v["text_config"]["model_type"] = json!(k);
        }
        if let Some(t) = top {
            v["tie_word_embeddings"] = json!(t);
        }
        if let Some(t) = text_tie {
            v["text_config"]["tie_word_embeddings"] = json!(t);
        }
        text_of(&v).map(|t| {
            let class = t["architectures"][0].as_str().unwrap().to_string();
            (class, t["tie_word_embeddings"].as_bool().unwrap())
        })
    };
    let class = |arch, kind| export(arch, kind, None, None).unwrap().0;
    let internvl = "InternVLForConditionalGeneration";
    assert_eq!(class(internvl, None), "Qwen2ForCausalLM");
    assert_eq!(class(internvl, Some("qwen3_moe")), "Qwen3MoeForCausalLM");
    assert_eq!(class(internvl, Some("gpt_oss")), "GptOssForCausalLM");
    let aya = "AyaVisionForConditionalGeneration";
    assert_eq!(class(aya, None), "Cohere2ForCausalLM");
    assert_eq!(class(aya, Some("cohere")), "CohereForCausalLM");
    let command_a = "Cohere2VisionForConditionalGeneration";
    assert_eq!(class(command_a, Some("cohere2")), "Cohere2ForCausalLM");
    let refused = export(internvl, Some("phi3"), None, None)
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("phi3") && refused.contains("qwen3_moe"),
        "{refused}"
    );
    let llava = "LlavaOnevisionForConditionalGeneration";
    assert_eq!(class(llava, None), "Qwen2ForCausalLM");
    let tied = |arch, top, text| export(arch, None, top, text).unwrap().1;
    for arch in [internvl, aya, command_a] {
        assert!(tied(arch, None, Some(false)));
        assert!(!tied(arch, Some(false), Some(true)));
    }
    assert!(!tied(llava, None, None));
    assert!(tied(llava, None, Some(true)) && tied(llava, Some(true), Some(false)));
    assert!(!tied(llava, Some(false), Some(false)));
}

/// Shaped as GLM-4.1V-9B's config: GLM-4's layers with heads of hidden / heads (whatever
/// `head_dim` says), RoPE over `partial_rotary_factor` of each head (1 where none is named:
/// `Glm4vTextConfig`'s), q / k / v always biased.
#[test]
fn glm4v_export_runs_as_glm4() {
    let mut v = json!({
        "architectures": ["Glm4vForConditionalGeneration"], "model_type": "glm4v",
        "vision_config": {"depth": 24},
        "text_config": {
            "model_type": "glm4v_text", "hidden_size": 4096, "intermediate_size": 13696,
            "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 2,
            "head_dim": 96, "attention_bias": false, "vocab_size": 151552,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5, "mrope_section": [8, 12, 12]}
        }
    });
    let spec =
        |v: &Value| super::super::ModelSpec::from_json(v, Path::new("config.json"), "m".into());
    let s = spec(&v).unwrap();
    assert_eq!(s.architecture.hf_name(), "Glm4ForCausalLM");
    assert_eq!((s.head_dim, s.rotated_dims()), (128, 64));
    assert!(s.qkv_bias && !s.o_bias && s.interleaved_rope);
    assert_eq!((s.rms_norm_eps, s.max_position_embeddings), (1e-5, 32768));
    v["text_config"]["rope_parameters"]
        .as_object_mut()
        .unwrap()
        .remove("partial_rotary_factor");
    assert_eq!(spec(&v).unwrap().rotated_dims(), 128);
}
