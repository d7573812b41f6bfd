//! Hostile model directories (issue 17.2) on proptest: a bundled fixture with its config.json,
//! safetensors headers, shard index, tokenizer.json and chat template mutated
//! (tests/soak/model_dirs_inputs.rs), then loaded as the engine loads a model
//! (`ModelSpec::from_dir`, the default layer ids, `CpuBackend::load`) and, when it loads, run
//! on three tokens; the tokenizer and chat template loaded as the daemon does
//! (`Prompter::from_dir`) and, when they load, a conversation rendered and encoded.
//!
//! Properties: no panic (proptest fails a case that panics; the backend's own catch of a
//! panicking forward is a failure too); every refusal is an error with a non-empty message
//! of at most [`MAX_MESSAGE`] bytes; a model that loads runs and captures `[3, K, H]` rows; no
//! single allocation larger than the case's bound (a config claiming a 10^12 vocabulary must
//! fail on the weights, not allocate for it). The allocation check is the largest single
//! request seen by the [`Tracking`] global allocator while the case runs, failed requests
//! included. No hang: a case that does not end stops the run (templates are bounded).
//!
//! Shared by tests/reliability/model_dirs.rs (a short CI run) and the soak example
//! (`model-dirs --cases N`).
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::borrow::Cow;
use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use hsx::chat::{Prompter, RenderLimits, RenderOptions};
use hsx::kernels::{Backend, Batch, OutputDtype, SeqChunk};
use hsx::models::{CpuBackend, CpuOptions, ModelSpec};
use proptest::prop_assert;
use proptest::test_runner::{Config, RngSeed, TestCaseResult, TestError, TestRunner};
use serde_json::{Value as Json, json};

#[path = "model_dirs_inputs.rs"]
mod inputs;
#[path = "model_dirs_words.rs"]
mod words;
pub use inputs::{Case, File, Header, Mutation, case};
use inputs::{count_nodes, edit_bytes, parse_header, replace_node, set_path};
use words::FIXTURES;

/// Longest refusal message accepted (a message quoting a whole hostile field is a defect). The
/// unknown-architecture refusal names every class hsx loads: ~2 KB with 64 architectures and
/// 16 exports, hence room for twice that.
pub const MAX_MESSAGE: usize = 4096;

/// The render bound of the chat templates under test.
const RENDER_BYTES: usize = 1 << 20;

/// The system allocator, noting the largest single request.
pub struct Tracking;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

fn note(size: usize) {
    if size > LARGEST.load(Ordering::Relaxed) {
        LARGEST.fetch_max(size, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded unchanged to `System`.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Tracking = Tracking;

#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub cases: u64,
    /// Loaded and ran a forward.
    pub ran: u64,
    pub refused_config: u64,
    pub refused_load: u64,
    pub refused_forward: u64,
    /// Tokenizer + template loaded and a conversation encoded / refused (any stage).
    pub chat_ok: u64,
    pub chat_refused: u64,
    pub longest_message: usize,
    /// Largest single allocation of any case's model load and forward (bytes).
    pub largest_alloc: usize,
    /// ... of its tokenizer and template load and a render + encode.
    pub largest_chat_alloc: usize,
    /// The model load's last refusal.
    pub last_error: String,
}

/// One fixture as files.
pub struct Base {
    pub name: &'static str,
    files: Vec<(String, Vec<u8>)>,
    /// Its safetensors file names, in order.
    weights: Vec<String>,
    /// Every tensor name of every file (the targets of [`Header::RenameOnto`]).
    tensor_names: Vec<String>,
    /// The pristine files, hard-linked into a case's directory when it leaves them alone.
    pristine: PathBuf,
}

pub struct Bases {
    _dir: tempfile::TempDir,
    pub bases: Vec<Base>,
    /// Where cases are written (emptied before each).
    scratch: PathBuf,
}

impl Bases {
    pub fn new() -> Bases {
        let dir = tempfile::tempdir().unwrap();
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models");
        let tokenizer = ["tokenizer.json", "tokenizer_config.json"].map(|n| {
            (
                n.to_string(),
                std::fs::read(root.join("llama").join(n)).unwrap(),
            )
        });
        let bases = FIXTURES
            .iter()
            .map(|&name| {
                let src = root.join(name);
                let mut files: Vec<(String, Vec<u8>)> = tokenizer.to_vec();
                let mut names: Vec<String> = std::fs::read_dir(&src)
                    .unwrap()
                    .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .filter(|n| n != "generation_config.json" && !n.starts_with("tokenizer"))
                    .collect();
                names.sort();
                for n in names {
                    files.push((n.clone(), std::fs::read(src.join(&n)).unwrap()));
                }
                let pristine = dir.path().join(name);
                std::fs::create_dir(&pristine).unwrap();
                for (n, b) in &files {
                    std::fs::write(pristine.join(n), b).unwrap();
                }
                let weights: Vec<String> = (files.iter().map(|f| f.0.clone()))
                    .filter(|n| n.ends_with(".safetensors"))
                    .collect();
                let tensor_names = (files.iter().filter(|f| f.0.ends_with(".safetensors")))
                    .filter_map(|f| parse_header(&f.1))
                    .flat_map(|(entries, _)| entries.into_iter().map(|e| e.0))
                    .collect();
                Base {
                    name,
                    files,
                    weights,
                    tensor_names,
                    pristine,
                }
            })
            .collect();
        let scratch = dir.path().join("case");
        Bases {
            _dir: dir,
            bases,
            scratch,
        }
    }

    /// Writes the case's directory; its path and total size in bytes.
    pub fn write(&self, case: &Case) -> (PathBuf, usize) {
        let base = &self.bases[case.base % self.bases.len()];
        let mut files: Vec<(String, Cow<'_, [u8]>)> = (base.files.iter())
            .map(|(n, b)| (n.clone(), Cow::Borrowed(b.as_slice())))
            .collect();
        for m in &case.mutations {
            apply(base, &mut files, m);
        }
        let dir = &self.scratch;
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir(dir).unwrap();
        let mut total = 0;
        for (name, bytes) in &files {
            total += bytes.len();
            match bytes {
                Cow::Borrowed(_) => std::fs::hard_link(base.pristine.join(name), dir.join(name)),
                Cow::Owned(b) => std::fs::write(dir.join(name), b),
            }
            .unwrap();
        }
        (dir.clone(), total)
    }
}

impl Default for Bases {
    fn default() -> Self {
        Self::new()
    }
}

// ---------------------------------------------------------------------------------------------
// Mutations.

fn file_mut<'f, 'a>(
    base: &Base,
    files: &'f mut [(String, Cow<'a, [u8]>)],
    file: File,
) -> Option<&'f mut Vec<u8>> {
    let name = match file {
        File::Weights(n) if !base.weights.is_empty() => &base.weights[n % base.weights.len()],
        File::Weights(_) => return None,
        other => other.name(),
    };
    let entry = files.iter_mut().find(|f| f.0 == name)?;
    Some(entry.1.to_mut())
}

fn edit_json(bytes: &mut Vec<u8>, f: impl FnOnce(&mut Json)) {
    if let Ok(mut v) = serde_json::from_slice::<Json>(bytes) {
        f(&mut v);
        *bytes = serde_json::to_vec_pretty(&v).unwrap();
    }
}

fn apply(base: &Base, files: &mut Vec<(String, Cow<'_, [u8]>)>, m: &Mutation) {
    match m {
        Mutation::Field(path, v) => {
            if let Some(b) = file_mut(base, files, File::Config) {
                edit_json(b, |j| set_path(j, path, v.clone()));
            }
        }
        Mutation::Node(file, i, v) => {
            if let Some(b) = file_mut(base, files, *file) {
                edit_json(b, |j| replace_node(j, i.index(count_nodes(j)), v.clone()));
            }
        }
        Mutation::Bytes(file, e) => {
            if let Some(b) = file_mut(base, files, *file) {
                edit_bytes(b, e);
            }
        }
        Mutation::Header(n, h) => {
            if let Some(b) = file_mut(base, files, File::Weights(*n)) {
                edit_header(base, b, h);
            }
        }
        Mutation::Shard(i, name) => {
            if let Some(b) = file_mut(base, files, File::Index) {
                edit_json(b, |j| {
                    if let Some(map) = j.get_mut("weight_map").and_then(Json::as_object_mut)
                        && !map.is_empty()
                    {
                        let k = i.index(map.len());
                        if let Some(v) = map.values_mut().nth(k) {
                            *v = json!(name);
                        }
                    }
                });
            }
        }
        Mutation::TemplateFile(text) => {
            let name = "chat_template.jinja".to_string();
            match files.iter_mut().find(|f| f.0 == name) {
                Some(f) => f.1 = Cow::Owned(text.clone().into_bytes()),
                None => files.push((name, Cow::Owned(text.clone().into_bytes()))),
            }
        }
        Mutation::Template(t) => {
            if let Some(b) = file_mut(base, files, File::TokenizerConfig) {
                edit_json(b, |j| set_path(j, "chat_template", Some(t.clone())));
            }
        }
    }
}

fn edit_header(base: &Base, file: &mut Vec<u8>, h: &Header) {
    if let Header::Len(n) = h {
        if file.len() >= 8 {
            file[..8].copy_from_slice(&n.to_le_bytes());
        }
        return;
    }
    let Some((mut entries, data_start)) = parse_header(file) else {
        return;
    };
    let tensors: Vec<usize> = (0..entries.len())
        .filter(|&i| entries[i].0 != "__metadata__")
        .collect();
    let pick = |i: &proptest::sample::Index| tensors.get(i.index(tensors.len().max(1))).copied();
    let mut twice = None;
    match h {
        Header::Len(_) => unreachable!(),
        Header::Offsets(i, a, b) => {
            if let Some(t) = pick(i) {
                entries[t].1["data_offsets"] = json!([a, b]);
            }
        }
        Header::Overlap(i, j) => {
            if let (Some(t), Some(u)) = (pick(i), pick(j)) {
                entries[t].1["data_offsets"] = entries[u].1["data_offsets"].clone();
            }
        }
        Header::Shape(i, s) => {
            if let Some(t) = pick(i) {
                entries[t].1["shape"] = json!(s);
            }
        }
        Header::Dtype(i, d) => {
            if let Some(t) = pick(i) {
                entries[t].1["dtype"] = json!(d);
            }
        }
        Header::Remove(i) => {
            if let Some(t) = pick(i) {
                entries.remove(t);
            }
        }
        Header::RenameOnto(i, j) => {
            if let Some(t) = pick(i)
                && !base.tensor_names.is_empty()
            {
                entries[t].0 = base.tensor_names[j.index(base.tensor_names.len())].clone();
            }
        }
        Header::Rename(i, s) => {
            if let Some(t) = pick(i) {
                entries[t].0 = s.clone();
            }
        }
        Header::Twice(i) => twice = pick(i),
        Header::Metadata(v) => entries.push(("__metadata__".into(), v.clone())),
    }
    // Written by hand: a name may appear twice.
    let mut text = String::from("{");
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.extend(twice);
    for (k, &e) in order.iter().enumerate() {
        if k > 0 {
            text.push(',');
        }
        text.push_str(&format!("{}:{}", json!(entries[e].0), entries[e].1));
    }
    text.push('}');
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(&file[data_start.min(file.len())..]);
    *file = out;
}

// ---------------------------------------------------------------------------------------------
// Properties.

/// A refusal's message is clear: not empty, not huge, not a caught panic.
fn clear(what: &str, msg: &str, st: &RefCell<Stats>) -> TestCaseResult {
    prop_assert!(
        !msg.trim().is_empty(),
        "{what}: refused with an empty message"
    );
    prop_assert!(
        msg.len() <= MAX_MESSAGE,
        "{what}: a {}-byte message: {}...",
        msg.len(),
        msg.chars().take(300).collect::<String>()
    );
    prop_assert!(!msg.contains("panicked"), "{what}: {msg}");
    let mut s = st.borrow_mut();
    s.longest_message = s.longest_message.max(msg.len());
    Ok(())
}

/// The engine's load (spec, default layer ids, CPU backend), then a forward of 3 tokens:
/// `Err((stage, message))` where it is refused.
fn load_and_run(dir: &Path) -> Result<(), (&'static str, String)> {
    let spec = ModelSpec::from_dir(dir).map_err(|e| ("config", e.to_string()))?;
    let ids = hsx::config::resolve_layer_ids(None, spec.num_layers)
        .map_err(|e| ("config", e.to_string()))?;
    let (recurrent, vocab, hidden) = (
        spec.has_recurrent_layers(),
        spec.vocab_size,
        spec.stream_width(),
    );
    let k = ids.len();
    let opts = CpuOptions {
        capture_layers: ids,
        num_blocks: 4,
        block_size: 16,
        threads: 1,
        num_state_slots: 2,
        output_dtype: OutputDtype::F32,
        reject_bad_states: true,
        bf16_kernel: hsx::kernels::Bf16Kernel::Auto,
    };
    let mut be = CpuBackend::load(dir, spec, opts).map_err(|e| ("load", e.to_string()))?;
    let tokens: Vec<u32> = (0..3u32).map(|t| t % vocab as u32).collect();
    let seqs = [SeqChunk {
        context: Vec::new(),
        start: 0,
        len: 3,
        block_table: vec![0],
        sample: true,
        state_slot: recurrent.then_some(0),
    }];
    let out = be
        .forward(&Batch {
            token_ids: &tokens,
            seqs: &seqs,
        })
        .map_err(|e| ("forward", e.to_string()))?;
    if out.captured.len() != 3 * k * hidden * 4 {
        return Err(("captured", format!("{} bytes", out.captured.len())));
    }
    Ok(())
}

/// The daemon's tokenizer + template load, then a conversation rendered and encoded.
fn chat(dir: &Path) -> Result<(), String> {
    let limits = RenderLimits {
        max_fuel: 200_000,
        max_bytes: RENDER_BYTES,
    };
    let p = Prompter::from_dir(dir)
        .map_err(|e| e.to_string())?
        .with_limits(limits);
    let messages = json!([{"role": "user", "content": "hello there"}]);
    let opts = RenderOptions {
        add_generation_prompt: true,
        ..Default::default()
    };
    p.encode_messages(&messages, &opts)
        .map_err(|e| e.to_string())?;
    p.encode_text("hello").map_err(|e| e.to_string())?;
    Ok(())
}

/// One case: written, loaded, run; `bound`: the largest single allocation allowed beyond
/// four times the directory's size (weights are widened to f32 at most once).
pub fn check(bases: &Bases, case: &Case, bound: usize, st: &RefCell<Stats>) -> TestCaseResult {
    let (dir, size) = bases.write(case);
    if std::env::var_os("HSX_FUZZ_TRACE").is_some() {
        // An abort (a failed allocation) ends the process before proptest can report.
        eprintln!("case: {case:?}");
    }
    LARGEST.store(0, Ordering::Relaxed);
    let model = load_and_run(&dir);
    let largest = LARGEST.swap(0, Ordering::Relaxed);
    let chat = chat(&dir);
    // Encoding a rendered conversation allocates in proportion to the text, which the render
    // bound caps.
    let chat_largest = LARGEST.load(Ordering::Relaxed);
    st.borrow_mut().cases += 1;
    let allowed = bound + 4 * size;
    prop_assert!(
        largest <= allowed,
        "an allocation of {largest} bytes for a {size}-byte directory (model: {model:?})"
    );
    prop_assert!(
        chat_largest <= allowed + 16 * RENDER_BYTES,
        "an allocation of {chat_largest} bytes in the chat path (chat: {chat:?})"
    );
    {
        let mut s = st.borrow_mut();
        s.largest_alloc = s.largest_alloc.max(largest);
        s.largest_chat_alloc = s.largest_chat_alloc.max(chat_largest);
    }
    match model {
        Ok(()) => st.borrow_mut().ran += 1,
        Err((stage, msg)) => {
            prop_assert!(stage != "captured", "{msg}");
            {
                let mut s = st.borrow_mut();
                match stage {
                    "config" => s.refused_config += 1,
                    "load" => s.refused_load += 1,
                    _ => s.refused_forward += 1,
                }
            }
            clear(stage, &msg, st)?;
            st.borrow_mut().last_error = msg;
        }
    }
    match chat {
        Ok(()) => st.borrow_mut().chat_ok += 1,
        Err(msg) => {
            st.borrow_mut().chat_refused += 1;
            clear("chat", &msg, st)?;
        }
    }
    Ok(())
}

/// Runs `cases` cases from `seed`: the statistics, or the (shrunk) failing case.
pub fn run(cases: u32, seed: u64, bound: usize) -> Result<Stats, String> {
    let bases = Bases::new();
    let stats = RefCell::new(Stats::default());
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(seed),
        ..Config::default()
    });
    let result = runner.run(&case(bases.bases.len()), |c| {
        check(&bases, &c, bound, &stats)
    });
    match result {
        Ok(()) => Ok(stats.into_inner()),
        Err(TestError::Fail(why, c)) => Err(format!(
            "{why}\nminimal case: base {}, {:#?}",
            bases.bases[c.base % bases.bases.len()].name,
            c.mutations
        )),
        Err(e) => Err(e.to_string()),
    }
}
