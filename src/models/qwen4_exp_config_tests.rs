use std::path::Path;

use serde_json::{Value, json};

use super::super::{Architecture, ModelSpec};
use super::*;

fn parse(v: &Value) -> Result<ModelSpec, String> {
    ModelSpec::from_json(v, Path::new("config.json"), "m".into()).map_err(|e| e.to_string())
}

/// Shaped as the release's text config (`Qwen4ExpForConditionalGeneration`'s `text_config`,
/// four of its layers): sigmoid output gate, n-gram embeddings on layer 2, QSA budget 2048 in
/// blocks of 4.
fn release() -> Value {
    serde_json::from_str(
        r#"{
        "architectures": ["Qwen4ExpForConditionalGeneration"], "model_type": "qwen4_exp",
        "text_config": {
            "model_type": "qwen4_exp_text", "hidden_size": 2560, "num_hidden_layers": 4,
            "num_attention_heads": 24, "num_key_value_heads": 2, "head_dim": 256,
            "rms_norm_eps": 1e-6, "vocab_size": 248320, "eos_token_id": 248044,
            "max_position_embeddings": 262144, "output_gate_type": "sigmoid",
            "layer_types": ["linear_attention", "linear_attention", "linear_attention",
                            "full_attention"],
            "hidden_act": "silu", "tie_word_embeddings": false, "linear_num_value_heads": 48,
            "linear_num_key_heads": 16, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "num_experts": 512,
            "num_experts_per_tok": 10, "moe_intermediate_size": 640,
            "shared_expert_intermediate_size": 640, "hc_count": 4, "hc_lowrank": 320,
            "indexer_budget": 2048, "indexer_compress_ratio": 4, "indexer_head_dim": 128,
            "indexer_kv_heads": 1, "indexer_n_heads": 4, "ple_conv_kernel_size": 4,
            "ple_embed_dim": 2560, "ple_layer_ids": [2], "heads_per_ngram": 8,
            "make_ngram_vocab_size_divisible_by": 128, "ngram_size": 3,
            "ngram_vocab_size_base": 20000000, "split_ngram_parts": 128,
            "rope_parameters": {"mrope_interleaved": true, "mrope_section": [11, 11, 10],
                                "partial_rotary_factor": 0.25, "rope_theta": 10000000,
                                "rope_type": "default"}
        }
    }"#,
    )
    .unwrap()
}

fn with(mut v: Value, field: &str, value: Value) -> Value {
    v["text_config"][field] = value;
    v
}

#[test]
fn the_release_parses_with_its_streams_cap_and_ngrams() {
    let s = parse(&release()).unwrap();
    assert_eq!(s.architecture, Architecture::Qwen4Exp);
    assert_eq!((s.hidden_size, s.stream_width()), (2560, 10240));
    assert_eq!(
        s.hyper,
        Some(HyperSpec {
            streams: 4,
            rank: 320
        })
    );
    // The indexer runs past budget + ratio - 1 keys: the model's own limit stays.
    assert_eq!(s.max_position_embeddings, 262144);
    let qsa = QsaSpec {
        heads: 4,
        head_dim: 128,
        budget: 2048,
        ratio: 4,
    };
    assert_eq!(s.qsa, Some(qsa));
    let h = s.hybrid.as_ref().unwrap();
    assert_eq!(h.gdn.as_ref().unwrap().out_gate, NormGate::Sigmoid);
    assert_eq!(h.rotary_dim, 64);
    let m = h.moe.as_ref().unwrap();
    assert_eq!(
        (m.num_experts, m.top_k, m.expert_intermediate),
        (512, 10, 640)
    );
    assert!(m.sparse_layers.iter().all(|&s| s));
    let n = s.ngram.as_ref().unwrap();
    assert_eq!(
        (n.layers.clone(), n.embed_dim, n.heads(), n.parts),
        (vec![1], 2560, 16, 128)
    );
    assert_eq!((n.hash.eos, n.hash.vocab_base), (248044, 20_000_000));
    let hash = crate::models::ngram_hash::NgramHash::new(&n.hash, 0).unwrap();
    // 16 heads of primes just above 20M, padded to 128 rows: ~320M rows of 160 values.
    assert_eq!(hash.heads(), 16);
    assert!(
        hash.rows.is_multiple_of(128) && hash.rows > 16 * 20_000_000,
        "{}",
        hash.rows
    );
    let silu = with(release(), "output_gate_type", json!("silu"));
    let g = parse(&silu).unwrap().hybrid.unwrap().gdn.unwrap().out_gate;
    assert_eq!(g, NormGate::Silu);
    let none = with(release(), "ple_layer_ids", json!([]));
    assert!(parse(&none).unwrap().ngram.is_none());
}

#[test]
fn what_the_release_would_not_run_as_trained_is_refused() {
    let cases = [
        ("hc_count", json!(1), "hc_count"),
        ("hc_lowrank", json!(0), "hc_lowrank"),
        ("indexer_budget", Value::Null, "indexer_budget"),
        ("indexer_kv_heads", json!(2), "indexer_kv_heads"),
        ("indexer_budget", json!(2050), "indexer_budget"),
        ("indexer_head_dim", json!(32), "indexer_head_dim"),
        ("output_gate_type", json!("gelu"), "output_gate_type"),
        ("ple_layer_ids", json!([0]), "ple_layer_ids"),
        ("ple_layer_ids", json!([5]), "ple_layer_ids"),
        ("ple_layer_ids", json!([4]), "ple_layer_ids"),
        ("ple_embed_dim", json!(2561), "ple_embed_dim"),
        ("eos_token_id", Value::Null, "eos_token_id"),
        ("ngram_size", json!(1), "ngram_size"),
        ("ngram_size", json!(20), "ngram_size"),
    ];
    for (field, value, named) in cases {
        let err = parse(&with(release(), field, value.clone())).unwrap_err();
        assert!(err.contains(named), "{field} = {value}: {err}");
    }
}
