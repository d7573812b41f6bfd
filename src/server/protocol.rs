//! The Unix socket protocol: one JSON object per line each way.
//!
//! Requests carry `"op"`: `submit`, `abort`, `subscribe`, `status`. Every line the daemon sends
//! carries `"event"`: replies (`accepted`, `rejected`, `abort_requested`, `subscribed`,
//! `status`, `error`) and, after `subscribe`, numbered `completed` / `failed` events, ending
//! with `end` when the daemon stops the stream (it fell behind, or shutdown).

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::Rejection;
use crate::actors::messages::CompletionEvent;

/// `{"op": "submit", ...}`: `token_ids`, `text` (needs the model's tokenizer.json) or
/// `messages` (needs its chat template too).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitOp {
    /// The request id (and file name); generated when absent.
    pub id: Option<String>,
    pub token_ids: Option<Vec<i64>>,
    pub text: Option<String>,
    /// A conversation, rendered with the model's chat template.
    pub messages: Option<Value>,
    /// Render `messages` with the generation prompt (default false: the conversation as is).
    #[serde(default)]
    pub add_generation_prompt: bool,
    /// Tool definitions passed to the chat template.
    pub tools: Option<Value>,
    /// Tokens to generate greedily (default 0: the prompt's hidden states only).
    #[serde(default)]
    pub max_tokens: u32,
    /// Also save the rows of generated tokens (all but the last).
    #[serde(default)]
    pub include_output_tokens: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AbortOp {
    pub id: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubscribeOp {
    /// Replay every journaled event with a larger seq first (0: all of them).
    pub from_seq: Option<u64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusOp {}

#[derive(Debug, Clone)]
pub enum ClientOp {
    Submit(SubmitOp),
    Abort(AbortOp),
    Subscribe(SubscribeOp),
    Status,
}

const OPS: &str = "submit, abort, subscribe, status";

/// Parses one request line, with an error message fit to send back.
pub fn parse_op(line: &str) -> Result<ClientOp, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("invalid JSON: {e}"))?;
    let Value::Object(mut map) = value else {
        return Err("expected a JSON object with an \"op\" field".into());
    };
    let op = match map.remove("op") {
        Some(Value::String(op)) => op,
        Some(other) => return Err(format!("\"op\" must be a string, got {other}")),
        None => return Err(format!("missing \"op\" (one of {OPS})")),
    };
    fn fields<T: for<'de> Deserialize<'de>>(
        op: &str,
        map: Map<String, Value>,
    ) -> Result<T, String> {
        serde_json::from_value(Value::Object(map)).map_err(|e| format!("invalid {op}: {e}"))
    }
    match op.as_str() {
        "submit" => fields(&op, map).map(ClientOp::Submit),
        "abort" => fields(&op, map).map(ClientOp::Abort),
        "subscribe" => fields(&op, map).map(ClientOp::Subscribe),
        "status" => fields::<StatusOp>(&op, map).map(|_| ClientOp::Status),
        other => Err(format!(
            "unknown op {:?} (expected one of {OPS})",
            other.chars().take(64).collect::<String>()
        )),
    }
}

/// Token ids from JSON integers: negative or too large ones are out of range.
pub fn token_ids(ids: &[i64]) -> Result<Vec<u32>, Rejection> {
    ids.iter()
        .enumerate()
        .map(|(i, &t)| {
            u32::try_from(t).map_err(|_| {
                Rejection::TokenOutOfRange(format!("token id {t} at position {i} is out of range"))
            })
        })
        .collect()
}

pub fn accepted(id: &str, path: &std::path::Path) -> Value {
    json!({"event": "accepted", "id": id, "path": path})
}

pub fn rejected(id: Option<&str>, r: &Rejection) -> Value {
    let message = clip(&r.to_string());
    json!({"event": "rejected", "id": id, "reason": r.reason(), "message": message})
}

pub fn error(message: &str) -> Value {
    json!({"event": "error", "message": clip(message)})
}

/// Longest error message sent back (parser errors can quote a whole field of the request).
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// `message`, cut to [`MAX_MESSAGE_BYTES`] (at a char boundary) with a note of its length.
pub fn clip(message: &str) -> String {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message.to_owned();
    }
    let mut end = MAX_MESSAGE_BYTES;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes in all)", &message[..end], message.len())
}

pub fn event(e: &CompletionEvent) -> Value {
    serde_json::to_value(e).unwrap_or_else(|e| error(&format!("cannot encode event: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_op() {
        let ClientOp::Submit(s) =
            parse_op(r#"{"op":"submit","token_ids":[1,2],"id":"a"}"#).unwrap()
        else {
            panic!()
        };
        assert_eq!(s.token_ids, Some(vec![1, 2]));
        assert_eq!(s.max_tokens, 0);
        assert!(matches!(
            parse_op(r#"{"op":"abort","id":"a"}"#),
            Ok(ClientOp::Abort(_))
        ));
        let Ok(ClientOp::Subscribe(s)) = parse_op(r#"{"op":"subscribe","from_seq":3}"#) else {
            panic!()
        };
        assert_eq!(s.from_seq, Some(3));
        assert!(matches!(
            parse_op(r#"{"op":"status"}"#),
            Ok(ClientOp::Status)
        ));
    }

    #[test]
    fn bad_lines_get_clear_errors() {
        let e = parse_op("{not json").unwrap_err();
        assert!(e.contains("invalid JSON"), "{e}");
        let e = parse_op(r#"{"op":"fly"}"#).unwrap_err();
        assert!(e.contains("unknown op"), "{e}");
        let e = parse_op(r#"{"token_ids":[1]}"#).unwrap_err();
        assert!(e.contains("missing \"op\""), "{e}");
        let e = parse_op(r#"{"op":"submit","token_ids":"abc"}"#).unwrap_err();
        assert!(
            e.contains("invalid submit") && e.contains("invalid type"),
            "{e}"
        );
        let e = parse_op(r#"{"op":"submit","token_ids":[1],"colour":1}"#).unwrap_err();
        assert!(e.contains("colour"), "{e}");
        assert!(parse_op("[1,2]").is_err());
        let r = token_ids(&[1, -1]).unwrap_err();
        assert_eq!(r.reason(), "token_out_of_range");
        let long = format!("invalid type: string \"{}\"", "é".repeat(5000));
        let e = error(&long)["message"].as_str().unwrap().to_owned();
        assert!(
            e.len() < MAX_MESSAGE_BYTES + 40 && e.ends_with(" bytes in all)"),
            "{e}"
        );
    }
}
