//! transformers' `tojson` filter: Python's `json.dumps(x, ensure_ascii=False, indent=None,
//! separators=None, sort_keys=False)` with those keyword arguments (minijinja's built-in filter
//! is compact, escapes HTML and takes no `ensure_ascii`, which GLM's and many other released
//! templates pass), its output bounded in size.

use std::fmt::Write;

use minijinja::value::Kwargs;
use minijinja::{Error, ErrorKind, Value};
use serde_json::Value as Json;

use super::LimitHit;

/// `json.dumps`' formatting options, and the bound on what it writes.
struct Dump {
    indent: Option<usize>,
    ensure_ascii: bool,
    sort_keys: bool,
    /// Between two items, and between a key and its value.
    item_sep: String,
    key_sep: String,
    max: usize,
}

/// The filter: `value | tojson(...)` as transformers renders it; an error past `max` bytes.
pub(super) fn tojson(value: Value, kwargs: Kwargs, max: usize) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let (item_sep, key_sep) = match separators {
        Some(s) => match <[String; 2]>::try_from(s) {
            Ok([item, key]) => (item, key),
            Err(s) => {
                let msg = format!("tojson: separators must be 2 strings, not {}", s.len());
                return Err(Error::new(ErrorKind::InvalidOperation, msg));
            }
        },
        // Python's defaults: no space after ',' once lines are indented.
        None => (
            if indent.is_some() { "," } else { ", " }.into(),
            ": ".into(),
        ),
    };
    let json: Json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let dump = Dump {
        indent,
        ensure_ascii,
        sort_keys,
        item_sep,
        key_sep,
        max,
    };
    let mut out = String::new();
    if !dump.write(&json, 0, &mut out) {
        let msg = format!("tojson wrote over {max} bytes (chat.max_render_bytes)");
        return Err(Error::new(ErrorKind::InvalidOperation, msg.clone()).with_source(LimitHit(msg)));
    }
    Ok(Value::from_safe_string(out))
}

impl Dump {
    /// Writes `v` into `out`; false (stopping early) once `out` would grow past `max` bytes.
    fn write(&self, v: &Json, depth: usize, out: &mut String) -> bool {
        match v {
            Json::Array(items) if !items.is_empty() => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if (i > 0 && !self.push(out, &self.item_sep))
                        || !self.newline(out, depth + 1)
                        || !self.write(item, depth + 1, out)
                    {
                        return false;
                    }
                }
                self.newline(out, depth) && self.push(out, "]")
            }
            Json::Object(map) if !map.is_empty() => {
                let mut entries: Vec<_> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (k, item)) in entries.into_iter().enumerate() {
                    if (i > 0 && !self.push(out, &self.item_sep))
                        || !self.newline(out, depth + 1)
                        || !self.string(k, out)
                        || !self.push(out, &self.key_sep)
                        || !self.write(item, depth + 1, out)
                    {
                        return false;
                    }
                }
                self.newline(out, depth) && self.push(out, "}")
            }
            Json::String(s) => self.string(s, out),
            other => self.push(out, &other.to_string()),
        }
    }

    /// A line break and `depth` indents, when indenting.
    fn newline(&self, out: &mut String, depth: usize) -> bool {
        match self.indent {
            Some(n) => {
                let pad = n.saturating_mul(depth);
                if out.len().saturating_add(pad) >= self.max {
                    return false;
                }
                out.push('\n');
                out.push_str(&" ".repeat(pad));
                true
            }
            None => true,
        }
    }

    fn push(&self, out: &mut String, s: &str) -> bool {
        out.push_str(s);
        out.len() <= self.max
    }

    /// A JSON string as Python escapes it: `"`, `\`, control characters (`\n`, `\r`, `\t`,
    /// `\b`, `\f`, else `\u00XX`), and with `ensure_ascii` every character outside ' '..='~'
    /// as `\uXXXX` (UTF-16 surrogate pairs past U+FFFF), lowercase hex.
    fn string(&self, s: &str, out: &mut String) -> bool {
        // Escaping at most sextuples a byte.
        if out.len().saturating_add(s.len()) > self.max {
            return false;
        }
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !(' '..='~').contains(&c)) => {
                    for unit in c.encode_utf16(&mut [0; 2]) {
                        let _ = write!(out, "\\u{unit:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        self.push(out, "\"")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dumps(v: &Json, kwargs: &[(&str, Value)]) -> String {
        let kw = Kwargs::from_iter(kwargs.iter().map(|(k, v)| (*k, v.clone())));
        let out = tojson(Value::from(minijinja::value::Serde(v)), kw, 1 << 20).unwrap();
        out.as_str().unwrap().to_owned()
    }

    fn sample() -> Json {
        serde_json::json!({"b": [1, 2.5, null, true], "a": {"c": "éé ☃ 😀 \u{7f}\u{1}\n\"\\"},
            "d": [], "e": {}})
    }

    /// The strings are Python 3's `json.dumps` of the same value with the same arguments.
    #[test]
    fn writes_what_python_json_dumps_writes() {
        let v = sample();
        assert_eq!(
            dumps(&v, &[]),
            "{\"b\": [1, 2.5, null, true], \"a\": {\"c\": \"éé ☃ 😀 \u{7f}\\u0001\\n\\\"\\\\\"}, \"d\": [], \"e\": {}}"
        );
        assert_eq!(
            dumps(&v, &[("ensure_ascii", Value::from(true))]),
            r#"{"b": [1, 2.5, null, true], "a": {"c": "\u00e9\u00e9 \u2603 \ud83d\ude00 \u007f\u0001\n\"\\"}, "d": [], "e": {}}"#
        );
        let compact = Value::from(vec![",", ":"]);
        assert_eq!(
            dumps(
                &v,
                &[
                    ("sort_keys", Value::from(true)),
                    ("separators", compact),
                    ("ensure_ascii", Value::from(true)),
                ]
            ),
            r#"{"a":{"c":"\u00e9\u00e9 \u2603 \ud83d\ude00 \u007f\u0001\n\"\\"},"b":[1,2.5,null,true],"d":[],"e":{}}"#
        );
        let v = serde_json::json!({"a": [1], "b": {}});
        assert_eq!(
            dumps(&v, &[("indent", Value::from(2))]),
            "{\n  \"a\": [\n    1\n  ],\n  \"b\": {}\n}"
        );
        let v = serde_json::json!({"a": [1]});
        assert_eq!(
            dumps(&v, &[("indent", Value::from(0))]),
            "{\n\"a\": [\n1\n]\n}"
        );
        assert_eq!(
            dumps(&v, &[("ensure_ascii", Value::from(false))]),
            r#"{"a": [1]}"#
        );
    }

    #[test]
    fn unknown_arguments_and_bad_separators_are_errors() {
        let v = Value::from(1);
        let kw = Kwargs::from_iter([("ensure", Value::from(true))]);
        assert!(tojson(v.clone(), kw, 64).is_err());
        let kw = Kwargs::from_iter([("separators", Value::from(vec![","]))]);
        let e = tojson(v, kw, 64).unwrap_err();
        assert!(e.to_string().contains("separators"), "{e}");
    }

    #[test]
    fn output_past_the_bound_is_an_error_naming_it() {
        let v = Value::from(minijinja::value::Serde(
            serde_json::json!({"k": "x".repeat(100)}),
        ));
        let e = tojson(v, Kwargs::from_iter(Vec::<(&str, Value)>::new()), 64).unwrap_err();
        assert!(e.to_string().contains("max_render_bytes"), "{e}");
    }
}
