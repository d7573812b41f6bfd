//! Shared helpers of the integration tests: configs for the fixture models, running requests
//! through a real engine, reading the files back.
#![allow(dead_code)]

pub mod backends;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use half::bf16;
use hsx::actors::messages::{CompletionEvent, EventKind};
use hsx::config::{Config, DtypeChoice};
use hsx::engine::{Engine, RequestSpec};
use safetensors::{Dtype, SafeTensors};

pub fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

pub fn model_dir(name: &str) -> PathBuf {
    fixture_dir().join("models").join(name)
}

/// A fixture's tensors as plain data: name -> (dtype, shape, bytes).
pub type Tensors = HashMap<String, (Dtype, Vec<usize>, Vec<u8>)>;

/// Copies fixture model `name` (config.json and one model.safetensors) to `dst`, with `edit`
/// applied to its config and `rewrite` to its tensors.
pub fn fixture_variant(
    name: &str,
    dst: &Path,
    edit: impl Fn(&mut serde_json::Value),
    rewrite: impl Fn(&mut Tensors),
) {
    let src = model_dir(name);
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(dst.join("config.json"), cfg.to_string()).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut all: Tensors = st
        .tensors()
        .into_iter()
        .map(|(n, t)| (n, (t.dtype(), t.shape().to_vec(), t.data().to_vec())))
        .collect();
    rewrite(&mut all);
    let views = all.iter().map(|(n, (d, s, b))| {
        let view = safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap();
        (n.clone(), view)
    });
    safetensors::serialize_to_file(views, None, &dst.join("model.safetensors")).unwrap();
}

/// A config for a fixture model writing into `out`.
pub fn config(model: &str, out: &Path, budget: usize, layers: Option<Vec<usize>>) -> Config {
    let mut c = Config::parse("[model]\npath = \"x\"\n").unwrap();
    c.model.path = model_dir(model);
    c.model.threads = 2;
    // f32 numerics for bf16 weights, as the references (golden.rs also runs the native path).
    c.model.cpu_bf16_kernel = hsx::kernels::Bf16Kernel::F32;
    c.output.dir = out.to_owned();
    c.engine.max_num_batched_tokens = budget;
    c.engine.layer_ids = layers;
    c.engine.dtype = DtypeChoice::F32;
    c.engine.num_blocks = 512;
    c.engine.block_size = 16;
    c.validate().unwrap();
    c
}

/// Submits every request, waits for one event each, shuts the engine down.
pub async fn run_requests(
    cfg: &Config,
    reqs: Vec<RequestSpec>,
) -> HashMap<String, CompletionEvent> {
    let engine = Engine::start(cfg).await.expect("engine starts");
    let mut sub = engine.subscribe(None).await;
    let n = reqs.len();
    for spec in reqs {
        let req = engine.request(spec).expect("valid id");
        engine.submit(req).await.expect("submit accepted");
    }
    let mut events = HashMap::new();
    while events.len() < n {
        let ev = sub.next().await.expect("event stream open");
        events.insert(ev.id.to_string(), ev);
    }
    engine.shutdown().await;
    events
}

/// Runs `reqs` on a fixture model (layers, token budget, max running requests) and reads back
/// each request's file, keyed by request id.
pub async fn run_files(
    model: &str,
    layers: &[usize],
    budget: usize,
    seqs: usize,
    reqs: &[RequestSpec],
) -> HashMap<String, HsFile> {
    let out = tempfile::tempdir().unwrap();
    let mut cfg = config(model, out.path(), budget, Some(layers.to_vec()));
    cfg.engine.max_num_seqs = seqs;
    let events = run_requests(&cfg, reqs.to_vec()).await;
    events
        .iter()
        .map(|(id, ev)| (id.clone(), HsFile::read(&completed_path(ev))))
        .collect()
}

pub fn spec(id: &str, tokens: &[u32]) -> RequestSpec {
    RequestSpec {
        id: id.into(),
        token_ids: tokens.to_vec(),
        max_tokens: 0,
        include_output_tokens: false,
    }
}

/// A written file, read back.
#[derive(Debug, Clone)]
pub struct HsFile {
    pub shape: Vec<usize>,
    pub dtype: Dtype,
    /// Raw bytes of `hidden_states`.
    pub raw: Vec<u8>,
    pub token_ids: Vec<i64>,
    pub metadata: HashMap<String, String>,
}

impl HsFile {
    pub fn read(path: &Path) -> HsFile {
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let mut names = st.names();
        names.sort();
        assert_eq!(
            names,
            vec!["hidden_states", "token_ids"],
            "exactly two tensors"
        );
        let hs = st.tensor("hidden_states").unwrap();
        let tok = st.tensor("token_ids").unwrap();
        assert_eq!(tok.dtype(), Dtype::I64);
        assert_eq!(tok.shape(), &[hs.shape()[0]]);
        HsFile {
            shape: hs.shape().to_vec(),
            dtype: hs.dtype(),
            raw: hs.data().to_vec(),
            token_ids: bytemuck::pod_collect_to_vec(tok.data()),
            metadata: meta.metadata().clone().unwrap_or_default(),
        }
    }

    pub fn values(&self) -> Vec<f32> {
        match self.dtype {
            Dtype::F32 => bytemuck::pod_collect_to_vec(&self.raw),
            Dtype::BF16 => bytemuck::pod_collect_to_vec::<u8, bf16>(&self.raw)
                .iter()
                .map(|x| x.to_f32())
                .collect(),
            d => panic!("unexpected dtype {d:?}"),
        }
    }

    /// Values of layer slot `k` ([T, H]).
    pub fn layer(&self, k: usize) -> Vec<f32> {
        let (t, kk, h) = (self.shape[0], self.shape[1], self.shape[2]);
        let v = self.values();
        (0..t)
            .flat_map(|row| v[(row * kk + k) * h..][..h].to_vec())
            .collect()
    }
}

/// The transformers reference of a fixture model.
pub struct Reference {
    bytes: Vec<u8>,
}

impl Reference {
    pub fn load(model: &str) -> Reference {
        let p = fixture_dir()
            .join("reference")
            .join(format!("{model}.safetensors"));
        Reference {
            bytes: std::fs::read(p).unwrap(),
        }
    }

    fn get(&self, name: &str) -> (Vec<usize>, Vec<u8>) {
        let st = SafeTensors::deserialize(&self.bytes).unwrap();
        let t = st
            .tensor(name)
            .unwrap_or_else(|_| panic!("reference lacks {name}"));
        (t.shape().to_vec(), t.data().to_vec())
    }

    pub fn num_prompts(&self) -> usize {
        let st = SafeTensors::deserialize(&self.bytes).unwrap();
        st.names()
            .iter()
            .filter(|n| n.ends_with(".input_ids"))
            .count()
    }

    pub fn input_ids(&self, p: usize) -> Vec<u32> {
        let (_, d) = self.get(&format!("p{p}.input_ids"));
        bytemuck::pod_collect_to_vec::<u8, i64>(&d)
            .iter()
            .map(|&x| x as u32)
            .collect()
    }

    pub fn f32(&self, name: &str) -> Vec<f32> {
        bytemuck::pod_collect_to_vec(&self.get(name).1)
    }

    pub fn next_token(&self, p: usize) -> u32 {
        let (_, d) = self.get(&format!("p{p}.next_token"));
        bytemuck::pod_collect_to_vec::<u8, i64>(&d)[0] as u32
    }
}

/// max |a - b| / max |b|; NaN where either side holds a NaN, so that `err <= tol` fails
/// (`f32::max` passes over a NaN: a kernel writing NaN would otherwise look exact).
pub fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    let num = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, nan_max);
    let den = b.iter().map(|y| y.abs()).fold(0f32, nan_max);
    num / den.max(f32::MIN_POSITIVE)
}

/// `f32::max` that keeps a NaN instead of passing over it.
pub fn nan_max(m: f32, x: f32) -> f32 {
    if x.is_nan() || x > m { x } else { m }
}

pub fn completed_path(ev: &CompletionEvent) -> PathBuf {
    match &ev.kind {
        EventKind::Completed { path, .. } => path.clone(),
        EventKind::Failed { error } => panic!("request {} failed: {error}", ev.id),
    }
}

/// Deterministic pseudo-random prompts (xorshift), tokens in [0, vocab).
pub fn random_prompt(seed: u64, len: usize, vocab: u32) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab as u64) as u32
        })
        .collect()
}

/// A copy of the llama fixture under `dir` whose embedding row of `token` holds a NaN (as a
/// corrupted checkpoint would): every prompt with that token gets a non-finite row.
pub fn poisoned_llama(dir: &Path, token: u32) -> PathBuf {
    let src = model_dir("llama");
    let dst = dir.join("llama-nan");
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(&src).unwrap().flatten() {
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    let path = dst.join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let t = &header["model.embed_tokens.weight"];
    assert_eq!(t["dtype"], "F32");
    let hidden = t["shape"][1].as_u64().unwrap() as usize;
    let start = t["data_offsets"][0].as_u64().unwrap() as usize;
    let at = 8 + n + start + token as usize * hidden * 4;
    bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
    dst
}

/// The bundled prompts (id, token ids) of tests/fixtures/prompts.jsonl.
pub fn bundled_prompts() -> Vec<(String, Vec<u32>)> {
    let text = std::fs::read_to_string(fixture_dir().join("prompts.jsonl")).unwrap();
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let ids = v["token_ids"].as_array().unwrap();
            let ids = ids.iter().map(|x| x.as_u64().unwrap() as u32).collect();
            (v["id"].as_str().unwrap().to_string(), ids)
        })
        .collect()
}
