//! Block-quantized FP8 checkpoints beyond the matrix's numerics (tests/models/matrix.rs,
//! `qwen3_moe_fp8` against transformers): experts stored fused in FP8 give the per-expert
//! checkpoint's bits, and FP8 files hsx cannot read are refused by name.

use crate::common;

use std::path::Path;

use common::backends::{MakeDir, cpu_backend, cpu_load_err, cpu_options, run_split, same_bits};
use common::{Reference, Tensors, fixture_variant};
use hsx::models::{CpuBackend, ModelSpec};
use safetensors::Dtype;

const FIXTURE: &str = "qwen3_moe_fp8";
/// qwen3_moe_fp8's experts per MoE layer; layer 1 is dense.
const EXPERTS: usize = 8;
const MOE_LAYERS: [usize; 3] = [0, 2, 3];

/// The fixture copied to `dst` with `edit` applied to config.json and `rewrite` to its tensors.
fn variant(dst: &Path, edit: impl Fn(&mut serde_json::Value), rewrite: impl Fn(&mut Tensors)) {
    fixture_variant(FIXTURE, dst, edit, rewrite);
}

/// Each MoE layer's per-expert FP8 matrices and scales replaced by `experts.gate_up_proj`
/// `[E, 2I, H]` / `experts.down_proj` `[E, H, I]` and their `_scale_inv` grids stacked the same
/// way (gate's row blocks, then up's).
fn fuse_experts(t: &mut Tensors) {
    let groups = [
        ("gate_up_proj", &["gate_proj", "up_proj"][..]),
        ("down_proj", &["down_proj"][..]),
    ];
    for l in MOE_LAYERS {
        let p = format!("model.layers.{l}.mlp.experts");
        for (fused, parts) in groups {
            for (suffix, fused_suffix) in [("weight", ""), ("weight_scale_inv", "_scale_inv")] {
                let (mut dtype, mut rows, mut cols, mut bytes) = (Dtype::F32, 0, 0, Vec::new());
                for e in 0..EXPERTS {
                    rows = 0;
                    for part in parts {
                        let (d, shape, b) = t.remove(&format!("{p}.{e}.{part}.{suffix}")).unwrap();
                        (dtype, cols, rows) = (d, shape[1], rows + shape[0]);
                        bytes.extend(b);
                    }
                }
                let shape = vec![EXPERTS, rows, cols];
                t.insert(format!("{p}.{fused}{fused_suffix}"), (dtype, shape, bytes));
            }
        }
    }
}

fn run(be: &mut CpuBackend, ids: &[u32]) -> Vec<f32> {
    run_split(be, &[ids.to_vec()], 4096).remove(0).0
}

#[test]
fn fused_fp8_experts_give_the_per_expert_bits() {
    let tmp = tempfile::tempdir().unwrap();
    variant(tmp.path(), |_| {}, fuse_experts);
    let spec = ModelSpec::from_dir(tmp.path()).unwrap();
    let layers = vec![0, 1, 3, 4];
    let mut fused =
        CpuBackend::load(tmp.path(), spec, cpu_options(layers.clone(), 1024, 1)).unwrap();
    let mut orig = cpu_backend(FIXTURE, cpu_options(layers, 1024, 1));
    let ids = Reference::load(FIXTURE).input_ids(2);
    let (got, want) = (run(&mut fused, &ids), run(&mut orig, &ids));
    assert!(!want.is_empty() && same_bits(&got, &want));
}

/// FP8 weights the config does not announce, blocks that do not fit the stored scales, and
/// per-tensor scales (AutoFP8's layout) are refused, naming the tensor or field.
#[test]
fn unreadable_fp8_is_refused_by_name() {
    let q = "model.layers.0.self_attn.q_proj.weight";
    let cases: Vec<(&str, MakeDir)> = vec![
        (
            "F8_E4M3 (the config names no fp8 quantization_config)",
            Box::new(|d| {
                variant(
                    d,
                    |c| drop(c.as_object_mut().unwrap().remove("quantization_config")),
                    |_| {},
                )
            }),
        ),
        (
            "_scale_inv",
            Box::new(|d| {
                variant(
                    d,
                    |c| c["quantization_config"]["weight_block_size"] = serde_json::json!([32, 32]),
                    |_| {},
                )
            }),
        ),
        (
            "AutoFP8",
            Box::new(move |d| {
                variant(
                    d,
                    |_| {},
                    |t| {
                        let s = t.remove(&format!("{q}_scale_inv")).unwrap();
                        t.insert(format!("{q}_scale"), s);
                    },
                )
            }),
        ),
    ];
    for (want, make) in cases {
        let tmp = tempfile::tempdir().unwrap();
        make(tmp.path());
        let e = cpu_load_err(tmp.path());
        assert!(e.contains(want), "`{e}` should name `{want}`");
    }
}
