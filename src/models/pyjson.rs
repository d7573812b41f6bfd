//! JSON as Python's `json` module reads it: the bare tokens `Infinity`, `-Infinity` and `NaN`
//! are numbers there (`json.dump` writes them by default), so released configs carry them
//! (Nemotron-H: `"time_step_limit": [0.0, Infinity]`). serde_json refuses them and a
//! `serde_json::Value` cannot hold a non-finite number, so a pre-pass rewrites each such token
//! outside strings to `{"__float__": "Infinity"}` (the form [`value_f64`] reads back); nothing
//! inside a string changes.

use std::borrow::Cow;

use serde_json::Value;

const TOKENS: [&str; 3] = ["-Infinity", "Infinity", "NaN"];

/// Parses `text`, accepting Python's non-finite number tokens.
pub fn from_str(text: &str) -> Result<Value, serde_json::Error> {
    serde_json::from_str(&rewrite_non_finite(text))
}

/// `text` with every `Infinity`, `-Infinity` and `NaN` token outside strings replaced by a
/// `{"__float__": ...}` object (borrowed when there is none).
pub fn rewrite_non_finite(text: &str) -> Cow<'_, str> {
    let bytes = text.as_bytes();
    let mut out: Option<String> = None;
    let (mut in_string, mut escaped, mut copied) = (false, false, 0);
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            i += 1;
            continue;
        }
        if b == b'"' {
            in_string = true;
            i += 1;
            continue;
        }
        // Outside strings JSON has no other words than true/false/null, so a match is the token.
        if let Some(token) = TOKENS.iter().find(|t| bytes[i..].starts_with(t.as_bytes())) {
            let o = out.get_or_insert_with(|| String::with_capacity(text.len() + 64));
            o.push_str(&text[copied..i]);
            o.push_str(&format!("{{\"__float__\": \"{token}\"}}"));
            i += token.len();
            copied = i;
            continue;
        }
        i += 1;
    }
    match out {
        None => Cow::Borrowed(text),
        Some(mut o) => {
            o.push_str(&text[copied..]);
            Cow::Owned(o)
        }
    }
}

/// A number, or a `{"__float__": "Infinity" | "-Infinity" | "NaN"}` object; `None` otherwise.
pub fn value_f64(v: &Value) -> Option<f64> {
    if let Some(x) = v.as_f64() {
        return Some(x);
    }
    match v.get("__float__")?.as_str()? {
        "Infinity" | "inf" => Some(f64::INFINITY),
        "-Infinity" | "-inf" => Some(f64::NEG_INFINITY),
        "NaN" | "nan" => Some(f64::NAN),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_tokens_become_floats_and_strings_are_untouched() {
        let text = r#"{"time_step_limit": [0.0, Infinity], "a": -Infinity, "b": NaN,
            "s": "Infinity and NaN \" -Infinity", "t": "\\", "u": [NaN]}"#;
        let v = from_str(text).unwrap();
        let limit = &v["time_step_limit"];
        assert_eq!(value_f64(&limit[0]), Some(0.0));
        assert_eq!(value_f64(&limit[1]), Some(f64::INFINITY));
        assert_eq!(value_f64(&v["a"]), Some(f64::NEG_INFINITY));
        assert!(value_f64(&v["b"]).unwrap().is_nan());
        assert!(value_f64(&v["u"][0]).unwrap().is_nan());
        assert_eq!(v["s"], "Infinity and NaN \" -Infinity");
        assert_eq!(v["t"], "\\");
    }

    #[test]
    fn plain_json_is_borrowed_and_other_words_still_fail() {
        let text = r#"{"a": [1, 2.5, "NaN"], "b": true}"#;
        assert!(matches!(rewrite_non_finite(text), Cow::Borrowed(_)));
        assert!(from_str(r#"{"a": Inf}"#).is_err());
        assert!(from_str(r#"{"a": infinity}"#).is_err());
        assert!(from_str(r#"{"a": NaNa}"#).is_err());
        assert!(from_str("{\"a\": é Infinity}").is_err());
    }
}
