//! `hsx extract`: the embedded engine over a JSON-lines prompt file. Resumable (requests whose
//! file exists are skipped), bad lines reported by number while the rest still runs.

mod arrow_input;
mod fanout;

pub use arrow_input::{Shard, read_dataset};
pub use fanout::prefix_roots;

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde::Deserialize;

use crate::actors::events::Subscription;
use crate::actors::messages::{EventKind, PrefixOutput, Request, RequestId};
use crate::actors::scheduler::SubmitError;
use crate::chat::{Prompter, RenderOptions};
use crate::engine::{Engine, RequestSpec};

/// One input line.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InputLine {
    id: Option<String>,
    token_ids: Option<Vec<i64>>,
    text: Option<String>,
    /// A conversation, rendered with the model's chat template.
    messages: Option<serde_json::Value>,
    tools: Option<serde_json::Value>,
    #[serde(default)]
    add_generation_prompt: bool,
    #[serde(default)]
    max_tokens: u32,
    #[serde(default)]
    include_output_tokens: bool,
}

/// What an extract run did.
#[derive(Debug, Default)]
pub struct ExtractSummary {
    pub completed: usize,
    pub skipped: usize,
    /// (line number, request id, error).
    pub failed: Vec<(usize, String, String)>,
    /// (line number, error) for lines that could not become requests.
    pub bad_lines: Vec<(usize, String)>,
    /// Tokens written to files (rows of every file).
    pub tokens: u64,
    /// Tokens that went through the model (rows sliced from a longer row cost nothing).
    pub tokens_computed: u64,
    pub elapsed: Duration,
}

impl ExtractSummary {
    pub fn ok(&self) -> bool {
        self.failed.is_empty() && self.bad_lines.is_empty()
    }

    pub fn report(&self) -> String {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let mut s = format!(
            "completed {}, skipped (already present) {}, failed {}, bad lines {}; {} tokens written, {} computed, in {:.2}s ({:.0} tokens/s)\n",
            self.completed,
            self.skipped,
            self.failed.len(),
            self.bad_lines.len(),
            self.tokens,
            self.tokens_computed,
            secs,
            self.tokens as f64 / secs
        );
        for (line, err) in &self.bad_lines {
            s += &format!("  line {line}: {err}\n");
        }
        for (line, id, err) in &self.failed {
            s += &format!("  line {line} (id {id}): {err}\n");
        }
        s
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExtractError {
    #[error("cannot read input {path}: {source}")]
    Input {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot read dataset: {0}")]
    Dataset(String),
    #[error("cannot load the tokenizer or chat template: {0}")]
    Prompter(crate::chat::ChatError),
    #[error("the engine stopped before every request finished")]
    EngineStopped,
    #[error("stopped: {0}")]
    DeviceLost(String),
}

/// Parses one line into a request spec; `row` is the 0-based line index (the default id).
fn parse_line(line: &str, row: usize, prompter: &Prompter) -> Result<RequestSpec, String> {
    let input: InputLine = serde_json::from_str(line).map_err(|e| format!("invalid JSON: {e}"))?;
    let given = [
        input.token_ids.is_some(),
        input.text.is_some(),
        input.messages.is_some(),
    ];
    match given.iter().filter(|&&g| g).count() {
        1 => {}
        0 => return Err("missing \"token_ids\" (or \"text\" or \"messages\")".into()),
        _ => return Err("give exactly one of \"token_ids\", \"text\" or \"messages\"".into()),
    }
    let token_ids = if let Some(ids) = input.token_ids {
        to_token_ids(&ids)?
    } else if let Some(text) = input.text {
        prompter.encode_text(&text).map_err(|e| e.to_string())?
    } else {
        let messages = input.messages.unwrap_or_default();
        let opts = RenderOptions {
            add_generation_prompt: input.add_generation_prompt,
            tools: input.tools,
            ..Default::default()
        };
        let (_, ids) = prompter
            .encode_messages(&messages, &opts)
            .map_err(|e| e.to_string())?;
        ids
    };
    Ok(RequestSpec {
        id: input.id.unwrap_or_else(|| row.to_string()),
        token_ids,
        max_tokens: input.max_tokens,
        include_output_tokens: input.include_output_tokens,
    })
}

fn to_token_ids(ids: &[i64]) -> Result<Vec<u32>, String> {
    ids.iter()
        .enumerate()
        .map(|(i, &t)| {
            u32::try_from(t).map_err(|_| format!("token id {t} at position {i} is invalid"))
        })
        .collect()
}

/// One usable input line.
struct Row {
    line_no: usize,
    req: Request,
}

/// Reads the input (a JSONL file, or a `datasets` directory whose row r becomes request
/// `hs_{r}`), keeps the rows of `shard`, and validates them; bad ones go to the summary with
/// their line (JSONL) or row + 1 (dataset) numbers.
fn load_rows(
    engine: &Engine,
    path: &Path,
    opts: &ExtractOptions,
    summary: &mut ExtractSummary,
) -> Result<Vec<Row>, ExtractError> {
    let shard = opts.shard;
    let specs = if path.is_dir() {
        dataset_specs(path, shard)?
    } else {
        let prompter = Prompter::from_dir(&engine.info().model_dir)
            .map_err(ExtractError::Prompter)?
            .with_limits(opts.render_limits);
        jsonl_specs(path, shard, &prompter)?
    };
    let mut rows = Vec::new();
    let mut seen = HashSet::new();
    for (line_no, spec) in specs {
        let req = spec
            .and_then(|spec| engine.request(spec).map_err(|e| e.to_string()))
            .and_then(|req| match seen.insert(req.id.clone()) {
                true => Ok(req),
                false => Err(format!("duplicate id {}", req.id)),
            });
        match req {
            Ok(req) => rows.push(Row { line_no, req }),
            Err(e) => summary.bad_lines.push((line_no, e)),
        }
    }
    Ok(rows)
}

type NumberedSpecs = Vec<(usize, Result<RequestSpec, String>)>;

fn jsonl_specs(
    path: &Path,
    shard: Option<Shard>,
    prompter: &Prompter,
) -> Result<NumberedSpecs, ExtractError> {
    let file = File::open(path).map_err(|source| ExtractError::Input {
        path: path.display().to_string(),
        source,
    })?;
    let lines: Vec<_> = BufReader::new(file).lines().collect();
    let range = shard.map_or(0..lines.len(), |s| s.range(lines.len()));
    Ok(lines
        .into_iter()
        .enumerate()
        .skip(range.start)
        .take(range.len())
        .map(|(row, line)| {
            let spec = line
                .map_err(|e| e.to_string())
                .and_then(|l| parse_line(&l, row, prompter));
            (row + 1, spec)
        })
        .collect())
}

fn dataset_specs(dir: &Path, shard: Option<Shard>) -> Result<NumberedSpecs, ExtractError> {
    let rows = arrow_input::read_dataset(dir, shard).map_err(ExtractError::Dataset)?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let spec = r.input_ids.map(|token_ids| RequestSpec {
                id: format!("hs_{}", r.row),
                token_ids,
                max_tokens: 0,
                include_output_tokens: false,
            });
            (r.row + 1, spec)
        })
        .collect())
}

/// Attaches each prefix row to the row it is sliced from; returns the rows to compute and a
/// map from every sliced row's id to its line and its root's id. Only pure extraction rows
/// (no generated tokens) take part. Rows whose file exists are left out (resume).
fn plan_fanout(
    engine: &Engine,
    rows: Vec<Row>,
    summary: &mut ExtractSummary,
) -> (Vec<Row>, HashMap<RequestId, (usize, RequestId)>) {
    // Invalid rows run alone, so that they fail with their own error and no valid prefix
    // of theirs fails with them.
    let eligible = |r: &Row| {
        r.req.max_tokens == 0 && !r.req.include_output_tokens && engine.validate(&r.req).is_ok()
    };
    let seqs: Vec<&[u32]> = rows
        .iter()
        .map(|r| {
            if eligible(r) {
                &r.req.prompt[..]
            } else {
                &[][..]
            }
        })
        .collect();
    let mut roots = fanout::prefix_roots(&seqs);
    for (i, r) in rows.iter().enumerate() {
        if !eligible(r) {
            roots[i] = None;
        }
    }
    let mut prefixes: HashMap<usize, Vec<PrefixOutput>> = HashMap::new();
    let mut sliced = HashMap::new();
    for (i, r) in rows.iter().enumerate() {
        let Some(root) = roots[i] else { continue };
        if r.req.path.exists() {
            summary.skipped += 1;
            continue;
        }
        sliced.insert(r.req.id.clone(), (r.line_no, rows[root].req.id.clone()));
        prefixes.entry(root).or_default().push(PrefixOutput {
            id: r.req.id.clone(),
            rows: r.req.prompt.len(),
            path: r.req.path.clone(),
        });
    }
    let mut compute = Vec::new();
    for (i, mut r) in rows.into_iter().enumerate() {
        if roots[i].is_some() {
            continue;
        }
        r.req.prefixes = prefixes.remove(&i).unwrap_or_default();
        if r.req.path.exists() && r.req.prefixes.is_empty() {
            summary.skipped += 1;
            continue;
        }
        compute.push(r);
    }
    (compute, sliced)
}

fn progress_bar(total: u64, show: bool) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(total);
    let style = ProgressStyle::with_template(
        "{bar:40} {pos}/{len} tokens  {per_sec}  elapsed {elapsed_precise}  ETA {eta}",
    )
    .expect("static template is valid");
    pb.set_style(style);
    pb
}

/// Requests waiting for their event: computed rows and rows sliced from them.
#[derive(Default)]
struct Outstanding {
    computed: HashMap<RequestId, usize>,
    /// id -> (line, root id)
    sliced: HashMap<RequestId, (usize, RequestId)>,
}

impl Outstanding {
    fn is_empty(&self) -> bool {
        self.computed.is_empty() && self.sliced.is_empty()
    }
}

/// Runs every line of `input` through the engine and waits for all files.
pub async fn run(
    engine: &Engine,
    input: &Path,
    show_progress: bool,
) -> Result<ExtractSummary, ExtractError> {
    let opts = ExtractOptions {
        show_progress,
        ..Default::default()
    };
    run_with(engine, input, &opts).await
}

/// How to run an extraction.
#[derive(Debug, Clone, Default)]
pub struct ExtractOptions {
    pub show_progress: bool,
    /// Only this machine's slice of the input.
    pub shard: Option<Shard>,
    /// Bounds on each chat template render (`[chat]`).
    pub render_limits: crate::chat::RenderLimits,
}

/// Runs the rows of `input` (JSONL file or `datasets` directory) in `opts.shard` through the
/// engine and waits for all files.
pub async fn run_with(
    engine: &Engine,
    input: &Path,
    opts: &ExtractOptions,
) -> Result<ExtractSummary, ExtractError> {
    let show_progress = opts.show_progress;
    let started = Instant::now();
    let mut summary = ExtractSummary::default();
    let rows = load_rows(engine, input, opts, &mut summary)?;
    let (compute, sliced) = plan_fanout(engine, rows, &mut summary);
    let total: usize = compute
        .iter()
        .map(|r| r.req.expected_rows() + r.req.prefixes.iter().map(|p| p.rows).sum::<usize>())
        .sum();
    let pb = progress_bar(total as u64, show_progress);
    let mut events = engine.subscribe(None).await;
    let mut out = Outstanding {
        sliced,
        ..Default::default()
    };
    let window = engine.info().max_waiting.max(1);
    let mut waiter = Waiter {
        events: &mut events,
        summary: &mut summary,
        pb: &pb,
    };
    for row in compute {
        while out.computed.len() >= window {
            waiter.wait_one(&mut out).await?;
        }
        submit(engine, row, &mut waiter, &mut out).await?;
    }
    while !out.is_empty() {
        waiter.wait_one(&mut out).await?;
    }
    pb.finish_and_clear();
    summary.elapsed = started.elapsed();
    Ok(summary)
}

async fn submit(
    engine: &Engine,
    row: Row,
    waiter: &mut Waiter<'_>,
    out: &mut Outstanding,
) -> Result<(), ExtractError> {
    loop {
        let id = row.req.id.clone();
        match engine.submit(row.req.clone()).await {
            Ok(()) => {
                waiter.summary.tokens_computed += row.req.total_forward_tokens() as u64;
                out.computed.insert(id, row.line_no);
                return Ok(());
            }
            Err(SubmitError::Overloaded(_)) if !out.computed.is_empty() => {
                waiter.wait_one(out).await?;
            }
            Err(SubmitError::ShuttingDown) => return Err(ExtractError::EngineStopped),
            Err(SubmitError::DeviceLost(why)) => return Err(ExtractError::DeviceLost(why)),
            Err(e) => {
                waiter.fail(out, row.line_no, &id, e.to_string());
                return Ok(());
            }
        }
    }
}

/// Consumes completion events and keeps the summary.
struct Waiter<'a> {
    events: &'a mut Subscription,
    summary: &'a mut ExtractSummary,
    pb: &'a ProgressBar,
}

impl Waiter<'_> {
    async fn wait_one(&mut self, out: &mut Outstanding) -> Result<(), ExtractError> {
        let ev = self
            .events
            .next()
            .await
            .ok_or(ExtractError::EngineStopped)?;
        let line_no = match out.computed.remove(&ev.id) {
            Some(line) => line,
            None => match out.sliced.remove(&ev.id) {
                Some((line, _)) => line,
                None => return Ok(()),
            },
        };
        match ev.kind {
            EventKind::Completed { num_tokens, .. } => {
                self.summary.completed += 1;
                self.summary.tokens += num_tokens as u64;
                self.pb.inc(num_tokens as u64);
            }
            EventKind::Failed { error } => self.fail(out, line_no, &ev.id, error),
        }
        Ok(())
    }

    /// Records a failed computed row and every row that was to be sliced from it.
    fn fail(&mut self, out: &mut Outstanding, line_no: usize, id: &RequestId, error: String) {
        let orphans: Vec<RequestId> = out
            .sliced
            .iter()
            .filter(|(_, (_, root))| root == id)
            .map(|(k, _)| k.clone())
            .collect();
        for o in orphans {
            if let Some((line, _)) = out.sliced.remove(&o) {
                let why = format!("the row it is a prefix of ({id}) failed: {error}");
                self.summary.failed.push((line, o.to_string(), why));
            }
        }
        self.summary.failed.push((line_no, id.to_string(), error));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_line_plain(line: &str, row: usize) -> Result<RequestSpec, String> {
        parse_line(line, row, &Prompter::default())
    }

    #[test]
    fn parses_token_lines_and_defaults_the_id() {
        let s = parse_line_plain(r#"{"token_ids": [1, 2, 3]}"#, 7).unwrap();
        assert_eq!(s.id, "7");
        assert_eq!(s.token_ids, vec![1, 2, 3]);
        assert_eq!(s.max_tokens, 0);
        let s = parse_line_plain(r#"{"id": "a", "token_ids": [5], "max_tokens": 2}"#, 0).unwrap();
        assert_eq!((s.id.as_str(), s.max_tokens), ("a", 2));
    }

    #[test]
    fn bad_lines_are_explained() {
        let e = parse_line_plain("{not json", 0).unwrap_err();
        assert!(e.contains("invalid JSON"), "{e}");
        let e = parse_line_plain(r#"{"id": "a"}"#, 0).unwrap_err();
        assert!(e.contains("token_ids"), "{e}");
        let e = parse_line_plain(r#"{"text": "hi"}"#, 0).unwrap_err();
        assert!(e.contains("tokenizer.json"), "{e}");
        let e = parse_line_plain(r#"{"messages": []}"#, 0).unwrap_err();
        assert!(e.contains("chat template"), "{e}");
        let e = parse_line_plain(r#"{"token_ids": [1], "text": "x"}"#, 0).unwrap_err();
        assert!(e.contains("exactly one"), "{e}");
        let e = parse_line_plain(r#"{"token_ids": [1, -4]}"#, 0).unwrap_err();
        assert!(e.contains("-4"), "{e}");
        let e = parse_line_plain(r#"{"token_ids": [1], "bogus": 1}"#, 0).unwrap_err();
        assert!(e.contains("bogus"), "{e}");
        let e = parse_line_plain(r#"{"token_ids": [99999999999]}"#, 0).unwrap_err();
        assert!(e.contains("invalid"), "{e}");
    }
}
