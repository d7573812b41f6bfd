//! `dtype = "fp8"`: files in speculators' `hs_connectors` FP8 layout whose codes and scales are
//! the quantization (`kernels::fp8`, matched bit for bit with torch in its unit tests) of the
//! f32 states of the same prompts, on a dense and a hybrid model; inspect reads them; the
//! memory bound counts fp8 bytes.

use crate::common;

use std::collections::HashMap;
use std::path::Path;

use common::*;
use hsx::actors::scheduler::SubmitError;
use hsx::config::DtypeChoice;
use hsx::engine::Engine;
use hsx::kernels::fp8::{SCALE_BYTES, quantize_row};
use safetensors::{Dtype, SafeTensors};

const LAYERS: [usize; 3] = [0, 2, 4];

/// An fp8 file's codes `[T, K, H]`, scales `[T]` and token ids.
struct Fp8File {
    shape: Vec<usize>,
    codes: Vec<u8>,
    scales: Vec<u8>,
    token_ids: Vec<u8>,
}

fn read_fp8(path: &Path) -> Fp8File {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut names = st.names();
    names.sort();
    assert_eq!(
        names,
        ["hidden_states", "hidden_states_scales", "token_ids"]
    );
    let hs = st.tensor("hidden_states").unwrap();
    assert_eq!(hs.dtype(), Dtype::F8_E4M3);
    let sc = st.tensor("hidden_states_scales").unwrap();
    assert_eq!(
        (sc.dtype(), sc.shape()),
        (Dtype::F32, &[hs.shape()[0], 1, 1][..])
    );
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    assert_eq!(meta.metadata().as_ref().unwrap()["dtype"], "fp8");
    Fp8File {
        shape: hs.shape().to_vec(),
        codes: hs.data().to_vec(),
        scales: sc.data().to_vec(),
        token_ids: st.tensor("token_ids").unwrap().data().to_vec(),
    }
}

/// The prompts' files written in `dtype` (paths by request id).
async fn extract(
    model: &str,
    dtype: DtypeChoice,
    out: &Path,
) -> HashMap<String, std::path::PathBuf> {
    let mut cfg = config(model, out, 61, Some(LAYERS.to_vec()));
    cfg.engine.dtype = dtype;
    let reqs: Vec<_> = (0..6)
        .map(|i| {
            spec(
                &format!("p{i}"),
                &random_prompt(70 + i, 1 + 37 * i as usize, 300),
            )
        })
        .collect();
    let events = run_requests(&cfg, reqs).await;
    events
        .iter()
        .map(|(id, ev)| (id.clone(), completed_path(ev)))
        .collect()
}

async fn fp8_is_quantized_f32(model: &str) {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let f32_files = extract(model, DtypeChoice::F32, a.path()).await;
    let fp8_files = extract(model, DtypeChoice::Fp8, b.path()).await;
    for (id, path) in &fp8_files {
        let got = read_fp8(path);
        let want = HsFile::read(&f32_files[id]);
        assert_eq!(got.shape, want.shape, "{id}");
        let width = want.shape[1] * want.shape[2];
        let values = want.values();
        let mut row = vec![0u8; width + SCALE_BYTES];
        for (t, v) in values.chunks_exact(width).enumerate() {
            quantize_row(v, &mut row);
            assert!(
                got.codes[t * width..][..width] == row[..width],
                "{id}: row {t} codes"
            );
            assert_eq!(
                got.scales[t * 4..][..4],
                row[width..],
                "{id}: row {t} scale"
            );
        }
        let ids: Vec<u8> = want
            .token_ids
            .iter()
            .flat_map(|i| i.to_le_bytes())
            .collect();
        assert_eq!(got.token_ids, ids, "{id}");
        let report = hsx::inspect::inspect_file(path);
        assert!(report.is_ok(), "{id}: {:?}", report.problems);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dense_fp8_files_are_the_f32_states_quantized() {
    fp8_is_quantized_f32("llama").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_fp8_files_are_the_f32_states_quantized() {
    fp8_is_quantized_f32("qwen3_5").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_bound_counts_fp8_bytes() {
    // K = 3 layers × H = 64 codes + a 4-byte scale per token.
    let row = 3 * 64 + 4;
    let out = tempfile::tempdir().unwrap();
    let mut cfg = config("llama", out.path(), 64, Some(LAYERS.to_vec()));
    cfg.engine.dtype = DtypeChoice::Fp8;
    cfg.engine.max_pending_bytes = 100 * row;
    let engine = Engine::start(&cfg).await.unwrap();
    let fits = engine
        .request(spec("fits", &random_prompt(3, 100, 512)))
        .unwrap();
    assert_eq!(engine.validate(&fits), Ok(()));
    let big = engine
        .request(spec("big", &random_prompt(4, 101, 512)))
        .unwrap();
    let e = engine.validate(&big).unwrap_err();
    let (rows, bytes, max) = (101, 101 * row, 100 * row);
    assert_eq!(e, SubmitError::TooLargeForHostMemory { rows, bytes, max });
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fp8_file_is_about_half_the_bf16_file() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let bf16 = extract("llama", DtypeChoice::Bf16, a.path()).await;
    let fp8 = extract("llama", DtypeChoice::Fp8, b.path()).await;
    let size = |p: &Path| std::fs::metadata(p).unwrap().len();
    let long = "p5"; // 186 tokens
    let (h, f) = (size(&bf16[long]), size(&fp8[long]));
    // Per token: 3 × 64 × 2 = 384 bytes in bf16, 3 × 64 + 4 = 196 in fp8 (+ 8 of token id).
    assert!(
        f * 100 < h * 53 && f * 100 > h * 50,
        "fp8 {f} bytes, bf16 {h}"
    );
}
