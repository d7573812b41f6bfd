//! Issue 6.3 end to end: the proptest inputs of tests/soak/fuzz.rs sent to the real daemon (in
//! process) as socket lines, as bodies of the three HTTP endpoints, and raw HTTP requests with
//! hostile heads (hyper's parser and the body reader). Properties: every socket line gets one
//! reply line, an error or rejection with a message or an acceptance naming a file inside the
//! output root; every HTTP answer is a status line (no connection dropped without one unless
//! hyper refused the head), errors are OpenAI-shaped with a message, 413 only for a body over
//! the limit, never a 500; a completion's file is inside the root and holds token ids below the
//! vocabulary; the daemon answers `/health` and completes a request afterwards.

use crate::common;
use crate::daemon_support;
use crate::fuzz;

use std::path::Path;
use std::time::Duration;

use daemon_support::{TestDaemon, daemon_config, http_raw};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::TestCaseError;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CASES: u32 = 1000;
const VOCAB: u64 = 512;
const BODY_LIMIT: usize = 1 << 20;

fn inside(root: &Path, path: &str) -> bool {
    let p = Path::new(path);
    p.starts_with(root) && !p.components().any(|c| c == std::path::Component::ParentDir)
}

/// The reply's error message if it is a clear one: not empty, at most about 1 KiB (a parser
/// error quoting a long field of the request is cut).
fn message(v: &Value) -> Option<&str> {
    let max = hsx::server::protocol::MAX_MESSAGE_BYTES + 64;
    v["message"]
        .as_str()
        .or(v["error"]["message"].as_str())
        .filter(|m| !m.trim().is_empty() && m.len() <= max)
}

/// A 413 for the body only when it is over the limit (the others: a request longer than the
/// model, the KV cache or the pending-bytes bound take).
fn fair_413(v: &Value, body_len: usize) -> bool {
    let m = message(v).unwrap_or_default();
    !m.is_empty() && (!m.starts_with("request body larger than") || body_len > BODY_LIMIT)
}

#[test]
fn fuzzed_socket_lines_get_one_clear_reply_each() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = rt.block_on(TestDaemon::start(&daemon_config(dir.path())));
    let conn = std::cell::RefCell::new(None::<RawConn>);
    let (accepted, refused) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
    let strategy = fuzz::input(&d.out);
    let result = fuzz::runner(CASES, 61).run(&strategy, |mut line| {
        // One line per case (the in-process fuzz splits lines itself).
        line.retain(|&b| b != b'\n');
        if std::str::from_utf8(&line).is_ok_and(|t| t.trim().is_empty()) {
            return Ok(());
        }
        let reply: Value = rt.block_on(async {
            let taken = conn.take();
            let mut c = match taken {
                Some(c) => c,
                None => RawConn::connect(&d.socket).await,
            };
            c.send_line(&line).await;
            let reply = c.recv(60).await;
            conn.replace(Some(c));
            reply
        });
        let shown = String::from_utf8_lossy(&line[..line.len().min(300)]).into_owned();
        match reply["event"].as_str() {
            Some("error" | "rejected") => {
                prop_assert!(message(&reply).is_some(), "{shown}: {reply}");
                refused.set(refused.get() + 1);
            }
            Some("accepted") => {
                let path = reply["path"].as_str().unwrap_or_default();
                prop_assert!(inside(&d.out, path), "{shown}: {reply}");
                accepted.set(accepted.get() + 1);
            }
            // A subscriber gets events from now on: the next case takes a fresh connection.
            Some("subscribed") => *conn.borrow_mut() = None,
            Some("status" | "abort_requested") => {}
            _ => return Err(TestCaseError::fail(format!("{shown}: reply {reply}"))),
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let (accepted, refused) = (accepted.get(), refused.get());
    eprintln!("{CASES} socket lines: {accepted} accepted, {refused} refused");
    assert!(accepted > 0 && refused > 0);
    rt.block_on(async {
        // Every accepted request ran: its file holds ids below the vocabulary.
        let mut c = RawConn::connect(&d.socket).await;
        c.send_line(br#"{"op":"subscribe","from_seq":0}"#).await;
        assert_eq!(c.recv(10).await["event"], "subscribed");
        let mut completed = 0;
        while completed < accepted {
            let v = c.recv(60).await;
            if v["event"] == "completed" {
                let f = common::HsFile::read(Path::new(v["path"].as_str().unwrap()));
                assert!(f.token_ids.iter().all(|&t| (t as u64) < VOCAB), "{v}");
                completed += 1;
            } else {
                assert_ne!(v["event"], "failed", "{v}");
            }
        }
        still_serving(&d).await;
    });
    rt.block_on(d.stop());
}

/// `/health` answers and a request completes.
async fn still_serving(d: &TestDaemon) {
    assert_eq!(d.get("/health").await.0, 200);
    let (status, v) = d
        .post(
            "/v1/completions",
            &json!({"prompt": [1, 2, 3], "max_tokens": 1}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
}

const ENDPOINTS: &[&str] = &[
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/chat/completions/render",
];

#[test]
fn fuzzed_http_bodies_get_openai_errors_or_files_inside_the_root() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = rt.block_on(TestDaemon::start(&daemon_config(dir.path())));
    let strategy = (select(ENDPOINTS), fuzz::input(&d.out));
    let statuses = std::cell::RefCell::new(std::collections::BTreeMap::<u16, u32>::new());
    let result = fuzz::runner(CASES, 62).run(&strategy, |(endpoint, body)| {
        let (status, text) = rt.block_on(http_raw(d.http, "POST", endpoint, &body));
        *statuses.borrow_mut().entry(status).or_default() += 1;
        let shown = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| TestCaseError::fail(format!("{shown}: {status} {text:?}: {e}")))?;
        match status {
            200 => {
                let ids = v["choices"][0]["prompt_token_ids"]
                    .as_array()
                    .or(v["prompt_token_ids"].as_array())
                    .or(v["token_ids"].as_array());
                for id in ids.into_iter().flatten() {
                    prop_assert!(id.as_u64().is_some_and(|t| t < VOCAB), "{shown}: {v}");
                }
                // Files: per choice (completions) and for the request (both endpoints).
                let choices = v["choices"].as_array().into_iter().flatten();
                let paths: Vec<&str> = choices
                    .chain([&v])
                    .filter_map(|c| c["kv_transfer_params"]["hidden_states_path"].as_str())
                    .collect();
                prop_assert_eq!(paths.is_empty(), endpoint.ends_with("render"), "{}", &v);
                for p in paths {
                    prop_assert!(inside(&d.out, p) && Path::new(p).is_file(), "{shown}: {v}");
                }
            }
            400 | 404 | 503 => prop_assert!(message(&v).is_some(), "{shown}: {status} {v}"),
            413 => prop_assert!(fair_413(&v, body.len()), "{shown}: {status} {v}"),
            _ => return Err(TestCaseError::fail(format!("{shown}: {status} {v}"))),
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let statuses = statuses.into_inner();
    eprintln!("{CASES} HTTP bodies: statuses {statuses:?}");
    assert!(statuses.contains_key(&200) && statuses.contains_key(&400));
    rt.block_on(still_serving(&d));
    rt.block_on(d.stop());
}

/// A raw HTTP/1.1 request: method, target, version, headers (Content-Length right, wrong,
/// negative, huge, twice; chunked with good or broken chunks; a 70 KiB header) and a body.
fn raw_request(root: &Path) -> BoxedStrategy<Vec<u8>> {
    let method = prop_oneof![
        6 => Just("POST"),
        2 => Just("GET"),
        1 => select(&["PUT", "post", "P\0ST", "", "GET GET"][..]),
    ];
    let target = select(
        &[
            "/v1/completions",
            "/v1/chat/completions",
            "/v1/chat/completions/render",
            "/health",
            "/metrics",
            "/v1/models",
            "/../../etc/passwd",
            "/v1/completions?x=%00",
            "*",
            "http://x/v1/completions",
            "",
            "/\u{7f}\u{ff}",
        ][..],
    );
    let version = prop_oneof![
        6 => Just("HTTP/1.1"),
        1 => select(&["HTTP/1.0", "HTTP/2.0", "HTTP/9", "HTTX/1.1", ""][..]),
    ];
    let length = select(
        &[
            "right",
            "none",
            "short",
            "long",
            "-1",
            "1e3",
            "99999999999999999999",
            "twice",
            "chunked",
            "badchunk",
        ][..],
    );
    let extra = select(
        &[
            "",
            "X-A: b\r\n",
            "X-Pad: PAD\r\n",
            "Bad Header\r\n",
            "X-\x01: y\r\n",
        ][..],
    );
    (
        method,
        target,
        version,
        length,
        extra,
        fuzz::request(false, root),
    )
        .prop_map(|(m, t, v, len, extra, body)| {
            let mut head = format!("{m} {t} {v}\r\nHost: x\r\n");
            head.push_str(&extra.replace("PAD", &"a".repeat(70 << 10)));
            let n = body.len();
            let (headers, body) = match len {
                "right" => (format!("Content-Length: {n}\r\n"), body.into_bytes()),
                "none" => (String::new(), body.into_bytes()),
                "short" => (format!("Content-Length: {}\r\n", n / 2), body.into_bytes()),
                "long" => (format!("Content-Length: {}\r\n", n + 10), body.into_bytes()),
                "twice" => (
                    format!("Content-Length: {n}\r\nContent-Length: 3\r\n"),
                    body.into_bytes(),
                ),
                "chunked" => (
                    "Transfer-Encoding: chunked\r\n".into(),
                    format!("{n:x}\r\n{body}\r\n0\r\n\r\n").into_bytes(),
                ),
                "badchunk" => (
                    "Transfer-Encoding: chunked\r\n".into(),
                    format!("zz\r\n{body}\r\n").into_bytes(),
                ),
                other => (format!("Content-Length: {other}\r\n"), body.into_bytes()),
            };
            let mut out = format!("{head}{headers}Connection: close\r\n\r\n").into_bytes();
            out.extend(body);
            out
        })
        .boxed()
}

#[test]
fn raw_http_requests_with_hostile_heads_get_a_status_and_the_daemon_keeps_serving() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = rt.block_on(TestDaemon::start(&daemon_config(dir.path())));
    let statuses = std::cell::RefCell::new(std::collections::BTreeMap::<String, u32>::new());
    let result = fuzz::runner(CASES, 63).run(&raw_request(&d.out), |req| {
        let answer = rt.block_on(async {
            let mut s = tokio::net::TcpStream::connect(d.http).await.unwrap();
            let _ = s.write_all(&req).await;
            // Nothing more is coming: an incomplete request must not be waited for.
            let _ = s.shutdown().await;
            let mut buf = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut buf));
            read.await.map(|_| buf)
        });
        let shown = String::from_utf8_lossy(&req[..req.len().min(300)]).into_owned();
        let answer = answer.map_err(|_| TestCaseError::fail(format!("{shown}: no answer")))?;
        let text = String::from_utf8_lossy(&answer);
        let status = text.get(9..12).unwrap_or("").to_owned();
        prop_assert!(
            answer.is_empty() || (text.starts_with("HTTP/1.") && status.parse::<u16>().is_ok()),
            "{shown}: {text}"
        );
        let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        match status.as_str() {
            // Refused by our handlers (hyper's own refusals have no body): an OpenAI-shaped
            // error with a message.
            s if s >= "400" && !body.is_empty() => {
                let v: Value = serde_json::from_str(body).unwrap_or_default();
                prop_assert!(message(&v).is_some(), "{shown}: {text}");
                prop_assert!(s != "413" || fair_413(&v, req.len()), "{shown}: {text}");
                prop_assert!(s != "500", "{shown}: {text}");
            }
            _ => {}
        }
        *statuses.borrow_mut().entry(status).or_default() += 1;
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    eprintln!("{CASES} raw requests: statuses {:?}", statuses.borrow());
    rt.block_on(still_serving(&d));
    rt.block_on(d.stop());
}

/// A socket connection sending raw bytes (the fuzz lines need not be UTF-8).
struct RawConn {
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::net::unix::OwnedReadHalf>>,
    out: tokio::net::unix::OwnedWriteHalf,
}

impl RawConn {
    async fn connect(socket: &Path) -> RawConn {
        let (rd, out) = tokio::net::UnixStream::connect(socket)
            .await
            .unwrap()
            .into_split();
        let lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(rd));
        RawConn { lines, out }
    }

    async fn send_line(&mut self, line: &[u8]) {
        self.out.write_all(line).await.unwrap();
        self.out.write_all(b"\n").await.unwrap();
    }

    /// The next line as JSON, failing the test after `secs` seconds or at EOF.
    async fn recv(&mut self, secs: u64) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(secs), self.lines.next_line())
            .await
            .expect("a line in time")
            .unwrap()
            .expect("the connection stays open");
        serde_json::from_str(&line).unwrap()
    }
}
