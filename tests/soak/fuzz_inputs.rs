//! The inputs of the proptest fuzzing (tests/soak/fuzz.rs): strategies producing JSON *text*
//! (hostile numbers such as 1e309 have no serde_json::Value), requests for each endpoint built
//! field by field, and their mutations.

use std::path::Path;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{Index, select};

const NUMBERS: &[&str] = &[
    "-1",
    "1e309",
    "-1e309",
    "1e-400",
    "4294967295",
    "4294967296",
    "-4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "18446744073709551616",
    "99999999999999999999999999",
    "1.5",
    "-0",
    "0.0",
    "1e2",
    "1E+2",
    "01",
    "+1",
    ".5",
    "0x10",
    "NaN",
    "Infinity",
    "-",
    "1e",
    "2147483648",
    "511",
    "512",
];
/// Raw JSON string tokens, some invalid.
const STRINGS: &[&str] = &[
    r#""\ud800""#,
    r#""\udc00\ud800""#,
    r#""\u0000""#,
    r#""a\u0000b""#,
    r#""\x41""#,
    r#""abc"#,
    r#""\""#,
    r#""\uZZZZ""#,
    "\"tab\there\"",
    "\"\u{7f}\u{85}\u{2028}\"",
    r#""<|eot_id|>""#,
    r#""{{ raise_exception('x') }}""#,
    r#""{% for x in y %}""#,
    r#""\n\n\n""#,
    r#""""#,
];
const KEYS: &[&str] = &[
    "op",
    "id",
    "token_ids",
    "text",
    "messages",
    "max_tokens",
    "include_output_tokens",
    "from_seq",
    "prompt",
    "kv_transfer_params",
    "hidden_states_path",
    "model",
    "n",
    "stream",
    "role",
    "content",
    "tools",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template_kwargs",
    "max_completion_tokens",
    "return_token_ids",
    "__proto__",
    "",
];
const PATH_PARTS: &[&str] = &[
    "..",
    ".",
    "",
    "inside",
    "deeper",
    "in_link",
    "escape",
    "dangling",
    "loop",
    "up",
    "upup",
    "file_link.safetensors",
    "existing.safetensors",
    "adir.safetensors",
    "x.safetensors",
    "a\0b",
    "~",
    "\\..\\x",
    "%2e%2e",
    "..safetensors",
    "...",
];
const IDS: &[&str] = &[
    "../x",
    "/etc/passwd",
    "",
    ".hidden",
    "a/b",
    "a\\b",
    "-",
    "a b",
    "é",
    "a\0",
    "con",
    ":+=@",
];
/// Byte strings spliced into requests: invalid UTF-8 (lone continuation, overlong, surrogate,
/// beyond U+10FFFF, truncated) and JSON punctuation.
const SPLICES: &[&[u8]] = &[
    b"\xff",
    b"\x80",
    b"\xc3\x28",
    b"\xc0\x80",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    b"\xe2\x82",
    b"\"",
    b"\\",
    b"\n",
    b"\0",
    b",",
    b"[",
    b"{",
    b"}",
    b"]",
    b":",
    b"\r\n",
    b"\\u",
];

pub fn q(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

fn pick(values: &'static [&'static str]) -> BoxedStrategy<String> {
    select(values).prop_map(str::to_owned).boxed()
}

fn number() -> BoxedStrategy<String> {
    prop_oneof![
        4 => (0u32..600).prop_map(|n| n.to_string()),
        2 => any::<i64>().prop_map(|n| n.to_string()),
        1 => any::<u64>().prop_map(|n| n.to_string()),
        1 => any::<f64>().prop_map(|f| format!("{f:?}")),
        3 => pick(NUMBERS),
    ]
    .boxed()
}

/// `valid`, or half the time `hostile` when `h` (a request with hostile fields).
fn mix(
    h: bool,
    valid: BoxedStrategy<String>,
    hostile: BoxedStrategy<String>,
) -> BoxedStrategy<String> {
    if h {
        prop_oneof![valid, hostile].boxed()
    } else {
        valid
    }
}

/// `max_tokens`, `n`: small counts.
fn count(h: bool) -> BoxedStrategy<String> {
    mix(h, (0u32..8).prop_map(|n| n.to_string()).boxed(), number())
}

fn text() -> BoxedStrategy<String> {
    "[a-z][a-z ,.]{0,40}".prop_map(|s| q(&s)).boxed()
}

fn string() -> BoxedStrategy<String> {
    prop_oneof![
        4 => "[a-z0-9 _.-]{0,12}".prop_map(|s| q(&s)),
        2 => any::<String>().prop_map(|s| q(&s)),
        1 => (0usize..20_000, any::<char>()).prop_map(|(n, c)| q(&c.to_string().repeat(n))),
        2 => pick(STRINGS),
    ]
    .boxed()
}

fn boolish(h: bool) -> BoxedStrategy<String> {
    mix(
        h,
        any::<bool>().prop_map(|b| b.to_string()).boxed(),
        value(),
    )
}

/// Nesting up to 5,000 deep (serde_json stops at 128), closed or not.
fn deep() -> BoxedStrategy<String> {
    let open = select(&["[", "{\"a\":", "[{\"content\":"][..]);
    (1usize..5000, open, any::<bool>())
        .prop_map(|(depth, open, closed)| {
            let close = match open {
                "[" => "]",
                "{\"a\":" => "}",
                _ => "}]",
            };
            let mut s = open.repeat(depth);
            s.push('1');
            if closed {
                s.push_str(&close.repeat(depth));
            }
            s
        })
        .boxed()
}

fn key() -> BoxedStrategy<String> {
    prop_oneof![4 => pick(KEYS).prop_map(|k| q(&k)), 1 => string()].boxed()
}

/// Any JSON value (and some invalid JSON), at most 4 levels of arrays and objects.
fn value() -> BoxedStrategy<String> {
    let leaf = prop_oneof![
        number(),
        string(),
        pick(&[
            "null", "true", "false", "[]", "{}", "nul", "tru", "[,]", "{,}"
        ]),
    ];
    leaf.prop_recursive(4, 24, 5, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..5).prop_map(|v| format!("[{}]", v.join(","))),
            vec((key(), inner), 0..5).prop_map(|kv| {
                let parts: Vec<String> = kv.into_iter().map(|(k, v)| format!("{k}:{v}")).collect();
                format!("{{{}}}", parts.join(","))
            }),
        ]
    })
    .boxed()
}

fn list(items: BoxedStrategy<String>, len: std::ops::Range<usize>) -> BoxedStrategy<String> {
    vec(items, len)
        .prop_map(|v| format!("[{}]", v.join(",")))
        .boxed()
}

/// Token ids: valid ones (below the fixture's vocabulary of 512), or beyond i64/u32, negative,
/// floats, 1e309, 3,000 of them, deep lists.
fn tokens(h: bool) -> BoxedStrategy<String> {
    let valid = list((0u32..512).prop_map(|n| n.to_string()).boxed(), 1..24);
    let hostile = prop_oneof![
        4 => list(number(), 0..24),
        1 => (1usize..3000).prop_map(|n| format!("[{}]", vec!["7"; n].join(","))),
        1 => deep(),
        1 => value(),
    ];
    mix(h, valid, hostile.boxed())
}

fn prompt(h: bool) -> BoxedStrategy<String> {
    let valid = prop_oneof![
        4 => tokens(false),
        1 => list(tokens(false), 1..4),
        1 => text(),
        1 => list(text(), 1..3),
    ];
    let hostile = prop_oneof![
        4 => tokens(true),
        2 => list(tokens(true), 0..4),
        2 => string(),
        1 => list(string(), 0..4),
        1 => pick(&["[]", "[[]]", "[[1],\"a\"]", "[1,[2]]", "null", "{}"]),
        1 => deep(),
    ];
    mix(h, valid.boxed(), hostile.boxed())
}

/// A file path (not JSON): inside the root (relative, absolute, through a symlink inside); or
/// (`h`) with `..`, absolute elsewhere, through symlinks leading out, NUL, a trailing `/`.
pub fn raw_path(h: bool, root: &Path) -> BoxedStrategy<String> {
    let root = root.to_string_lossy().into_owned();
    let dirs = ["", "inside/", "runs/a/", "in_link/", "inside/up/", "./"].map(String::from);
    let r = root.clone();
    let valid = (select(dirs.to_vec()), "[a-z]{1,8}", any::<bool>())
        .prop_map(move |(d, f, abs)| {
            let root = &r;
            let prefix = if abs {
                format!("{root}/")
            } else {
                String::new()
            };
            format!("{prefix}{d}{f}.safetensors")
        })
        .boxed();
    let part = prop_oneof![
        6 => pick(PATH_PARTS),
        2 => "[a-z]{1,8}(\\.safetensors)?",
        1 => any::<String>(),
        1 => Just("a".repeat(300)),
    ];
    let prefix = select(vec![
        String::new(),
        "/".into(),
        "/etc/".into(),
        "./".into(),
        format!("{root}/"),
        format!("{root}/../"),
        format!("{root}/inside/../"),
    ]);
    let suffix = pick(&["", "", "/", ".safetensors", "/.", "/.."]);
    let hostile = (prefix, vec(part, 0..6), suffix)
        .prop_map(|(p, parts, s)| format!("{p}{}{s}", parts.join("/")));
    mix(h, valid, hostile.boxed())
}

/// `hidden_states_path` in a body: a path as above, or not a string at all.
fn path(h: bool, root: &Path) -> BoxedStrategy<String> {
    let hostile = prop_oneof![
        8 => raw_path(true, root).prop_map(|p| q(&p)),
        1 => pick(STRINGS),
        1 => value(),
    ];
    mix(
        h,
        raw_path(false, root).prop_map(|p| q(&p)).boxed(),
        hostile.boxed(),
    )
}

fn messages(h: bool) -> BoxedStrategy<String> {
    let role = pick(&["system", "user", "assistant"]).prop_map(|r| q(&r));
    let message = (role, text()).prop_map(|(r, c)| format!("{{\"role\":{r},\"content\":{c}}}"));
    let valid = list(message.boxed(), 1..4);
    let role = prop_oneof![
        2 => pick(&["system", "user", "assistant", "tool"]).prop_map(|r| q(&r)),
        1 => string(),
        1 => value(),
    ];
    let content = prop_oneof![4 => string(), 1 => value(), 1 => deep()];
    let message = prop_oneof![
        6 => (role, content).prop_map(|(r, c)| format!("{{\"role\":{r},\"content\":{c}}}")),
        1 => value(),
    ];
    let hostile = prop_oneof![8 => list(message.boxed(), 0..5), 1 => value(), 1 => deep()];
    mix(h, valid, hostile.boxed())
}

type Field = (&'static str, BoxedStrategy<String>, f64);

/// A JSON object of `fields` (each present with its probability) in a random order; with
/// hostile fields (`h`) sometimes one more, unknown or repeated.
fn object(h: bool, mut fields: Vec<Field>) -> BoxedStrategy<String> {
    if h {
        fields.push((
            "",
            (key(), value())
                .prop_map(|(k, v)| format!("{k}:{v}"))
                .boxed(),
            0.1,
        ));
    }
    let parts: Vec<BoxedStrategy<Option<String>>> = fields
        .into_iter()
        .filter(|f| f.2 > 0.0)
        .map(|(k, v, p)| {
            // An empty name: `v` is a whole `"name":value` pair.
            let v = v.prop_map(move |v| {
                if k.is_empty() {
                    v
                } else {
                    format!("{}:{v}", q(k))
                }
            });
            if p >= 1.0 {
                v.prop_map(Some).boxed()
            } else {
                prop::option::weighted(p, v).boxed()
            }
        })
        .collect();
    parts
        .prop_map(|parts| parts.into_iter().flatten().collect::<Vec<_>>())
        .prop_shuffle()
        .prop_map(|parts| format!("{{{}}}", parts.join(",")))
        .boxed()
}

fn request_id(h: bool) -> BoxedStrategy<String> {
    let hostile = prop_oneof![
        2 => pick(IDS).prop_map(|s| q(&s)),
        1 => Just(q(&"x".repeat(201))),
        1 => string(),
        1 => number(),
    ];
    let valid = "[a-zA-Z0-9_:-]{1,16}".prop_map(|s| q(&s)).boxed();
    mix(h, valid, hostile.boxed())
}

fn op(h: bool, name: &'static str) -> Field {
    let hostile = prop_oneof![string(), value()].boxed();
    (
        "op",
        mix(h, Just(q(name)).boxed(), hostile),
        if h { 0.95 } else { 1.0 },
    )
}

fn socket_op(h: bool) -> BoxedStrategy<String> {
    // Exactly one prompt source when valid; any of them, any number, when hostile.
    let one = if h { 0.3 } else { 0.0 };
    let submit = |source: Field, extra: Vec<Field>| {
        let mut fields = vec![
            op(h, "submit"),
            ("id", request_id(h), 0.6),
            ("max_tokens", count(h), 0.3),
            ("include_output_tokens", boolish(h), 0.2),
            source,
        ];
        fields.extend(extra);
        object(h, fields)
    };
    prop_oneof![
        4 => submit(("token_ids", tokens(h), 1.0), vec![("text", text(), one)]),
        1 => submit(("text", mix(h, text(), string()), 1.0), vec![("token_ids", tokens(h), one)]),
        1 => submit(("messages", messages(h), 1.0), vec![
            ("add_generation_prompt", boolish(h), 0.3),
            ("tools", value(), one),
            ("token_ids", tokens(h), one),
        ]),
        1 => object(h, vec![op(h, "abort"), ("id", request_id(h), 1.0)]),
        1 => object(h, vec![op(h, "subscribe"), ("from_seq", mix(h, (0u64..100).prop_map(|n| n.to_string()).boxed(), number()), 0.7)]),
        1 => object(h, vec![op(h, "status")]),
    ]
    .boxed()
}

fn kv_params(h: bool, root: &Path) -> BoxedStrategy<String> {
    let valid = object(
        h,
        vec![
            ("hidden_states_path", path(h, root), 0.9),
            ("include_output_tokens", boolish(h), 0.3),
        ],
    );
    mix(h, valid, value())
}

fn model(h: bool) -> BoxedStrategy<String> {
    mix(
        h,
        Just(q("llama")).boxed(),
        prop_oneof![string(), value()].boxed(),
    )
}

fn completion_body(h: bool, root: &Path) -> BoxedStrategy<String> {
    let rare = if h { 0.1 } else { 0.0 };
    object(
        h,
        vec![
            ("model", model(h), 0.3),
            ("prompt", prompt(h), if h { 0.95 } else { 1.0 }),
            ("max_tokens", count(h), 0.6),
            ("return_token_ids", boolish(h), 0.3),
            ("kv_transfer_params", kv_params(h, root), 0.5),
            ("stream", boolish(h), rare),
            ("n", count(h), rare),
            ("temperature", number(), 0.1),
        ],
    )
}

fn chat_body(h: bool, root: &Path) -> BoxedStrategy<String> {
    let rare = if h { 0.1 } else { 0.0 };
    object(
        h,
        vec![
            ("messages", messages(h), if h { 0.95 } else { 1.0 }),
            ("add_generation_prompt", boolish(h), 0.3),
            ("continue_final_message", boolish(h), rare),
            ("tools", value(), rare),
            ("chat_template_kwargs", value(), rare),
            ("model", model(h), 0.3),
            ("max_tokens", count(h), 0.3),
            ("max_completion_tokens", count(h), 0.2),
            ("return_token_ids", boolish(h), 0.2),
            ("kv_transfer_params", kv_params(h, root), 0.4),
            ("stream", boolish(h), rare),
            ("n", count(h), rare),
        ],
    )
}

/// A request for one of the endpoints (a socket line, or a completions or chat body; render
/// takes the chat body): valid, or with hostile fields (`h`).
pub fn request(h: bool, root: &Path) -> BoxedStrategy<String> {
    prop_oneof![
        3 => socket_op(h),
        3 => completion_body(h, root),
        2 => chat_body(h, root),
    ]
    .boxed()
}

#[derive(Debug, Clone)]
enum Mutation {
    Delete(Index),
    Flip(Index, u8),
    Splice(Index, Vec<u8>),
    Truncate(Index),
    Duplicate(Index, Index),
}

fn mutation() -> BoxedStrategy<Mutation> {
    prop_oneof![
        2 => any::<Index>().prop_map(Mutation::Delete),
        2 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        3 => (any::<Index>(), select(SPLICES)).prop_map(|(i, s)| Mutation::Splice(i, s.to_vec())),
        1 => (any::<Index>(), value()).prop_map(|(i, v)| Mutation::Splice(i, v.into_bytes())),
        1 => any::<Index>().prop_map(Mutation::Truncate),
        1 => (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Mutation::Duplicate(a, b)),
    ]
    .boxed()
}

fn mutate(mut b: Vec<u8>, mutations: Vec<Mutation>) -> Vec<u8> {
    for m in mutations {
        let at = |i: &Index, len: usize| i.index(len + 1);
        match m {
            Mutation::Delete(i) if !b.is_empty() => {
                b.remove(i.index(b.len()));
            }
            Mutation::Flip(i, x) if !b.is_empty() => {
                let i = i.index(b.len());
                b[i] ^= x.max(1);
            }
            Mutation::Splice(i, s) => {
                let i = at(&i, b.len());
                b.splice(i..i, s);
            }
            Mutation::Truncate(i) => b.truncate(at(&i, b.len())),
            Mutation::Duplicate(a, c) => {
                let (x, y) = (at(&a, b.len()), at(&c, b.len()));
                let piece = b[x.min(y)..x.max(y)].to_vec();
                b.splice(y..y, piece);
            }
            _ => {}
        }
    }
    b
}

/// One input: (a) arbitrary bytes or JSON, (b) a request, valid or with hostile fields, (c) a
/// valid request mutated (1 to 5 bytes dropped, flipped, duplicated; invalid UTF-8 or JSON
/// spliced in).
pub fn input(root: &Path) -> BoxedStrategy<Vec<u8>> {
    let valid = request(false, root);
    prop_oneof![
        2 => vec(any::<u8>(), 0..256),
        1 => value().prop_map(String::into_bytes),
        2 => valid.clone().prop_map(String::into_bytes),
        4 => request(true, root).prop_map(String::into_bytes),
        3 => (valid, vec(mutation(), 1..6)).prop_map(|(r, m)| mutate(r.into_bytes(), m)),
    ]
    .boxed()
}

/// An input and a file path (checked on its own as well as inside the input's body).
pub fn input_and_path(root: &Path) -> BoxedStrategy<(Vec<u8>, String)> {
    (input(root), raw_path(true, root)).boxed()
}
