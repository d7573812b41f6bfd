//! Hybrid models (Qwen3.5 / Qwen3-Next Gated DeltaNet, Nemotron-H Mamba-2) on the CPU backend:
//! every layer against the transformers fixtures, byte-identity across chunk splits and mixed
//! batches, state-slot reuse, and load / batch errors.

use crate::common;

use std::path::Path;

use common::backends::{
    check_bad_state_slots, cpu_backend, cpu_options, layer_of, reused_slot_runs, run_split,
    same_bits, snapshot_restore_runs,
};
use common::{Reference, fixture_variant, max_rel, model_dir, random_prompt};
use hsx::models::{CpuBackend, CpuOptions};
use hsx::models::{ModelError, ModelSpec};

const HIDDEN: usize = 64;
const NUM_BLOCKS: usize = 1024;
const SLOTS: usize = 8;

/// (fixture, L, a recurrent layer id, an attention layer id)
const MODELS: [(&str, usize, usize, usize); 11] = [
    ("qwen3_5", 4, 1, 3),
    ("qwen3_next", 4, 2, 3),
    ("nemotron_h", 6, 1, 3),
    ("nemotron_h_moe", 6, 1, 3),
    ("nemotron_h_latent", 6, 1, 3),
    ("qwen3_5_bf16", 4, 1, 3),
    ("qwen3_5_moe", 4, 1, 3),
    // No attention layer: its id is not read past the first three rows.
    ("mamba2", 4, 1, 2),
    ("mamba", 4, 1, 2),
    ("falcon_mamba", 4, 2, 3),
    ("jamba", 4, 1, 2),
];

fn backend(name: &str, layers: Vec<usize>) -> CpuBackend {
    cpu_backend(name, cpu_options(layers, NUM_BLOCKS, SLOTS))
}

/// Every layer id 0..=L of every reference prompt within 1e-4 max-rel of transformers, the
/// greedy token equal, id L pre-norm (≠ HF's post-norm last entry, = it after the final norm).
/// The prompts run one after another on the same slot 0, so a reused slot is zeroed.
/// A change made to a fixture's config.json.
type ConfigEdit = Box<dyn Fn(&mut serde_json::Value)>;

#[test]
fn every_layer_matches_transformers() {
    for (name, l, _, _) in MODELS {
        let reference = Reference::load(name);
        let mut be = backend(name, (0..=l).collect());
        let mut worst = 0f32;
        for j in 0..reference.num_prompts() {
            let ids = reference.input_ids(j);
            let (rows, tok) = run_split(&mut be, std::slice::from_ref(&ids), 4096).remove(0);
            for i in 0..=l {
                let got = layer_of(&rows, i, l + 1, HIDDEN);
                let err = max_rel(&got, &reference.f32(&format!("p{j}.layer.{i}")));
                worst = worst.max(err);
                assert!(err <= 1e-4, "{name} p{j} layer {i}: max-rel {err:e}");
                assert!(got.iter().all(|v| v.is_finite()), "{name} p{j} layer {i}");
            }
            let last = layer_of(&rows, l, l + 1, HIDDEN);
            let hf_last = reference.f32(&format!("p{j}.hf_last"));
            assert!(
                max_rel(&last, &hf_last) > 1e-2,
                "{name}: id L must be pre-norm"
            );
            let normed = be.final_norm(&last).unwrap();
            let err = max_rel(&normed, &hf_last);
            assert!(
                err <= 1e-4,
                "{name} p{j}: final_norm(id L) vs hf_last {err:e}"
            );
            assert_eq!(
                tok,
                Some(reference.next_token(j)),
                "{name} p{j}: greedy token"
            );
        }
        eprintln!("{name}: worst max-rel over all layers and prompts {worst:e}");
    }
}

/// Pieces of 1, 7, 61 tokens, several requests per step (each on its own slot), give the same
/// bits as each request alone in one chunk.
#[test]
fn splits_and_mixed_batches_are_byte_identical() {
    for (name, l, rec, attn) in MODELS.into_iter().take(3) {
        let layers = vec![0, rec, attn, l];
        let prompts: Vec<Vec<u32>> = [150usize, 1, 64, 9, 77, 130]
            .iter()
            .enumerate()
            .map(|(i, &n)| random_prompt(100 + i as u64, n, 512))
            .collect();
        let mut be = backend(name, layers.clone());
        let solo: Vec<_> = prompts
            .iter()
            .map(|p| run_split(&mut be, std::slice::from_ref(p), 4096).remove(0))
            .collect();
        for piece in [1usize, 7, 61] {
            let got = run_split(&mut be, &prompts, piece);
            for (r, ((a, ta), (b, tb))) in got.iter().zip(&solo).enumerate() {
                assert!(
                    same_bits(a, b),
                    "{name}: piece {piece}, request {r} differs"
                );
                assert_eq!(ta, tb, "{name}: piece {piece}, request {r} token");
            }
        }
    }
}

/// A request abandoned mid-prefill leaves state in its slot; the next request given that slot
/// starts from zero.
#[test]
fn reused_slot_starts_from_zero() {
    for (name, l, rec, attn) in MODELS.into_iter().take(3) {
        let mut be = backend(name, vec![0, rec, attn, l]);
        let (solo, again) = reused_slot_runs(&mut be, 4096);
        assert!(same_bits(&again.0, &solo.0), "{name}: stale state leaked");
    }
}

/// A state snapshotted at a block boundary and restored into another slot continues exactly
/// as the cold run (prefix reuse of hybrid models), for Gated DeltaNet and Mamba-2.
#[test]
fn restored_state_snapshot_continues_bit_for_bit() {
    for (name, l, rec, attn) in MODELS.into_iter().take(3) {
        let mut be = backend(name, vec![0, rec, attn, l]);
        let (cold, restored) = snapshot_restore_runs(&mut be, 50);
        assert!(
            same_bits(&restored.0, &cold.0),
            "{name}: restored run differs"
        );
        assert_eq!(restored.1, cold.1, "{name}");
    }
}

#[test]
fn bad_state_slots_are_rejected() {
    check_bad_state_slots(&mut backend("qwen3_5", vec![0, 4]), SLOTS);
}

/// Copies a fixture model to `dst`, editing its config and optionally renaming its tensors
/// and adding small `extra` ones.
fn variant(
    name: &str,
    dst: &Path,
    edit: impl Fn(&mut serde_json::Value),
    rename: Option<&dyn Fn(&str) -> String>,
    extra: &[&str],
) {
    fixture_variant(name, dst, edit, |t| {
        if let Some(f) = rename {
            *t = t.drain().map(|(n, v)| (f(&n), v)).collect();
        }
        for e in extra {
            t.insert(
                e.to_string(),
                (safetensors::Dtype::F32, vec![4], vec![0; 16]),
            );
        }
    });
}

/// Multimodal exports' `model.language_model.*` names (with `model.visual.*` and `mtp.*`
/// tensors present and ignored) load and give the same bits.
#[test]
fn language_model_prefix_is_accepted() {
    let tmp = tempfile::tempdir().unwrap();
    let rename = |n: &str| match n.strip_prefix("model.") {
        Some(rest) => format!("model.language_model.{rest}"),
        None => n.to_string(),
    };
    variant(
        "qwen3_5",
        tmp.path(),
        |_| {},
        Some(&rename),
        &["model.visual.blocks.0.attn.qkv.weight", "mtp.fc.weight"],
    );
    let reference = Reference::load("qwen3_5");
    let ids = reference.input_ids(2);
    let spec = ModelSpec::from_dir(tmp.path()).unwrap();
    let opts = cpu_options(vec![0, 4], NUM_BLOCKS, 1);
    let mut be = CpuBackend::load(tmp.path(), spec, opts).unwrap();
    let got = run_split(&mut be, std::slice::from_ref(&ids), 4096).remove(0);
    let mut orig = backend("qwen3_5", vec![0, 4]);
    let want = run_split(&mut orig, std::slice::from_ref(&ids), 4096).remove(0);
    assert!(same_bits(&got.0, &want.0));
}

fn load_err(dir: &Path) -> String {
    let spec = match ModelSpec::from_dir(dir) {
        Ok(s) => s,
        Err(e) => return e.to_string(),
    };
    let opts = CpuOptions {
        threads: 1,
        ..cpu_options(vec![0], 4, 1)
    };
    match CpuBackend::load(dir, spec, opts) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn unsupported_variants_fail_with_clear_messages() {
    let cases: Vec<(&str, ConfigEdit, &str)> = vec![
        // A multimodal export runs its text_config (tests/models/matrix.rs, qwen3_5_vl): one
        // without it is refused, and exports of other families are refused as multimodal.
        (
            "qwen3_5",
            Box::new(|c| {
                c["architectures"] = serde_json::json!(["Qwen3_5ForConditionalGeneration"]);
                c["vision_config"] = serde_json::json!({"depth": 2, "hidden_size": 32});
            }),
            "text_config",
        ),
        (
            "qwen3_5",
            Box::new(|c| {
                c["architectures"] = serde_json::json!(["LlavaForConditionalGeneration"]);
                c["vision_config"] = serde_json::json!({"depth": 2, "hidden_size": 32});
            }),
            "multimodal checkpoint `LlavaForConditionalGeneration`",
        ),
        (
            "qwen3_5",
            Box::new(|c| c["architectures"] = serde_json::json!(["Zamba2ForCausalLM"])),
            "unsupported architecture `Zamba2ForCausalLM`",
        ),
        // A MoE class on dense weights: names the first expert tensor it lacks.
        (
            "qwen3_5",
            Box::new(|c| c["architectures"] = serde_json::json!(["Qwen3_5MoeForCausalLM"])),
            "model.layers.0.mlp.experts.0.gate_proj.weight",
        ),
        (
            "qwen3_next",
            Box::new(|c| {
                c["layer_types"][1] = serde_json::json!("sliding_attention");
            }),
            "sliding_attention",
        ),
        (
            "nemotron_h",
            Box::new(|c| {
                c["layers_block_type"][1] = serde_json::json!("mamba3");
            }),
            "block `mamba3`",
        ),
        // Nemotron 3 MoE options hsx cannot run name the option.
        (
            "nemotron_h_moe",
            Box::new(|c| c["n_group"] = serde_json::json!(3)),
            "`n_group`: 8 experts do not split into 3 groups",
        ),
        (
            "nemotron_h_latent",
            Box::new(|c| c["moe_latent_size"] = serde_json::json!(128)),
            "`moe_latent_size`: 128",
        ),
        (
            "nemotron_h_moe",
            Box::new(|c| c["topk_group"] = serde_json::json!(0)),
            "`n_group`: topk_group 0 of 2 groups",
        ),
        (
            "nemotron_h",
            Box::new(|c| c["mlp_hidden_act"] = serde_json::json!("gelu")),
            "mlp_hidden_act `gelu`",
        ),
        (
            "mamba2",
            Box::new(|c| c["time_step_limit"] = serde_json::json!([0.0, 0.1])),
            "`time_step_limit`",
        ),
        (
            "mamba",
            Box::new(|c| c["hidden_act"] = serde_json::json!("gelu")),
            "hidden_act `gelu`",
        ),
        (
            "falcon_mamba",
            Box::new(|c| c["time_step_rank"] = serde_json::json!(0)),
            "`time_step_rank`",
        ),
        (
            "jamba",
            Box::new(|c| c["attn_layer_offset"] = serde_json::json!(2)),
            "`attn_layer_offset`: 2 (must be below attn_layer_period = 2)",
        ),
        // A config that does not match the weights: names the missing tensor.
        (
            "qwen3_5",
            Box::new(|c| c["layer_types"][0] = serde_json::json!("full_attention")),
            "model.layers.0.self_attn.q_proj.weight",
        ),
    ];
    for (name, edit, want) in cases {
        let tmp = tempfile::tempdir().unwrap();
        variant(name, tmp.path(), edit, None, &[]);
        let e = load_err(tmp.path());
        assert!(e.contains(want), "{name}: `{e}` should mention `{want}`");
    }
    let dir = model_dir("qwen3_5");
    let spec = ModelSpec::from_dir(&dir).unwrap();
    let opts = CpuOptions {
        threads: 1,
        ..cpu_options(vec![0], 4, 0)
    };
    let e = CpuBackend::load(&dir, spec, opts).err().unwrap();
    assert!(matches!(e, ModelError::InvalidOptions(m) if m.contains("num_state_slots")));
}

/// 32 requests of different lengths in one step (thousands of rows per projection, so the
/// GEMMs take their large-M paths) give the same bits as each request alone.
#[test]
fn thirty_two_requests_in_one_step_are_byte_identical() {
    for (name, l, rec, attn) in MODELS.into_iter().take(3) {
        let layers = vec![0, rec, attn, l];
        let prompts: Vec<Vec<u32>> = (0..32)
            .map(|i| random_prompt(500 + i as u64, 1 + (i * 37) % 150, 512))
            .collect();
        let mut be = cpu_backend(name, cpu_options(layers, NUM_BLOCKS, 32));
        let solo: Vec<_> = prompts
            .iter()
            .map(|p| run_split(&mut be, std::slice::from_ref(p), 4096).remove(0))
            .collect();
        let got = run_split(&mut be, &prompts, 4096);
        for (r, (a, b)) in got.iter().zip(&solo).enumerate() {
            assert!(same_bits(&a.0, &b.0), "{name}: request {r} differs");
            assert_eq!(a.1, b.1, "{name}: request {r} token");
        }
    }
}

/// qwen3_5_moe stores its experts fused (`experts.gate_up_proj` / `down_proj`), its
/// multimodal export qwen3_5_moe_vl one tensor per expert, with the same weights: every layer
/// the same bits.
#[test]
fn fused_and_per_expert_layouts_give_the_same_bits() {
    let prompts = vec![random_prompt(15, 90, 512), random_prompt(16, 1, 512)];
    let mut fused = backend("qwen3_5_moe", (0..=4).collect());
    let mut per_expert = backend("qwen3_5_moe_vl", (0..=4).collect());
    let a = run_split(&mut fused, &prompts, 4096);
    let b = run_split(&mut per_expert, &prompts, 4096);
    for (r, (a, b)) in a.iter().zip(&b).enumerate() {
        assert!(same_bits(&a.0, &b.0), "prompt {r}: layouts differ");
        assert_eq!(a.1, b.1, "prompt {r}: token");
    }
}
