//! Hostile-input fuzzing on proptest (issue 6.3) of the daemon's parsers: the socket protocol
//! (`protocol::parse_op`, then the submit path: `protocol::token_ids`, request ids, the tokenizer
//! and the chat template), the HTTP bodies of `/v1/completions`, `/v1/chat/completions` and
//! `/v1/chat/completions/render` (`parse_completion_body`, `parse_chat_body`) and client-chosen
//! file paths (`paths::resolve_custom_path`, against an output root holding symlinks that lead
//! out, a dangling one, a loop, a file where a directory is expected).
//!
//! Inputs ([`input`], tests/soak/fuzz_inputs.rs): arbitrary bytes; requests for each endpoint
//! built field by field, valid or with hostile values (token ids beyond i64/u32, negative,
//! floats, 1e309, nesting up to 5,000 deep, strings up to 20,000 chars, lone surrogates, `..`,
//! absolute and symlink paths); valid requests mutated (bytes dropped, flipped, duplicated,
//! invalid UTF-8 or JSON spliced in); and a hostile path checked on its own.
//! Properties ([`check`]): no panic; every refusal is an error with a non-empty message, at most
//! about 1 KiB as sent; accepted token ids are the JSON integers given; accepted request ids
//! name a file directly in the output root; accepted custom paths stay inside the root with
//! every existing ancestor a directory inside it (symlinks resolved) and are not symlinks or
//! directories themselves. Shared by tests/reliability_faults.rs (short CI run),
//! tests/reliability_fuzz.rs (the inputs sent to a running daemon) and the soak example
//! (`fuzz --cases N`).
#![allow(dead_code)]

use std::cell::RefCell;
use std::path::{Component, Path, PathBuf};

use hsx::actors::messages::RequestId;
use hsx::chat::{Prompter, RenderOptions};
use hsx::server::paths::resolve_custom_path;
use hsx::server::protocol::{self, ClientOp, SubmitOp};
use hsx::server::{ParsedBody, parse_chat_body, parse_completion_body};
use proptest::prelude::*;
use proptest::test_runner::{
    Config, RngSeed, TestCaseError, TestCaseResult, TestError, TestRunner,
};

#[path = "fuzz_inputs.rs"]
mod inputs;
#[allow(unused_imports)]
pub use inputs::{input, input_and_path, q, raw_path, request};

#[derive(Debug, Default, Clone, Copy)]
pub struct FuzzStats {
    pub cases: u64,
    /// Socket lines: answered `accepted`-like (a request the engine would be given, an abort,
    /// subscribe or status) or refused with a message.
    pub socket_ok: u64,
    pub socket_err: u64,
    /// HTTP bodies (`/v1/completions`, `/v1/chat/completions`, `.../render`), per parse.
    pub http_ok: u64,
    pub http_err: u64,
    pub path_ok: u64,
    pub path_err: u64,
    /// Longest refusal message seen (bytes, before it is cut to about 1 KiB to be sent).
    pub max_error_len: usize,
}

/// The output root the paths are checked against, and the llama fixture's tokenizer and chat
/// template.
pub struct Fixture {
    _dir: tempfile::TempDir,
    pub root: PathBuf,
    prompter: Prompter,
}

impl Fixture {
    pub fn new() -> Fixture {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        let root = dir.path().join("out");
        std::fs::create_dir_all(root.join("inside/deeper")).unwrap();
        std::fs::create_dir_all(root.join("adir.safetensors")).unwrap();
        std::fs::write(root.join("existing.safetensors"), b"x").unwrap();
        symlink("inside", root.join("in_link")).unwrap();
        symlink("../outside", root.join("escape")).unwrap();
        symlink("../outside/not_yet", root.join("dangling")).unwrap();
        symlink("loop", root.join("loop")).unwrap();
        symlink(
            "../outside/f.safetensors",
            root.join("file_link.safetensors"),
        )
        .unwrap();
        symlink("..", root.join("inside/up")).unwrap();
        symlink("../..", root.join("inside/upup")).unwrap();
        let root = std::fs::canonicalize(root).unwrap();
        let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/llama");
        let prompter = Prompter::from_dir(&model).unwrap();
        assert!(prompter.has_tokenizer());
        Fixture {
            _dir: dir,
            root,
            prompter,
        }
    }
}

impl Default for Fixture {
    fn default() -> Self {
        Self::new()
    }
}

// ---------------------------------------------------------------------------------------------
// Properties.

/// A refusal: its message, as the daemon sends it (cut to about 1 KiB), is not empty.
fn refused(stats: &RefCell<FuzzStats>, what: &str, msg: &str) -> Result<(), TestCaseError> {
    let sent = protocol::error(msg);
    let sent = sent["message"].as_str().unwrap_or_default();
    prop_assert!(
        !sent.trim().is_empty(),
        "{what}: refused with an empty message"
    );
    prop_assert!(
        sent.len() <= protocol::MAX_MESSAGE_BYTES + 64,
        "{what}: {} bytes",
        sent.len()
    );
    let mut s = stats.borrow_mut();
    s.max_error_len = s.max_error_len.max(msg.len());
    Ok(())
}

/// The custom path check: refused with a message, or confined to the root.
fn check_path(fx: &Fixture, requested: &str, st: &RefCell<FuzzStats>) -> TestCaseResult {
    let root = &fx.root;
    let path = match resolve_custom_path(root, requested) {
        Err(e) => {
            st.borrow_mut().path_err += 1;
            return refused(st, "hidden_states_path", &e);
        }
        Ok(p) => p,
    };
    st.borrow_mut().path_ok += 1;
    let shown = format!("{requested:?} accepted as {}", path.display());
    prop_assert!(
        path.starts_with(root) && path != *root,
        "{shown}: outside the root"
    );
    prop_assert!(
        path.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_))),
        "{shown}: not normalized"
    );
    prop_assert!(
        !requested.split('/').any(|c| c == ".."),
        "{shown}: has '..'"
    );
    for dir in path
        .ancestors()
        .skip(1)
        .take_while(|a| *a != root.as_path())
    {
        if std::fs::symlink_metadata(dir).is_ok() {
            let real = std::fs::canonicalize(dir);
            prop_assert!(
                real.as_ref()
                    .is_ok_and(|r| r.starts_with(root) && r.is_dir()),
                "{shown}: its parent {} leads to {real:?}",
                dir.display()
            );
        }
    }
    if let Ok(m) = std::fs::symlink_metadata(&path) {
        prop_assert!(
            !m.is_symlink() && !m.is_dir(),
            "{shown}: a symlink or directory"
        );
    }
    Ok(())
}

/// What the socket frontend does with a `submit` before the engine (socket.rs `submit`).
fn socket_submit(fx: &Fixture, s: SubmitOp) -> Result<(String, Vec<u32>), String> {
    let given = [
        s.token_ids.is_some(),
        s.text.is_some(),
        s.messages.is_some(),
    ];
    if given.iter().filter(|&&g| g).count() != 1 {
        return Err("give exactly one of token_ids, text or messages".into());
    }
    let tokens = if let Some(ids) = &s.token_ids {
        let t = protocol::token_ids(ids).map_err(|e| e.to_string())?;
        assert!(t.len() == ids.len() && t.iter().zip(ids).all(|(&a, &b)| i64::from(a) == b));
        t
    } else if let Some(text) = &s.text {
        fx.prompter.encode_text(text).map_err(|e| e.to_string())?
    } else {
        let opts = RenderOptions {
            add_generation_prompt: s.add_generation_prompt,
            tools: s.tools.clone(),
            ..Default::default()
        };
        let messages = s.messages.unwrap_or_default();
        fx.prompter
            .encode_messages(&messages, &opts)
            .map_err(|e| e.to_string())?
            .1
    };
    let id = s.id.unwrap_or_else(|| "req-generated".into());
    RequestId::new(&id).map_err(|e| e.to_string())?;
    Ok((id, tokens))
}

fn check_socket_line(fx: &Fixture, line: &[u8], st: &RefCell<FuzzStats>) -> TestCaseResult {
    let Ok(text) = std::str::from_utf8(line) else {
        // The line reader answers "line is not valid UTF-8"; the parser still gets a look.
        st.borrow_mut().socket_err += 1;
        let _ = protocol::parse_op(&String::from_utf8_lossy(line));
        return Ok(());
    };
    if text.trim().is_empty() {
        return Ok(());
    }
    let outcome = match protocol::parse_op(text) {
        Err(e) => Err(e),
        Ok(ClientOp::Submit(s)) => socket_submit(fx, s).map(|(id, _)| Some(id)),
        Ok(ClientOp::Abort(a)) => RequestId::new(&a.id)
            .map(|_| None)
            .map_err(|e| e.to_string()),
        Ok(ClientOp::Subscribe(_) | ClientOp::Status) => Ok(None),
    };
    match outcome {
        Err(e) => {
            st.borrow_mut().socket_err += 1;
            refused(st, "socket line", &e)
        }
        Ok(id) => {
            st.borrow_mut().socket_ok += 1;
            if let Some(id) = id {
                // The default file: directly in the root, named after the id.
                let file = fx.root.join(format!("{id}.safetensors"));
                prop_assert_eq!(file.parent(), Some(fx.root.as_path()), "id {:?}", id);
                prop_assert!(!id.contains('/') && !id.starts_with('.'), "id {:?}", id);
            }
            Ok(())
        }
    }
}

/// After a body parsed: tokenize or render as the handler does, then check its custom path.
fn check_http_body(
    fx: &Fixture,
    parsed: Result<ParsedBody, String>,
    st: &RefCell<FuzzStats>,
) -> TestCaseResult {
    let body = match parsed {
        Err(e) => {
            st.borrow_mut().http_err += 1;
            return refused(st, "HTTP body", &e);
        }
        Ok(b) => b,
    };
    let mut prompts = body.token_prompts.map_or(0, |p| p.len());
    for text in body.text_prompts.iter().flatten() {
        if let Err(e) = fx.prompter.encode_text(text) {
            refused(st, "text prompt", &e.to_string())?;
        }
        prompts += 1;
    }
    if let Some((messages, opts)) = &body.conversation {
        match fx.prompter.encode_messages(messages, opts) {
            Ok(_) => prompts += 1,
            Err(e) => refused(st, "conversation", &e.to_string())?,
        }
    }
    st.borrow_mut().http_ok += 1;
    if let Some(p) = body.hidden_states_path
        && prompts == 1
    {
        check_path(fx, &p, st)?;
    }
    Ok(())
}

/// Every parser on one input, and the path check on `path`; `Err` on a property violation (a
/// panic fails the case too).
pub fn check(fx: &Fixture, bytes: &[u8], path: &str, st: &RefCell<FuzzStats>) -> TestCaseResult {
    st.borrow_mut().cases += 1;
    check_path(fx, path, st)?;
    // The socket reads lines; each is parsed on its own.
    for line in bytes.split(|&b| b == b'\n') {
        check_socket_line(fx, line, st)?;
    }
    check_http_body(fx, parse_completion_body(bytes), st)?;
    check_http_body(fx, parse_chat_body(bytes, false), st)?;
    check_http_body(fx, parse_chat_body(bytes, true), st)
}

/// A runner for `cases` cases from `seed`, with no failure persistence (the soak example and
/// the CI test report what they ran).
pub fn runner(cases: u32, seed: u64) -> TestRunner {
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(seed),
        ..Config::default()
    })
}

/// Runs `cases` inputs through [`check`]: the statistics, or the (shrunk) failing input.
pub fn run(cases: u32, seed: u64) -> Result<FuzzStats, String> {
    let fx = Fixture::new();
    let stats = RefCell::new(FuzzStats::default());
    let result = runner(cases, seed).run(&input_and_path(&fx.root), |(bytes, path)| {
        check(&fx, &bytes, &path, &stats)
    });
    match result {
        Ok(()) => Ok(stats.into_inner()),
        Err(TestError::Fail(why, (bytes, path))) => Err(format!(
            "{why}\nminimal input ({} bytes): {:?}\npath: {path:?}",
            bytes.len(),
            String::from_utf8_lossy(&bytes[..bytes.len().min(2000)])
        )),
        Err(e) => Err(e.to_string()),
    }
}
