//! `hsx extract`: the embedded engine over a JSON-lines prompt file. Resumable (requests whose
//! file exists are skipped), bad lines reported by number while the rest still runs.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde::Deserialize;

use crate::actors::events::Subscription;
use crate::actors::messages::{EventKind, RequestId};
use crate::actors::scheduler::SubmitError;
use crate::engine::{Engine, RequestSpec};

/// One input line.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InputLine {
    id: Option<String>,
    token_ids: Option<Vec<i64>>,
    text: Option<String>,
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
    pub tokens: u64,
    pub elapsed: Duration,
}

impl ExtractSummary {
    pub fn ok(&self) -> bool {
        self.failed.is_empty() && self.bad_lines.is_empty()
    }

    pub fn report(&self) -> String {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let mut s = format!(
            "completed {}, skipped (already present) {}, failed {}, bad lines {}; {} tokens in {:.2}s ({:.0} tokens/s)\n",
            self.completed,
            self.skipped,
            self.failed.len(),
            self.bad_lines.len(),
            self.tokens,
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
    #[error("the engine stopped before every request finished")]
    EngineStopped,
}

/// Parses one line into a request spec; `row` is the 0-based line index (the default id).
fn parse_line(line: &str, row: usize) -> Result<RequestSpec, String> {
    let input: InputLine = serde_json::from_str(line).map_err(|e| format!("invalid JSON: {e}"))?;
    let token_ids = match (input.token_ids, input.text) {
        (Some(ids), _) => to_token_ids(&ids)?,
        (None, Some(_)) => {
            return Err("\"text\" inputs need a tokenizer, which is not supported yet".into());
        }
        (None, None) => return Err("missing \"token_ids\"".into()),
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

/// Tokens of every parseable line (for the progress bar's length).
fn count_tokens(path: &Path) -> Result<u64, ExtractError> {
    let mut total = 0u64;
    for (row, line) in open_lines(path)?.enumerate() {
        if let Ok(spec) = line
            .map_err(|_| ())
            .and_then(|l| parse_line(&l, row).map_err(|_| ()))
        {
            total += spec.token_ids.len() as u64;
        }
    }
    Ok(total)
}

fn open_lines(path: &Path) -> Result<impl Iterator<Item = std::io::Result<String>>, ExtractError> {
    let f = File::open(path).map_err(|source| ExtractError::Input {
        path: path.display().to_string(),
        source,
    })?;
    Ok(BufReader::new(f).lines())
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

/// Requests submitted and not yet answered by an event.
struct Outstanding {
    lines: std::collections::HashMap<RequestId, usize>,
}

/// Runs every line of `input` through the engine and waits for all files.
pub async fn run(
    engine: &Engine,
    input: &Path,
    show_progress: bool,
) -> Result<ExtractSummary, ExtractError> {
    let started = Instant::now();
    let pb = progress_bar(count_tokens(input)?, show_progress);
    let mut events = engine.subscribe(None).await;
    let mut summary = ExtractSummary::default();
    let mut out = Outstanding {
        lines: Default::default(),
    };
    let mut seen = HashSet::new();
    let window = engine.info().max_waiting.max(1);
    for (row, line) in open_lines(input)?.enumerate() {
        let line_no = row + 1;
        let spec = match line
            .map_err(|e| e.to_string())
            .and_then(|l| parse_line(&l, row))
        {
            Ok(s) => s,
            Err(e) => {
                summary.bad_lines.push((line_no, e));
                continue;
            }
        };
        let req = match engine.request(spec) {
            Ok(r) => r,
            Err(e) => {
                summary.bad_lines.push((line_no, e.to_string()));
                continue;
            }
        };
        if !seen.insert(req.id.clone()) {
            summary
                .bad_lines
                .push((line_no, format!("duplicate id {}", req.id)));
            continue;
        }
        if req.path.exists() {
            summary.skipped += 1;
            pb.inc(req.prompt.len() as u64);
            continue;
        }
        while out.lines.len() >= window {
            wait_one(&mut events, &mut out, &mut summary, &pb).await?;
        }
        submit(
            engine,
            req,
            line_no,
            &mut events,
            &mut out,
            &mut summary,
            &pb,
        )
        .await?;
    }
    while !out.lines.is_empty() {
        wait_one(&mut events, &mut out, &mut summary, &pb).await?;
    }
    pb.finish_and_clear();
    summary.elapsed = started.elapsed();
    Ok(summary)
}

async fn submit(
    engine: &Engine,
    req: crate::actors::messages::Request,
    line_no: usize,
    events: &mut Subscription,
    out: &mut Outstanding,
    summary: &mut ExtractSummary,
    pb: &ProgressBar,
) -> Result<(), ExtractError> {
    loop {
        let id = req.id.clone();
        match engine.submit(req.clone()).await {
            Ok(()) => {
                out.lines.insert(id, line_no);
                return Ok(());
            }
            Err(SubmitError::Overloaded(_)) if !out.lines.is_empty() => {
                wait_one(events, out, summary, pb).await?;
            }
            Err(SubmitError::ShuttingDown) => return Err(ExtractError::EngineStopped),
            Err(e) => {
                summary
                    .failed
                    .push((line_no, id.to_string(), e.to_string()));
                return Ok(());
            }
        }
    }
}

async fn wait_one(
    events: &mut Subscription,
    out: &mut Outstanding,
    summary: &mut ExtractSummary,
    pb: &ProgressBar,
) -> Result<(), ExtractError> {
    let ev = events.next().await.ok_or(ExtractError::EngineStopped)?;
    let Some(line_no) = out.lines.remove(&ev.id) else {
        return Ok(());
    };
    match ev.kind {
        EventKind::Completed { num_tokens, .. } => {
            summary.completed += 1;
            summary.tokens += num_tokens as u64;
            pb.inc(num_tokens as u64);
        }
        EventKind::Failed { error } => {
            summary.failed.push((line_no, ev.id.to_string(), error));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_token_lines_and_defaults_the_id() {
        let s = parse_line(r#"{"token_ids": [1, 2, 3]}"#, 7).unwrap();
        assert_eq!(s.id, "7");
        assert_eq!(s.token_ids, vec![1, 2, 3]);
        assert_eq!(s.max_tokens, 0);
        let s = parse_line(r#"{"id": "a", "token_ids": [5], "max_tokens": 2}"#, 0).unwrap();
        assert_eq!((s.id.as_str(), s.max_tokens), ("a", 2));
    }

    #[test]
    fn bad_lines_are_explained() {
        let e = parse_line("{not json", 0).unwrap_err();
        assert!(e.contains("invalid JSON"), "{e}");
        let e = parse_line(r#"{"id": "a"}"#, 0).unwrap_err();
        assert!(e.contains("token_ids"), "{e}");
        let e = parse_line(r#"{"token_ids": [1, -4]}"#, 0).unwrap_err();
        assert!(e.contains("-4"), "{e}");
        let e = parse_line(r#"{"token_ids": [1], "bogus": 1}"#, 0).unwrap_err();
        assert!(e.contains("bogus"), "{e}");
        let e = parse_line(r#"{"token_ids": [99999999999]}"#, 0).unwrap_err();
        assert!(e.contains("invalid"), "{e}");
    }
}
