//! compressed-tensors checkpoints beyond the matrix's numerics (tests/models/matrix.rs,
//! `kimi_k2_int4` and `qwen3_fp8_dynamic` against transformers): Kimi-K2.5's multimodal export
//! of the same INT4 language model gives the text checkpoint's bits, and packed or FP8 weights
//! hsx cannot read are refused by name.

use crate::common;

use std::path::Path;

use common::backends::{MakeDir, cpu_backend, cpu_load_err, cpu_options, run_split, same_bits};
use common::{Reference, Tensors, fixture_variant, model_dir};
use hsx::models::{CpuBackend, ModelSpec};
use safetensors::Dtype;

const FIXTURE: &str = "kimi_k2_int4";
/// A routed expert's projection, stored packed: its words, shape and scales.
const PACKED: &str = "model.layers.1.mlp.experts.3.down_proj.weight_packed";
const SHAPE: &str = "model.layers.1.mlp.experts.3.down_proj.weight_shape";
const SCALE: &str = "model.layers.1.mlp.experts.3.down_proj.weight_scale";

fn variant(dst: &Path, edit: impl Fn(&mut serde_json::Value), rewrite: impl Fn(&mut Tensors)) {
    fixture_variant(FIXTURE, dst, edit, rewrite);
}

fn run(be: &mut CpuBackend, ids: &[u32]) -> Vec<f32> {
    run_split(be, &[ids.to_vec()], 4096).remove(0).0
}

/// The config as Kimi-K2.5 releases it: the language model's config under `text_config`
/// (`model_type` `kimi_k2`), the vision tower's beside it (kimi_k25_vl's), the
/// quantization_config at the top level.
fn as_k25_export(c: &mut serde_json::Value) {
    let mut text = c.take();
    let q = text.as_object_mut().unwrap().remove("quantization_config");
    text["model_type"] = "kimi_k2".into();
    text.as_object_mut().unwrap().remove("architectures");
    let vl = std::fs::read(model_dir("kimi_k25_vl").join("config.json")).unwrap();
    *c = serde_json::from_slice(&vl).unwrap();
    c["text_config"] = text;
    c["quantization_config"] = q.unwrap();
}

/// The weights under the release's names: `language_model.model.*`, `language_model.lm_head`.
fn under_language_model(t: &mut Tensors) {
    *t = std::mem::take(t)
        .into_iter()
        .map(|(n, v)| (format!("language_model.{n}"), v))
        .collect();
}

#[test]
fn kimi_k25_export_of_int4_experts_gives_the_text_checkpoints_bits() {
    let tmp = tempfile::tempdir().unwrap();
    variant(tmp.path(), as_k25_export, under_language_model);
    let spec = ModelSpec::from_dir(tmp.path()).unwrap();
    assert!(spec.compressed.is_some());
    let layers = vec![0, 1, 2, 4];
    let mut export =
        CpuBackend::load(tmp.path(), spec, cpu_options(layers.clone(), 1024, 1)).unwrap();
    let mut text = cpu_backend(FIXTURE, cpu_options(layers, 1024, 1));
    let ids = Reference::load(FIXTURE).input_ids(2);
    let (got, want) = (run(&mut export, &ids), run(&mut text, &ids));
    assert!(!want.is_empty() && same_bits(&got, &want));
}

/// One stored tensor: dtype, shape, bytes.
type Stored = (Dtype, Vec<usize>, Vec<u8>);

/// Tensor `name` changed by `f` (the fixture must have it).
fn edit_tensor(name: &'static str, f: fn(&mut Stored)) -> impl Fn(&mut Tensors) {
    move |t| f(t.get_mut(name).unwrap())
}

/// Packed weights the config does not announce, a `weight_shape` other than the layer's, words
/// of another dtype or count, and a NaN scale are refused, naming the tensor or field.
#[test]
fn unreadable_packed_weights_are_refused_by_name() {
    let no_config = |c: &mut serde_json::Value| {
        c.as_object_mut().unwrap().remove("quantization_config");
    };
    let rows_7: fn(&mut Stored) = |t| t.2[..8].copy_from_slice(&7i64.to_le_bytes());
    let as_f32: fn(&mut Stored) = |t| t.0 = Dtype::F32;
    let one_word_short: fn(&mut Stored) = |t| {
        t.1[1] -= 1;
        t.2.truncate(t.1.iter().product::<usize>() * 4);
    };
    // bf16 NaN, little-endian.
    let nan: fn(&mut Stored) = |t| t.2[..2].copy_from_slice(&[0xc0, 0x7f]);
    let cases: Vec<(&str, MakeDir)> = vec![
        (
            "the config names no compressed-tensors",
            Box::new(move |d| variant(d, no_config, |_| {})),
        ),
        (
            "is [7, 32]",
            Box::new(move |d| variant(d, |_| {}, edit_tensor(SHAPE, rows_7))),
        ),
        (
            "expected I32",
            Box::new(move |d| variant(d, |_| {}, edit_tensor(PACKED, as_f32))),
        ),
        (
            PACKED,
            Box::new(move |d| variant(d, |_| {}, edit_tensor(PACKED, one_word_short))),
        ),
        (
            "scale 0 is NaN",
            Box::new(move |d| variant(d, |_| {}, edit_tensor(SCALE, nan))),
        ),
    ];
    for (want, make) in cases {
        let tmp = tempfile::tempdir().unwrap();
        make(tmp.path());
        let e = cpu_load_err(tmp.path());
        assert!(e.contains(want), "`{e}` should name `{want}`");
    }
}

/// An FP8-dynamic checkpoint whose projection lost its `weight_scale`, or whose scales are
/// per block where the config says per row, is refused naming the scale.
#[test]
fn unreadable_fp8_dynamic_weights_are_refused_by_name() {
    const Q: &str = "model.layers.0.self_attn.q_proj.weight_scale";
    let fp8_err = |edit: &dyn Fn(&mut serde_json::Value), rewrite: &dyn Fn(&mut Tensors)| {
        let tmp = tempfile::tempdir().unwrap();
        fixture_variant("qwen3_fp8_dynamic", tmp.path(), edit, rewrite);
        cpu_load_err(tmp.path())
    };
    let per_block = |c: &mut serde_json::Value| {
        let w = &mut c["quantization_config"]["config_groups"]["group_0"]["weights"];
        w["strategy"] = "block".into();
        w["block_structure"] = serde_json::json!([16, 16]);
    };
    for e in [
        fp8_err(&|_| {}, &|t| drop(t.remove(Q))),
        fp8_err(&per_block, &|_| {}),
    ] {
        assert!(e.contains("weight_scale"), "`{e}` should name the scale");
    }
}
