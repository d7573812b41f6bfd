//! Hostile-input property fuzzing of the socket protocol parser (`protocol::parse_op` and
//! `protocol::token_ids`), the HTTP completions body parser (`parse_completion_body`) and the
//! custom path check (`paths::resolve_custom_path`). Inputs: random bytes, random JSON values,
//! mutations of valid requests, deep nesting, extreme numbers, hostile paths. The property: no
//! panic, and every refusal carries a non-empty message. Shared by tests/reliability_faults.rs
//! (short CI run) and the soak binary (`fuzz N`, the long run).
#![allow(dead_code)]

use std::path::Path;

use hsx::server::{parse_completion_body, paths::resolve_custom_path, protocol};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Debug, Default, Clone, Copy)]
pub struct FuzzStats {
    pub inputs: u64,
    pub socket_ok: u64,
    pub socket_err: u64,
    pub http_ok: u64,
    pub http_err: u64,
    pub path_ok: u64,
    pub path_err: u64,
}

const TEMPLATES: &[&str] = &[
    r#"{"op":"submit","id":"a","token_ids":[1,2,3]}"#,
    r#"{"op":"submit","text":"hello","max_tokens":2,"include_output_tokens":true}"#,
    r#"{"op":"abort","id":"a"}"#,
    r#"{"op":"subscribe","from_seq":3}"#,
    r#"{"op":"status"}"#,
    r#"{"model":"llama","prompt":[1,2,3],"max_tokens":1,"return_token_ids":true,"kv_transfer_params":{"hidden_states_path":"a/b.safetensors"}}"#,
    r#"{"prompt":[[1,2],[3]],"max_tokens":0,"n":1,"stream":false}"#,
    r#"{"prompt":"text","max_tokens":1}"#,
];

const ATOMS: &[&str] = &[
    "0",
    "-1",
    "1e999",
    "-9223372036854775809",
    "18446744073709551616",
    "4294967296",
    "9223372036854775807",
    "1.5",
    "null",
    "true",
    "\"\"",
    "\"..\"",
    "\"/etc/passwd\"",
    "[]",
    "{}",
    "\"\\ud800\"",
    "\"\\u0000\"",
    "[[[[[[[[",
    "}}}}",
    "\"op\"",
    "\"submit\"",
];

fn random_json(rng: &mut StdRng, depth: usize) -> String {
    match rng.random_range(0..if depth > 4 { 3 } else { 6 }) {
        0 => ATOMS[rng.random_range(0..ATOMS.len())].to_owned(),
        1 => rng.random::<i64>().to_string(),
        2 => format!("{:?}", random_string(rng, 12)),
        3 => format!(
            "[{}]",
            (0..rng.random_range(0..5))
                .map(|_| random_json(rng, depth + 1))
                .collect::<Vec<_>>()
                .join(",")
        ),
        _ => {
            let keys = [
                "op",
                "id",
                "token_ids",
                "text",
                "max_tokens",
                "from_seq",
                "prompt",
                "kv_transfer_params",
                "hidden_states_path",
                "model",
                "n",
                "stream",
                "x",
            ];
            format!(
                "{{{}}}",
                (0..rng.random_range(0..5))
                    .map(|_| format!(
                        "\"{}\":{}",
                        keys[rng.random_range(0..keys.len())],
                        random_json(rng, depth + 1)
                    ))
                    .collect::<Vec<_>>()
                    .join(",")
            )
        }
    }
}

fn random_string(rng: &mut StdRng, max: usize) -> String {
    (0..rng.random_range(0..max))
        .map(|_| match rng.random_range(0..4) {
            0 => '/',
            1 => '.',
            2 => char::from_u32(rng.random_range(0..0x2000)).unwrap_or('x'),
            _ => (b'a' + rng.random_range(0..26u8)) as char,
        })
        .collect()
}

/// One hostile input (bytes; may be invalid UTF-8).
pub fn input(rng: &mut StdRng) -> Vec<u8> {
    match rng.random_range(0..6) {
        0 => (0..rng.random_range(0..64)).map(|_| rng.random()).collect(),
        1 => random_json(rng, 0).into_bytes(),
        2 => {
            let depth = rng.random_range(1..5000);
            let mut s = r#"{"op":"submit","token_ids":"#.to_owned();
            s.push_str(&"[".repeat(depth));
            s.push_str(&"]".repeat(rng.random_range(0..=depth)));
            s.into_bytes()
        }
        3 => {
            let n = ATOMS[rng.random_range(0..ATOMS.len())];
            format!(r#"{{"op":"submit","token_ids":[1,{n},2],"prompt":[{n}],"max_tokens":{n}}}"#)
                .into_bytes()
        }
        _ => {
            let mut b = TEMPLATES[rng.random_range(0..TEMPLATES.len())]
                .as_bytes()
                .to_vec();
            for _ in 0..rng.random_range(1..6) {
                let at = rng.random_range(0..=b.len());
                match rng.random_range(0..4) {
                    0 if at < b.len() => {
                        b.remove(at);
                    }
                    1 if at < b.len() => b[at] = rng.random(),
                    2 => b
                        .splice(at..at, random_json(rng, 3).into_bytes())
                        .for_each(drop),
                    _ => b.insert(at, rng.random()),
                }
            }
            b
        }
    }
}

/// Runs `n` inputs through every parser; panics (the test fails) on a property violation.
pub fn run(n: u64, seed: u64, root: &Path) -> FuzzStats {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut s = FuzzStats::default();
    for _ in 0..n {
        let bytes = input(&mut rng);
        s.inputs += 1;
        // The socket reader refuses invalid UTF-8 before the parser; the parser sees text.
        let text = String::from_utf8_lossy(&bytes);
        match protocol::parse_op(&text) {
            Ok(protocol::ClientOp::Submit(op)) => {
                s.socket_ok += 1;
                if let Some(ids) = op.token_ids {
                    match protocol::token_ids(&ids) {
                        Ok(v) => assert_eq!(v.len(), ids.len()),
                        Err(e) => assert!(!e.to_string().is_empty()),
                    }
                }
            }
            Ok(_) => s.socket_ok += 1,
            Err(e) => {
                assert!(!e.is_empty(), "empty error for {text:?}");
                s.socket_err += 1;
            }
        }
        match parse_completion_body(&bytes) {
            Ok(Some(prompts)) => {
                assert!(
                    prompts
                        .iter()
                        .flatten()
                        .all(|&t| i64::from(t) <= i64::from(u32::MAX))
                );
                s.http_ok += 1;
            }
            Ok(None) => s.http_ok += 1,
            Err(e) => {
                assert!(!e.is_empty(), "empty error for {text:?}");
                s.http_err += 1;
            }
        }
        if rng.random_range(0..8) == 0 {
            let p = random_string(&mut rng, 24);
            match resolve_custom_path(root, &p) {
                Ok(path) => {
                    let canon = std::fs::canonicalize(root).unwrap();
                    assert!(
                        path.starts_with(&canon) && path != canon,
                        "{p:?} -> {path:?}"
                    );
                    assert!(!p.split('/').any(|c| c == ".."), "{p:?} accepted");
                    s.path_ok += 1;
                }
                Err(e) => {
                    assert!(e.contains("refused") || e.contains(':'), "{e}");
                    s.path_err += 1;
                }
            }
        }
    }
    s
}
