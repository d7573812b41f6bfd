//! Dense models on the CPU backend against the Hugging Face reference fixtures
//! (tests/fixtures/make_fixtures.py), byte-identity across chunking and batching, and errors.

use crate::common;

use std::collections::HashMap;
use std::path::Path;

use common::backends::{Paging, cpu_backend, cpu_options, same_bits};
use common::{fixture_dir, model_dir};
use hsx::kernels::{Backend, BackendError, Batch, BatchOutput, SeqChunk};
use hsx::models::{CpuBackend, CpuOptions};
use hsx::models::{ModelError, ModelSpec, WeightDtype};
use safetensors::SafeTensors;

const ARCHS: [&str; 6] = [
    "llama",
    "qwen2",
    "qwen3",
    "mistral",
    "llama_bf16",
    "llama_f16",
];
const LAYERS: usize = 4;
const HIDDEN: usize = 64;
const NUM_BLOCKS: usize = 64;
/// Non-contiguous, descending block ids so paging bugs show.
const PAGING: Paging = Paging::Dense {
    num_blocks: NUM_BLOCKS,
};

/// The reference tensors of one model: f32 tensors and i64 tensors (as u32 / usize).
struct Reference {
    f32s: HashMap<String, Vec<f32>>,
    ints: HashMap<String, Vec<i64>>,
}

impl Reference {
    fn load(name: &str) -> Self {
        let bytes = std::fs::read(
            fixture_dir()
                .join("reference")
                .join(format!("{name}.safetensors")),
        )
        .unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let (mut f32s, mut ints) = (HashMap::new(), HashMap::new());
        for (n, t) in st.tensors() {
            match t.dtype() {
                safetensors::Dtype::F32 => {
                    let v = t
                        .data()
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes(b.try_into().unwrap()));
                    f32s.insert(n, v.collect());
                }
                safetensors::Dtype::I64 => {
                    let v = t
                        .data()
                        .chunks_exact(8)
                        .map(|b| i64::from_le_bytes(b.try_into().unwrap()));
                    ints.insert(n, v.collect());
                }
                other => panic!("unexpected dtype {other:?} for {n}"),
            }
        }
        Self { f32s, ints }
    }

    fn ids(&self, j: usize) -> Vec<u32> {
        self.ints[&format!("p{j}.input_ids")]
            .iter()
            .map(|&x| x as u32)
            .collect()
    }

    fn layer(&self, j: usize, i: usize) -> &[f32] {
        &self.f32s[&format!("p{j}.layer.{i}")]
    }
}

fn backend(name: &str) -> CpuBackend {
    backend_with_threads(name, 2)
}

fn backend_with_threads(name: &str, threads: usize) -> CpuBackend {
    let opts = CpuOptions {
        threads,
        ..cpu_options((0..=LAYERS).collect(), NUM_BLOCKS, 0)
    };
    cpu_backend(name, opts)
}

fn chunk(r: usize, start: usize, len: usize, total: usize) -> SeqChunk {
    PAGING.chunk(r, start, len, total)
}

/// Captured rows of one token: `[K * H]` slice of `[T, K, H]`.
fn row_layer(out: &[f32], t: usize, k: usize) -> &[f32] {
    let kk = LAYERS + 1;
    &out[(t * kk + k) * HIDDEN..(t * kk + k + 1) * HIDDEN]
}

fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    common::max_rel(a, b)
}

/// One prompt as one chunk (request slot `r`).
fn run_alone(be: &mut CpuBackend, r: usize, ids: &[u32]) -> BatchOutput {
    PAGING.alone(be, r, ids)
}

fn check_against_hf(name: &str) {
    let reference = Reference::load(name);
    let mut be = backend(name);
    for j in 0..4 {
        let ids = reference.ids(j);
        let t = ids.len();
        let out = run_alone(&mut be, j, &ids);
        let captured = out.captured_f32((LAYERS + 1) * HIDDEN);
        assert_eq!(captured.len(), t * (LAYERS + 1) * HIDDEN);
        for i in 0..=LAYERS {
            let ours: Vec<f32> = (0..t)
                .flat_map(|tt| row_layer(&captured, tt, i).to_vec())
                .collect();
            let e = rel_err(&ours, reference.layer(j, i));
            assert!(e <= 1e-4, "{name} p{j} layer {i}: rel err {e}");
        }
        let last: Vec<f32> = (0..t)
            .flat_map(|tt| row_layer(&captured, tt, LAYERS).to_vec())
            .collect();
        let hf_last = &reference.f32s[&format!("p{j}.hf_last")];
        assert!(
            rel_err(&last, hf_last) > 1e-3,
            "{name} p{j}: id L must be pre-norm"
        );
        let e = rel_err(&be.final_norm(&last).unwrap(), hf_last);
        assert!(
            e <= 1e-4,
            "{name} p{j}: final_norm(id L) vs hf_last rel err {e}"
        );
        let next = reference.ints[&format!("p{j}.next_token")][0] as u32;
        assert_eq!(out.sampled, vec![Some(next)], "{name} p{j}: next token");
    }
}

#[test]
fn llama_matches_hf() {
    check_against_hf("llama");
}

#[test]
fn qwen2_sharded_tied_matches_hf() {
    check_against_hf("qwen2");
}

#[test]
fn qwen3_matches_hf() {
    check_against_hf("qwen3");
}

#[test]
fn mistral_matches_hf() {
    check_against_hf("mistral");
}

#[test]
fn llama_bf16_matches_hf() {
    check_against_hf("llama_bf16");
    assert_eq!(
        ModelSpec::from_dir(&model_dir("llama_bf16")).unwrap().dtype,
        WeightDtype::Bf16
    );
    assert_eq!(
        ModelSpec::from_dir(&model_dir("llama")).unwrap().dtype,
        WeightDtype::F32
    );
}

#[test]
fn llama_f16_matches_hf() {
    check_against_hf("llama_f16");
    assert_eq!(
        ModelSpec::from_dir(&model_dir("llama_f16")).unwrap().dtype,
        WeightDtype::F16
    );
}

/// Runs every prompt split into chunks of `c`, one forward per step, all prompts' chunks of a
/// step packed in the same batch (prompts in reverse order to vary batch positions).
fn run_chunked_mixed(
    be: &mut CpuBackend,
    prompts: &[Vec<u32>],
    c: usize,
) -> Vec<(Vec<f32>, Option<u32>)> {
    PAGING.run_pieces(be, prompts, c, true)
}

#[test]
fn chunking_and_batching_are_bit_identical() {
    for name in ARCHS {
        let reference = Reference::load(name);
        let prompts: Vec<Vec<u32>> = (0..4).map(|j| reference.ids(j)).collect();
        let mut be = backend(name);
        let alone: Vec<BatchOutput> = prompts
            .iter()
            .enumerate()
            .map(|(r, p)| run_alone(&mut be, r, p))
            .collect();

        // All four prompts packed whole in one batch.
        let ids: Vec<u32> = prompts.concat();
        let seqs: Vec<SeqChunk> = prompts
            .iter()
            .enumerate()
            .map(|(r, p)| chunk(r, 0, p.len(), p.len()))
            .collect();
        let packed = be
            .forward(&Batch {
                token_ids: &ids,
                seqs: &seqs,
            })
            .unwrap();
        let row = (LAYERS + 1) * HIDDEN;
        let mut offset = 0;
        for (r, p) in prompts.iter().enumerate() {
            let mine =
                &packed.captured_f32((LAYERS + 1) * HIDDEN)[offset * row..(offset + p.len()) * row];
            assert!(
                same_bits(mine, &alone[r].captured_f32((LAYERS + 1) * HIDDEN)),
                "{name} p{r}: packed batch differs"
            );
            assert_eq!(packed.sampled[r], alone[r].sampled[0]);
            offset += p.len();
        }

        // Chunks of 7 (one prompt per batch), then chunks of 7 and 64 mixed across prompts.
        for (r, p) in prompts.iter().enumerate() {
            let got = run_chunked_mixed(&mut be, std::slice::from_ref(p), 7);
            assert!(
                same_bits(&got[0].0, &alone[r].captured_f32((LAYERS + 1) * HIDDEN)),
                "{name} p{r}: chunks of 7 differ"
            );
            assert_eq!(got[0].1, alone[r].sampled[0]);
        }
        for c in [7, 64] {
            let got = run_chunked_mixed(&mut be, &prompts, c);
            for (r, (rows, tok)) in got.iter().enumerate() {
                assert!(
                    same_bits(rows, &alone[r].captured_f32((LAYERS + 1) * HIDDEN)),
                    "{name} p{r}: mixed chunks of {c} differ"
                );
                assert_eq!(*tok, alone[r].sampled[0]);
            }
        }
    }
}

#[test]
fn thread_count_does_not_change_bits() {
    let reference = Reference::load("qwen3");
    let prompts: Vec<Vec<u32>> = (0..4).map(|j| reference.ids(j)).collect();
    let ids: Vec<u32> = prompts.concat();
    let seqs: Vec<SeqChunk> = prompts
        .iter()
        .enumerate()
        .map(|(r, p)| chunk(r, 0, p.len(), p.len()))
        .collect();
    let batch = Batch {
        token_ids: &ids,
        seqs: &seqs,
    };
    let one = backend_with_threads("qwen3", 1).forward(&batch).unwrap();
    let three = backend_with_threads("qwen3", 3).forward(&batch).unwrap();
    assert_eq!(one.captured, three.captured);
    assert_eq!(one.sampled, three.sampled);
}

#[test]
fn capture_subset_and_no_sample() {
    let dir = model_dir("qwen3");
    let spec = ModelSpec::from_dir(&dir).unwrap();
    let opts = CpuOptions {
        capture_layers: vec![1, 4],
        num_blocks: 8,
        block_size: 32,
        threads: 1,
        num_state_slots: 0,
        output_dtype: hsx::kernels::OutputDtype::F32,
        reject_bad_states: true,
        bf16_kernel: hsx::kernels::Bf16Kernel::Auto,
    };
    let mut be = CpuBackend::load(&dir, spec, opts).unwrap();
    assert_eq!(be.capture_layers(), &[1, 4]);
    assert_eq!(be.hidden_size(), HIDDEN);
    let reference = Reference::load("qwen3");
    let ids = reference.ids(1);
    let seqs = [SeqChunk {
        context: Vec::new(),
        start: 0,
        len: ids.len(),
        block_table: vec![3],
        sample: false,
        state_slot: None,
    }];
    let out = be
        .forward(&Batch {
            token_ids: &ids,
            seqs: &seqs,
        })
        .unwrap();
    assert_eq!(out.sampled, vec![None]);
    assert_eq!(out.captured.len(), ids.len() * 2 * HIDDEN * 4);
    for (k, id) in [1, 4].into_iter().enumerate() {
        let ours: Vec<f32> = out
            .captured_f32((LAYERS + 1) * HIDDEN)
            .chunks_exact(HIDDEN)
            .skip(k)
            .step_by(2)
            .flatten()
            .copied()
            .collect();
        assert!(rel_err(&ours, reference.layer(1, id)) <= 1e-4);
    }
}

#[test]
fn bad_batches_are_errors_and_leave_the_cache_alone() {
    let reference = Reference::load("llama");
    let mut be = backend("llama");
    let ids = reference.ids(2);
    let alone = run_alone(&mut be, 0, &ids);
    // First half of the prompt, then a series of bad batches, then the second half.
    let half = ids.len() / 2;
    let first = be
        .forward(&Batch {
            token_ids: &ids[..half],
            seqs: &[chunk(1, 0, half, ids.len())],
        })
        .unwrap();
    let rest = &ids[half..];
    let good = chunk(1, half, rest.len(), ids.len());
    let with = |f: &dyn Fn(&mut SeqChunk)| {
        let mut s = good.clone();
        f(&mut s);
        s
    };
    let mut bad_tokens = rest.to_vec();
    bad_tokens[3] = 512;
    let err = be
        .forward(&Batch {
            token_ids: &bad_tokens,
            seqs: std::slice::from_ref(&good),
        })
        .unwrap_err();
    assert!(
        matches!(
            err,
            BackendError::TokenOutOfRange {
                token: 512,
                vocab: 512
            }
        ),
        "{err}"
    );
    let cases: Vec<(&str, Vec<SeqChunk>, &[u32])> = vec![
        (
            "short table",
            vec![with(&|s| s.block_table.truncate(1))],
            rest,
        ),
        (
            "block id",
            vec![with(&|s| s.block_table[1] = NUM_BLOCKS as u32)],
            rest,
        ),
        ("position", vec![with(&|s| s.start = 2048 - 3)], rest),
        ("length sum", vec![with(&|s| s.len -= 1)], rest),
        (
            "empty chunk",
            vec![good.clone(), with(&|s| s.len = 0)],
            rest,
        ),
    ];
    for (what, seqs, toks) in cases {
        let err = be
            .forward(&Batch {
                token_ids: toks,
                seqs: &seqs,
            })
            .unwrap_err();
        assert!(
            matches!(err, BackendError::InvalidBatch(_)),
            "{what}: {err}"
        );
    }
    let clash = [chunk(1, half, 4, ids.len()), chunk(1, half, 4, ids.len())];
    let err = be
        .forward(&Batch {
            token_ids: &rest[..8],
            seqs: &clash,
        })
        .unwrap_err();
    assert!(
        matches!(err, BackendError::InvalidBatch(ref m) if m.contains("same cache slot")),
        "{err}"
    );

    let second = be
        .forward(&Batch {
            token_ids: rest,
            seqs: &[good],
        })
        .unwrap();
    let joined = [first.captured, second.captured].concat();
    assert_eq!(joined, alone.captured);
    assert_eq!(second.sampled, alone.sampled);
    let empty = be
        .forward(&Batch {
            token_ids: &[],
            seqs: &[],
        })
        .unwrap();
    assert!(empty.captured.is_empty() && empty.sampled.is_empty());
}

/// Copies a fixture model into a temp dir, letting `edit` change its config.json.
fn edited_copy(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(model_dir(name)).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, tmp.path().join(p.file_name().unwrap())).unwrap();
    }
    let cfg_path = tmp.path().join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(&cfg_path, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    tmp
}

/// The error of loading `dir` (from the config or from the weights).
fn load_err(dir: &Path) -> ModelError {
    let spec = match ModelSpec::from_dir(dir) {
        Ok(spec) => spec,
        Err(e) => return e,
    };
    let opts = CpuOptions {
        capture_layers: vec![spec.num_layers],
        num_blocks: 4,
        block_size: 16,
        threads: 1,
        num_state_slots: 0,
        output_dtype: hsx::kernels::OutputDtype::F32,
        reject_bad_states: true,
        bf16_kernel: hsx::kernels::Bf16Kernel::Auto,
    };
    match CpuBackend::load(dir, spec, opts) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e,
    }
}

#[test]
fn load_errors_are_clear() {
    let missing = fixture_dir().join("models/does-not-exist");
    let e = ModelSpec::from_dir(&missing).unwrap_err();
    assert!(matches!(e, ModelError::MissingDir(_)), "{e}");

    let empty = tempfile::tempdir().unwrap();
    let e = ModelSpec::from_dir(empty.path()).unwrap_err();
    assert!(
        matches!(e, ModelError::MissingConfig(_)) && e.to_string().contains("config.json"),
        "{e}"
    );

    let unknown = edited_copy("llama", |c| {
        c["architectures"] = serde_json::json!(["FooForCausalLM"])
    });
    let e = ModelSpec::from_dir(unknown.path()).unwrap_err();
    assert!(e.to_string().contains("FooForCausalLM"), "{e}");

    // qwen2 is tied: untying it asks for an lm_head.weight that is not there.
    let untied = edited_copy("qwen2", |c| {
        c["tie_word_embeddings"] = serde_json::json!(false)
    });
    let e = load_err(untied.path());
    assert!(
        matches!(e, ModelError::MissingTensor { ref name, .. } if name == "lm_head.weight"),
        "{e}"
    );

    let misshaped = edited_copy("llama", |c| c["intermediate_size"] = serde_json::json!(100));
    let e = load_err(misshaped.path());
    match &e {
        ModelError::TensorShape {
            name,
            expected,
            found,
        } => {
            assert_eq!(name, "model.layers.0.mlp.gate_proj.weight");
            assert_eq!(
                (expected.as_slice(), found.as_slice()),
                (&[100, 64][..], &[128, 64][..])
            );
        }
        other => panic!("{other}"),
    }

    let no_weights = edited_copy("mistral", |_| {});
    std::fs::remove_file(no_weights.path().join("model.safetensors")).unwrap();
    let e = load_err(no_weights.path());
    assert!(matches!(e, ModelError::NoWeights(_)), "{e}");

    let lost_shard = edited_copy("qwen2", |_| {});
    std::fs::remove_file(lost_shard.path().join("model-00002-of-00002.safetensors")).unwrap();
    let e = load_err(lost_shard.path());
    assert!(
        e.to_string().contains("model-00002-of-00002.safetensors"),
        "{e}"
    );

    // Qwen2's per-layer windows are refused (Mistral's all-layer window runs: mistral_swa).
    let window = edited_copy("qwen2", |c| {
        c["sliding_window"] = serde_json::json!(128);
        c["use_sliding_window"] = serde_json::json!(true);
    });
    let e = ModelSpec::from_dir(window.path()).unwrap_err();
    assert!(
        matches!(e, ModelError::Unsupported { .. }) && e.to_string().contains("sliding"),
        "{e}"
    );
}
