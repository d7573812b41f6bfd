//! The inputs of the hostile-model-directory fuzzing (tests/soak/model_dirs.rs): a bundled
//! fixture (dense single file, dense sharded with an index, Gated DeltaNet and Mamba-2 hybrids)
//! with one to four mutations of its files: config.json fields set to hostile values or
//! removed, any node of any JSON file replaced, safetensors headers edited (header length,
//! offsets out of range / overlapping / reversed, shapes that overflow, other dtypes, tensors
//! removed, renamed onto another tensor's name or written twice), a shard index naming absent
//! or outside files, tokenizer files and chat templates made of Jinja fragments, and raw bytes
//! cut, flipped or spliced into any file; and the functions that apply those edits.

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{Index, select};
use serde_json::{Value as Json, json};

use super::words::{FIELDS, WORDS};

/// The files a case may edit (a file the base does not have: the edit is skipped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum File {
    Config,
    Index,
    Tokenizer,
    TokenizerConfig,
    /// The n-th safetensors file of the base (modulo their count).
    Weights(usize),
}

impl File {
    pub fn name(self) -> &'static str {
        match self {
            File::Config => "config.json",
            File::Index => "model.safetensors.index.json",
            File::Tokenizer => "tokenizer.json",
            File::TokenizerConfig => "tokenizer_config.json",
            File::Weights(_) => "model.safetensors",
        }
    }
}

#[derive(Debug, Clone)]
pub enum Bytes {
    /// Keep the first `i` bytes.
    Cut(Index),
    /// XOR one byte.
    Flip(Index, u8),
    /// Insert bytes at a position.
    Splice(Index, Vec<u8>),
}

#[derive(Debug, Clone)]
pub enum Header {
    /// The header length (first 8 bytes).
    Len(u64),
    Offsets(Index, u64, u64),
    /// A tensor's offsets set to another's.
    Overlap(Index, Index),
    Shape(Index, Vec<u64>),
    Dtype(Index, &'static str),
    Remove(Index),
    /// Renamed onto the n-th name of every file of the base (a duplicate, maybe across shards).
    RenameOnto(Index, Index),
    Rename(Index, String),
    /// The entry written twice in the header text.
    Twice(Index),
    Metadata(Json),
}

#[derive(Debug, Clone)]
pub enum Mutation {
    /// A config.json field (dotted for nested ones) set, or removed (`None`).
    Field(&'static str, Option<Json>),
    /// The n-th node (pre-order) of a JSON file replaced, or removed (`None`).
    Node(File, Index, Option<Json>),
    Bytes(File, Bytes),
    Header(usize, Header),
    /// A weight_map entry of the index pointed at another file name.
    Shard(Index, &'static str),
    /// tokenizer_config.json's `chat_template`.
    Template(Json),
    /// A `chat_template.jinja` file (it takes precedence over tokenizer_config.json's).
    TemplateFile(String),
}

#[derive(Debug, Clone)]
pub struct Case {
    /// Index into the bases (modulo their count).
    pub base: usize,
    pub mutations: Vec<Mutation>,
}

/// Sizes: small ones (consistent or not with the weights) and huge ones, so that a
/// config-sized allocation made before the weights are checked is at least gigabytes.
fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0u64..600,
        1 => select(vec![
            1u64 << 31,
            1 << 32,
            1 << 40,
            1_000_000_000_000,
            1 << 62,
            u64::MAX,
            u64::MAX / 3,
        ]),
    ]
}

/// A hostile JSON value: wrong types, zero, negative, huge, fractional, lists and objects.
pub fn value() -> impl Strategy<Value = Json> {
    let leaf = prop_oneof![
        3 => size().prop_map(Json::from),
        1 => Just(Json::Null),
        1 => any::<bool>().prop_map(Json::from),
        2 => select(WORDS).prop_map(Json::from),
        1 => ".{0,12}".prop_map(Json::from),
        1 => select(vec![-1i64, i64::MIN, -64]).prop_map(Json::from),
        2 => select(vec![0.0f64, 0.25, 0.5, 1.5, -1.0, 1e-300, 1e300, 64.0])
            .prop_map(Json::from),
        1 => Just(json!({"__float__": "Infinity"})),
    ];
    leaf.prop_recursive(2, 12, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Json::Array),
            vec(
                (
                    select(vec![
                        "rope_type",
                        "type",
                        "factor",
                        "rope_theta",
                        "name",
                        "template",
                        "low_freq_factor",
                        "high_freq_factor",
                        "original_max_position_embeddings",
                        "quant_method",
                        "weight_block_size",
                        "fmt",
                        "activation_scheme",
                        "format",
                        "config_groups",
                        "weights",
                        "num_bits",
                        "group_size",
                        "symmetric",
                        "strategy"
                    ]),
                    inner
                ),
                0..5
            )
            .prop_map(|kv| Json::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())),
        ]
    })
}

fn bytes_edit() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        any::<Index>().prop_map(Bytes::Cut),
        (any::<Index>(), 1u8..=255).prop_map(|(i, b)| Bytes::Flip(i, b)),
        (
            any::<Index>(),
            prop_oneof![
                vec(any::<u8>(), 1..8),
                select(vec![
                    b"{".to_vec(),
                    b"}".to_vec(),
                    b",".to_vec(),
                    b"\"".to_vec(),
                    b"[[[[[[[[".to_vec(),
                    b"\xff\xfe".to_vec(),
                    b"Infinity".to_vec()
                ]),
            ]
        )
            .prop_map(|(i, b)| Bytes::Splice(i, b)),
    ]
}

const DTYPES: &[&str] = &[
    "F64", "F32", "BF16", "F16", "I8", "U8", "I16", "I32", "I64", "U64", "BOOL", "F8_E4M3",
    "F8_E5M2", "E8M0", "F4", "F6_E2M3", "Q4", "", "f32",
];

fn header_edit() -> impl Strategy<Value = Header> {
    let offset = prop_oneof![0u64..2_000_000, Just(u64::MAX), any::<u64>()];
    prop_oneof![
        prop_oneof![0u64..10_000, Just(u64::MAX), Just(1 << 40), any::<u64>()]
            .prop_map(Header::Len),
        (any::<Index>(), offset.clone(), offset).prop_map(|(i, a, b)| Header::Offsets(i, a, b)),
        (any::<Index>(), any::<Index>()).prop_map(|(i, j)| Header::Overlap(i, j)),
        (any::<Index>(), vec(size(), 0..4)).prop_map(|(i, s)| Header::Shape(i, s)),
        (any::<Index>(), select(DTYPES)).prop_map(|(i, d)| Header::Dtype(i, d)),
        any::<Index>().prop_map(Header::Remove),
        (any::<Index>(), any::<Index>()).prop_map(|(i, j)| Header::RenameOnto(i, j)),
        (any::<Index>(), ".{0,30}").prop_map(|(i, s)| Header::Rename(i, s)),
        any::<Index>().prop_map(Header::Twice),
        value().prop_map(Header::Metadata),
    ]
}

const SHARD_NAMES: &[&str] = &[
    "absent.safetensors",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "../llama/model.safetensors",
    "/etc/passwd",
    "/dev/null",
    ".",
    "",
    "config.json",
    "tokenizer.json",
    "sub/x.safetensors",
];

/// Jinja fragments: valid templates, unclosed tags, deep nesting, unknown helpers, loops.
const JINJA: &[&str] = &[
    "{% for m in messages %}",
    "{% endfor %}",
    "{{ m['role'] }}",
    "{{ m.content }}",
    "{% if add_generation_prompt %}",
    "{% endif %}",
    "{{ bos_token }}",
    "{{ raise_exception('refused') }}",
    "{{ strftime_now('%Y') }}",
    "{% for i in range(100000000) %}x{% endfor %}",
    "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
    "{{ messages | tojson(indent=4) }}",
    "{{ ((((((((((((((((((((((((((((((((",
    "))))}}",
    "{%",
    "%}",
    "{{",
    "}}",
    "{# ",
    "text ",
    "{% set x = messages[0]['content'] | upper %}{{ x }}",
    "{{ tools | length }}",
    "{{ undefined_thing.attr }}",
    "{% include 'other' %}",
    "{{ m['content'].split(' ')[0].strip() }}",
];

fn template() -> impl Strategy<Value = Json> {
    let source = vec(select(JINJA), 0..12).prop_map(|p| p.concat());
    prop_oneof![
        4 => source.clone().prop_map(Json::from),
        1 => (source.clone(), source)
            .prop_map(|(a, b)| json!([{"name": "default", "template": a}, {"name": "tool_use", "template": b}])),
        1 => value(),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let file = prop_oneof![
        Just(File::Config),
        Just(File::Index),
        Just(File::Tokenizer),
        Just(File::TokenizerConfig),
        (0usize..2).prop_map(File::Weights),
    ];
    prop_oneof![
        6 => (select(FIELDS), prop::option::weighted(0.85, value()))
            .prop_map(|(f, v)| Mutation::Field(f, v)),
        3 => (file.clone(), any::<Index>(), prop::option::weighted(0.8, value()))
            .prop_map(|(f, i, v)| Mutation::Node(f, i, v)),
        2 => (file, bytes_edit()).prop_map(|(f, b)| Mutation::Bytes(f, b)),
        5 => (0usize..2, header_edit()).prop_map(|(f, h)| Mutation::Header(f, h)),
        1 => (any::<Index>(), select(SHARD_NAMES)).prop_map(|(i, n)| Mutation::Shard(i, n)),
        2 => template().prop_map(Mutation::Template),
        1 => vec(select(JINJA), 0..12).prop_map(|p| Mutation::TemplateFile(p.concat())),
    ]
}

/// A base and one to four mutations (none in one case of 16: the base loads).
pub fn case(bases: usize) -> impl Strategy<Value = Case> {
    (0..bases, prop_oneof![1 => Just(0usize), 15 => 1usize..5]).prop_flat_map(|(base, n)| {
        vec(mutation(), n).prop_map(move |mutations| Case { base, mutations })
    })
}

// ---------------------------------------------------------------------------------------------
// Applying edits.

pub fn set_path(j: &mut Json, path: &str, v: Option<Json>) {
    let (parent, key) = match path.rsplit_once('.') {
        Some((p, k)) => (j.get_mut(p), k),
        None => (Some(j), path),
    };
    let Some(Json::Object(obj)) = parent else {
        return;
    };
    match v {
        Some(v) => obj.insert(key.to_string(), v),
        None => obj.remove(key),
    };
}

pub fn count_nodes(j: &Json) -> usize {
    1 + match j {
        Json::Array(a) => a.iter().map(count_nodes).sum(),
        Json::Object(o) => o.values().map(count_nodes).sum(),
        _ => 0,
    }
}

/// Replaces (or removes from its parent) the node `n` in pre-order; the root is replaced
/// (by null when removed).
pub fn replace_node(j: &mut Json, n: usize, v: Option<Json>) {
    if n == 0 {
        *j = v.unwrap_or(Json::Null);
        return;
    }
    let mut n = n - 1;
    let children: Vec<(Option<String>, usize)> = match &*j {
        Json::Array(a) => (0..a.len()).map(|i| (None, i)).collect(),
        Json::Object(o) => o.keys().map(|k| (Some(k.clone()), 0)).collect(),
        _ => return,
    };
    for (key, idx) in children {
        let child = match &key {
            Some(k) => &j[k.as_str()],
            None => &j[idx],
        };
        let size = count_nodes(child);
        if n >= size {
            n -= size;
            continue;
        }
        if n == 0 && v.is_none() {
            match (j, key) {
                (Json::Object(o), Some(k)) => {
                    o.remove(&k);
                }
                (Json::Array(a), None) => {
                    a.remove(idx);
                }
                _ => {}
            }
            return;
        }
        let child = match &key {
            Some(k) => &mut j[k.as_str()],
            None => &mut j[idx],
        };
        return replace_node(child, n, v);
    }
}

pub fn edit_bytes(b: &mut Vec<u8>, e: &Bytes) {
    match e {
        Bytes::Cut(i) => b.truncate(i.index(b.len() + 1)),
        Bytes::Flip(i, x) if !b.is_empty() => {
            let k = i.index(b.len());
            b[k] ^= x;
        }
        Bytes::Flip(..) => {}
        Bytes::Splice(i, s) => {
            let k = i.index(b.len() + 1);
            b.splice(k..k, s.iter().copied());
        }
    }
}

/// The header entries (name, JSON) in file order and the data section's start.
pub fn parse_header(file: &[u8]) -> Option<(Vec<(String, Json)>, usize)> {
    let n = usize::try_from(u64::from_le_bytes(file.get(..8)?.try_into().ok()?)).ok()?;
    let text = file.get(8..8usize.checked_add(n)?)?;
    let Json::Object(map) = serde_json::from_slice(text).ok()? else {
        return None;
    };
    Some((map.into_iter().collect(), 8 + n))
}
