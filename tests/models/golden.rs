//! End to end against transformers: files written by the engine hold, for every captured
//! layer, the states transformers computes (max-rel ≤ 1e-4 with f32 weights), id L is the
//! pre-norm state (not HF's post-norm `hidden_states[L]`), and greedy tokens match.

use crate::common;

use common::*;
use hsx::actors::messages::EventKind;

const ALL_LAYERS: [usize; 5] = [0, 1, 2, 3, 4];

async fn check_model(model: &str, tol: f32) {
    let reference = Reference::load(model);
    let out = tempfile::tempdir().unwrap();
    let cfg = config(model, out.path(), 64, Some(ALL_LAYERS.to_vec()));
    let n = reference.num_prompts();
    let reqs = (0..n)
        .map(|p| {
            let mut s = spec(&format!("p{p}"), &reference.input_ids(p));
            s.max_tokens = 1;
            s
        })
        .collect();
    let events = run_requests(&cfg, reqs).await;
    for p in 0..n {
        let ev = &events[&format!("p{p}")];
        let file = HsFile::read(&completed_path(ev));
        let t = reference.input_ids(p).len();
        assert_eq!(file.shape, vec![t, 5, 64], "{model} p{p} shape");
        let ids: Vec<u32> = file.token_ids.iter().map(|&x| x as u32).collect();
        assert_eq!(ids, reference.input_ids(p));
        for (k, id) in ALL_LAYERS.iter().enumerate() {
            let want = reference.f32(&format!("p{p}.layer.{id}"));
            let err = max_rel(&file.layer(k), &want);
            assert!(
                err <= tol,
                "{model} p{p} layer {id}: max-rel {err:e} > {tol:e}"
            );
        }
        let hf_last = reference.f32(&format!("p{p}.hf_last"));
        let last_err = max_rel(&file.layer(4), &hf_last);
        assert!(
            last_err > 1e-2,
            "{model} p{p}: id L must be pre-norm, got HF's post-norm ({last_err:e})"
        );
        let EventKind::Completed {
            output_token_ids, ..
        } = &ev.kind
        else {
            unreachable!()
        };
        assert_eq!(
            output_token_ids,
            &vec![reference.next_token(p)],
            "{model} p{p} greedy token"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_gqa_llama3_rope_matches_transformers() {
    check_model("llama", 1e-4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qwen2_bias_tied_sharded_matches_transformers() {
    check_model("qwen2", 1e-4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qwen3_qk_norm_matches_transformers() {
    check_model("qwen3", 1e-4).await;
}

/// gpt-oss: sinks, a window of 8 on layers 0 and 2, YaRN, biased MoE; and its MXFP4 twin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpt_oss_and_mxfp4_match_transformers() {
    check_model("gpt_oss", 1e-4).await;
    check_model("gpt_oss_mxfp4", 1e-4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mistral_matches_transformers() {
    check_model("mistral", 1e-4).await;
}

/// Qwen3-MoE (a dense MLP layer between MoE layers, top-k not renormalised), Mixtral
/// (`block_sparse_moe`, w1/w3/w2 experts), Qwen3.5-MoE (fused experts on disk, gated shared
/// expert), GLM-4.5 (grouped sigmoid router, plain shared expert, partial rotary, an MTP
/// layer on disk) and DeepSeek-V3 (multi-head latent attention, YaRN): through the engine,
/// every layer and the greedy token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moe_models_match_transformers() {
    for model in [
        "qwen3_moe",
        "mixtral",
        "qwen3_5_moe",
        "glm4_moe",
        "deepseek_v3",
    ] {
        check_model(model, 1e-4).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bf16_weights_match_transformers_f32_compute() {
    check_model("llama_bf16", 1e-4).await;
}

/// bf16 weights on the path `auto` picks on this CPU (the default: AMX, else AVX512-BF16,
/// else f32): every layer within bf16 rounding of the f32-compute reference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bf16_weights_on_the_default_path() {
    let path = hsx::kernels::Bf16Kernel::Auto.resolve().unwrap();
    println!("bf16 GEMM path here: {path}");
    for model in ["llama_bf16", "qwen3_5_bf16"] {
        let reference = Reference::load(model);
        let out = tempfile::tempdir().unwrap();
        let layers = reference_layers(model);
        let mut cfg = config(model, out.path(), 64, Some(layers.clone()));
        cfg.model.cpu_bf16_kernel = hsx::kernels::Bf16Kernel::Auto;
        let n = reference.num_prompts();
        let reqs = (0..n)
            .map(|p| spec(&format!("p{p}"), &reference.input_ids(p)))
            .collect();
        let events = run_requests(&cfg, reqs).await;
        for p in 0..n {
            let file = HsFile::read(&completed_path(&events[&format!("p{p}")]));
            for (k, id) in layers.iter().enumerate() {
                let want = reference.f32(&format!("p{p}.layer.{id}"));
                let err = max_rel(&file.layer(k), &want);
                let tol = common::backends::bf16_tol(model);
                assert!(
                    err <= tol,
                    "{model} on {path} p{p} layer {id}: max-rel {err:e}"
                );
            }
        }
    }
}

/// Every layer id of fixture `model` (0..=L).
fn reference_layers(model: &str) -> Vec<usize> {
    let spec = hsx::models::ModelSpec::from_dir(&model_dir(model)).unwrap();
    (0..=spec.num_layers).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_and_bf16_file_dtype() {
    let out = tempfile::tempdir().unwrap();
    let mut cfg = config("llama_bf16", out.path(), 64, None);
    cfg.engine.dtype = hsx::config::DtypeChoice::Auto;
    let reference = Reference::load("llama_bf16");
    let events = run_requests(&cfg, vec![spec("m", &reference.input_ids(2))]).await;
    let file = HsFile::read(&completed_path(&events["m"]));
    assert_eq!(file.dtype, safetensors::Dtype::BF16);
    // Default layers for L = 4: [2, L/2, L-3, L] deduplicated and sorted.
    assert_eq!(file.metadata["layer_ids"], "[1,2,4]");
    assert_eq!(file.metadata["pre_norm_last"], "true");
    assert_eq!(file.metadata["dtype"], "bf16");
    assert_eq!(file.metadata["model"], "llama_bf16");
    assert_eq!(file.metadata["hsx_version"], hsx::VERSION);
    let want = reference.f32("p2.layer.4");
    let err = max_rel(&file.layer(2), &want);
    assert!(err < 1e-2, "bf16 rounding only: {err:e}");
}
