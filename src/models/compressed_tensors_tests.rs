use half::bf16;
use serde_json::json;

use super::*;
use crate::models::fp8_weights::Fp8Blocks;

fn layout(q: serde_json::Value) -> Result<Option<Compressed>, String> {
    compressed(&q, |f, m| ModelError::InvalidOptions(format!("{f}: {m}")))
        .map_err(|e| e.to_string())
}

/// Kimi-K2-Thinking's `quantization_config` as released.
fn kimi() -> serde_json::Value {
    json!({
        "config_groups": {"group_0": {
            "input_activations": null, "output_activations": null, "targets": ["Linear"],
            "weights": {"actorder": null, "block_structure": null, "dynamic": false,
                        "group_size": 32, "num_bits": 4, "observer": "minmax",
                        "observer_kwargs": {}, "strategy": "group", "symmetric": true,
                        "type": "int"}}},
        "format": "pack-quantized",
        "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*"],
        "kv_cache_scheme": null, "quant_method": "compressed-tensors",
        "quantization_status": "compressed"
    })
}

#[test]
fn kimi_layout_is_int4_in_groups_of_32() {
    let want = PackedInt {
        bits: 4,
        group: Some(32),
    };
    assert_eq!(layout(kimi()), Ok(Some(Compressed::Int(want))));
    assert_eq!((want.words(7168), want.scales(7168)), (896, 224));
    assert_eq!(layout(json!({"quant_method": "fp8"})), Ok(None));
}

#[test]
fn what_load_time_dequantizing_cannot_reproduce_is_refused() {
    let w = |k: &str, v: serde_json::Value| {
        let mut q = kimi();
        q["config_groups"]["group_0"]["weights"][k] = v;
        q
    };
    let mut act = kimi();
    act["config_groups"]["group_0"]["input_activations"] = json!({"num_bits": 8, "type": "int"});
    let mut fmt = kimi();
    fmt["format"] = json!("float-quantized");
    let mut other = kimi();
    other["format"] = json!("nvfp4-pack-quantized");
    for (q, says) in [
        (w("symmetric", json!(false)), "asymmetric"),
        (w("num_bits", json!(2)), "num_bits"),
        (w("type", json!("float")), "type"),
        (w("actorder", json!("group")), "activation order"),
        (w("strategy", json!("tensor")), "strategy"),
        (act, "input_activations"),
        (other, "nvfp4-pack-quantized"),
        (fmt, "weights.type"),
    ] {
        let e = layout(q).unwrap_err();
        assert!(e.contains(says), "{e}");
    }
}

/// Value i of a row sits at bits 4i of its little-endian words, stored + 8; each group of
/// input values has its scale; the product is rounded once to the dtype.
#[test]
fn dequantizes_codes_times_their_group_scale() {
    let p = PackedInt {
        bits: 4,
        group: Some(8),
    };
    let (rows, cols) = (2, 12);
    let codes: Vec<Vec<i32>> = (0..rows)
        .map(|r| {
            (0..cols)
                .map(|c| ((r * 5 + c * 3) % 16) as i32 - 8)
                .collect()
        })
        .collect();
    let scales = [0.5f32, 3.0, 1.0 / 3.0, -2.0];
    let mut words = Vec::new();
    for row in &codes {
        let mut nibbles: Vec<u8> = row.iter().map(|&c| (c + 8) as u8).collect();
        nibbles.resize(16, 0);
        words.extend(nibbles.chunks(2).map(|n| n[0] | n[1] << 4));
    }
    let m = dequantize("w", &words, &scales, (rows, cols), p, WeightDtype::Bf16).unwrap();
    let got: Vec<f32> = (m.data.chunks(2))
        .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect();
    for r in 0..rows {
        for c in 0..cols {
            let want = bf16::from_f32(codes[r][c] as f32 * scales[r * 2 + c / 8]).to_f32();
            assert_eq!(got[r * cols + c], want, "row {r} col {c}");
        }
    }
    let wrong = dequantize("w", &words[1..], &scales, (rows, cols), p, WeightDtype::F32);
    assert!(wrong.is_err());
    let nan = [f32::NAN, 1.0, 1.0, 1.0];
    assert!(dequantize("w", &words, &nan, (rows, cols), p, WeightDtype::F32).is_err());
}

/// An llm-compressor `-FP8-dynamic` release's `quantization_config` (Llama-3.3-70B-Instruct-FP8-
/// dynamic's): float8 weights with one scale per output row, activations quantized dynamically
/// per token at run time (not by hsx, nor by transformers' decompressed run).
fn fp8_dynamic() -> serde_json::Value {
    json!({
        "config_groups": {"group_0": {
            "input_activations": {"actorder": null, "block_structure": null, "dynamic": true,
                                  "group_size": null, "num_bits": 8, "observer": null,
                                  "observer_kwargs": {}, "strategy": "token", "symmetric": true,
                                  "type": "float"},
            "output_activations": null, "targets": ["Linear"],
            "weights": {"actorder": null, "block_structure": null, "dynamic": false,
                        "group_size": null, "num_bits": 8, "observer": "minmax",
                        "observer_kwargs": {}, "strategy": "channel", "symmetric": true,
                        "type": "float"}}},
        "format": "float-quantized", "ignore": ["lm_head"], "kv_cache_scheme": null,
        "quant_method": "compressed-tensors", "quantization_status": "compressed"
    })
}

#[test]
fn fp8_layouts_are_blocks_of_the_matrix() {
    let blocks = |rows, cols| Ok(Some(Compressed::Float(Fp8Blocks { rows, cols })));
    let whole = usize::MAX;
    assert_eq!(layout(fp8_dynamic()), blocks(1, whole));
    let w = |k: &str, v: serde_json::Value| {
        let mut q = fp8_dynamic();
        q["config_groups"]["group_0"]["weights"][k] = v;
        q
    };
    assert_eq!(layout(w("strategy", json!("tensor"))), blocks(whole, whole));
    let mut block = w("strategy", json!("block"));
    block["config_groups"]["group_0"]["weights"]["block_structure"] = json!([128, 64]);
    assert_eq!(layout(block), blocks(128, 64));
    let mut group = w("strategy", json!("group"));
    group["config_groups"]["group_0"]["weights"]["group_size"] = json!(32);
    assert_eq!(layout(group), blocks(1, 32));
    let mut fixed = fp8_dynamic();
    fixed["config_groups"]["group_0"]["input_activations"]["dynamic"] = json!(false);
    assert!(layout(fixed).unwrap_err().contains("input_activations"));
    assert!(
        layout(w("num_bits", json!(4)))
            .unwrap_err()
            .contains("num_bits")
    );
    let bad_block = w("strategy", json!("block"));
    assert!(layout(bad_block).unwrap_err().contains("block_structure"));
}
