//! Chat templates rendered the way transformers' `apply_chat_template` does: the Jinja
//! templates wherever transformers keeps them ([`crate::chat_files`]), with `trim_blocks` and
//! `lstrip_blocks`, Python string methods, the helpers transformers adds (`raise_exception`,
//! `strftime_now`), `tojson` as Python's `json.dumps` writes it (`chat_json.rs`), and the
//! special tokens (`bos_token`, `eos_token`, ...) of `tokenizer_config.json` in the context.

use std::path::Path;

use minijinja::value::Kwargs;
use minijinja::{Environment, Error, ErrorKind, Value};
use serde_json::Value as Json;
use thiserror::Error;

#[path = "chat_json.rs"]
mod json;

#[derive(Debug, Error)]
pub enum ChatError {
    #[error("{path}: {message}")]
    Config { path: String, message: String },
    #[error(
        "the model has no chat template (no chat_template.jinja, chat_template.json or \
         chat_template in tokenizer_config.json)"
    )]
    NoTemplate,
    #[error("chat template error: {0}")]
    Render(String),
    /// The render went past a [`RenderLimits`] bound and was stopped.
    #[error("chat template stopped: {0}")]
    Limit(String),
    #[error("text inputs need a tokenizer: the model directory has no tokenizer.json")]
    NoTokenizer,
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}

/// Bounds on one render of a chat template: the template comes with the model directory and
/// runs at every request, so one that loops without end or builds a huge text is stopped with
/// a [`ChatError::Limit`] for that request (config `[chat]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenderLimits {
    /// minijinja fuel: template instructions one render may execute.
    pub max_fuel: u64,
    /// Bytes of rendered text (and of one `tojson` result).
    pub max_bytes: usize,
}

impl RenderLimits {
    /// About 1 s of a looping template; real templates use 25 (Llama 3) to 50 (Qwen3) per
    /// message.
    pub const DEFAULT_FUEL: u64 = 50_000_000;
    /// A rendered chat longer than any model context by far.
    pub const DEFAULT_BYTES: usize = 64 << 20;
}

impl Default for RenderLimits {
    fn default() -> Self {
        Self {
            max_fuel: Self::DEFAULT_FUEL,
            max_bytes: Self::DEFAULT_BYTES,
        }
    }
}

/// Turns text and conversations into token ids, as vLLM does for `prompt` text (the
/// tokenizer's special tokens added) and transformers' `apply_chat_template` does for
/// messages (the rendered template tokenized without adding special tokens).
#[derive(Debug, Default)]
pub struct Prompter {
    tokenizer: Option<tokenizers::Tokenizer>,
    template: Option<ChatTemplate>,
}

impl Prompter {
    /// The tokenizer.json and chat template of a model directory, each when present.
    pub fn from_dir(dir: &Path) -> Result<Self, ChatError> {
        let path = dir.join("tokenizer.json");
        let tokenizer = match path.exists() {
            true => Some(load_tokenizer(&path)?),
            false => None,
        };
        let template = ChatTemplate::from_dir(dir)?;
        Ok(Self {
            tokenizer,
            template,
        })
    }

    /// The same, its chat template bounded by `limits` (default: [`RenderLimits::default`]).
    pub fn with_limits(mut self, limits: RenderLimits) -> Self {
        if let Some(t) = &mut self.template {
            t.set_limits(limits);
        }
        self
    }

    pub fn has_tokenizer(&self) -> bool {
        self.tokenizer.is_some()
    }

    fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>, ChatError> {
        let tok = self.tokenizer.as_ref().ok_or(ChatError::NoTokenizer)?;
        let enc = tok
            .encode(text, special)
            .map_err(|e| ChatError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Token ids of a text prompt.
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>, ChatError> {
        self.encode(text, true)
    }

    /// The rendered conversation and its token ids.
    pub fn encode_messages(
        &self,
        messages: &Json,
        opts: &RenderOptions,
    ) -> Result<(String, Vec<u32>), ChatError> {
        let template = self.template.as_ref().ok_or(ChatError::NoTemplate)?;
        let text = template.render_with(messages, opts)?;
        let ids = self.encode(&text, false)?;
        Ok((text, ids))
    }

    /// Text of token ids, special tokens skipped ("" without a tokenizer).
    pub fn decode(&self, ids: &[u32]) -> String {
        match &self.tokenizer {
            Some(t) if !ids.is_empty() => t.decode(ids, true).unwrap_or_default(),
            _ => String::new(),
        }
    }
}

/// `tokenizer.json`, checked as JSON first; a panic of the tokenizers crate on a malformed
/// one (it has some, e.g. on a broken `decoder`) is an error like any other.
fn load_tokenizer(path: &Path) -> Result<tokenizers::Tokenizer, ChatError> {
    let bad = |e: String| ChatError::Tokenizer(format!("{}: {e}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    serde_json::from_str::<serde::de::IgnoredAny>(&text).map_err(|e| bad(e.to_string()))?;
    let parsed = std::panic::catch_unwind(|| text.parse::<tokenizers::Tokenizer>());
    match parsed {
        Ok(t) => t.map_err(|e| bad(e.to_string())),
        Err(_) => Err(bad("malformed (the tokenizers crate refused it)".into())),
    }
}

/// A model's chat template and the tokens its context names.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// `bos_token`, `eos_token`, ... as strings.
    special_tokens: serde_json::Map<String, Json>,
    /// The templates' names (`default`, `tool_use`, ...), each a template of `env`.
    names: Vec<String>,
    limits: RenderLimits,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// The templates of a model directory ([`crate::chat_files`]); `Ok(None)` when it has
    /// none (text-only models).
    pub fn from_dir(dir: &Path) -> Result<Option<Self>, ChatError> {
        let path = dir.join("tokenizer_config.json");
        let bad = |message: String| ChatError::Config {
            path: path.display().to_string(),
            message,
        };
        let config: Option<Json> = match std::fs::read_to_string(&path) {
            Ok(text) => {
                Some(crate::models::pyjson::from_str(&text).map_err(|e| bad(e.to_string()))?)
            }
            Err(_) => None,
        };
        let Some(templates) = crate::chat_files::find(dir, config.as_ref())? else {
            return Ok(None);
        };
        let special_tokens = config.as_ref().map(special_tokens).unwrap_or_default();
        Self::with_templates(templates, special_tokens)
            .map(Some)
            .map_err(|e| ChatError::Config {
                path: dir.display().to_string(),
                message: e.to_string(),
            })
    }

    /// A template from its source and the special tokens of the context.
    pub fn new(
        source: String,
        special_tokens: serde_json::Map<String, Json>,
    ) -> Result<Self, ChatError> {
        Self::with_templates(vec![("default".into(), source)], special_tokens)
    }

    /// Named templates (`default`, `tool_use`, ...) and the special tokens of the context.
    pub fn with_templates(
        templates: crate::chat_files::Templates,
        special_tokens: serde_json::Map<String, Json>,
    ) -> Result<Self, ChatError> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| ChatError::Render(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        let mut names = Vec::with_capacity(templates.len());
        for (name, source) in templates {
            env.add_template_owned(name.clone(), source)
                .map_err(|e| ChatError::Render(format!("template `{name}`: {e}")))?;
            names.push(name);
        }
        let mut template = Self {
            env,
            special_tokens,
            names,
            limits: RenderLimits::default(),
        };
        template.set_limits(RenderLimits::default());
        Ok(template)
    }

    /// Bounds every later render by `limits`.
    pub fn set_limits(&mut self, limits: RenderLimits) {
        self.limits = limits;
        self.env.set_fuel(Some(limits.max_fuel));
        let max = limits.max_bytes;
        self.env.add_filter("tojson", move |v: Value, kw: Kwargs| {
            json::tojson(v, kw, max)
        });
    }

    pub fn limits(&self) -> RenderLimits {
        self.limits
    }

    /// Renders a conversation (`messages`: a list of `{role, content, ...}` objects).
    pub fn render(
        &self,
        messages: &Json,
        add_generation_prompt: bool,
        tools: Option<&Json>,
    ) -> Result<String, ChatError> {
        let opts = RenderOptions {
            add_generation_prompt,
            tools: tools.cloned(),
            ..Default::default()
        };
        self.render_with(messages, &opts)
    }

    /// Renders with every option of `apply_chat_template` hsx supports.
    pub fn render_with(&self, messages: &Json, opts: &RenderOptions) -> Result<String, ChatError> {
        let mut ctx = self.special_tokens.clone();
        ctx.extend(opts.extra.clone());
        ctx.insert("messages".into(), messages.clone());
        ctx.insert(
            "add_generation_prompt".into(),
            opts.add_generation_prompt.into(),
        );
        ctx.insert("tools".into(), opts.tools.clone().unwrap_or(Json::Null));
        let with_tools = opts.tools.as_ref().is_some_and(|t| !t.is_null());
        let name = crate::chat_files::pick(&self.names, with_tools)?;
        let tmpl = self
            .env
            .get_template(name)
            .map_err(|e| ChatError::Render(e.to_string()))?;
        let mut out = BoundedText {
            buf: Vec::new(),
            max: self.limits.max_bytes,
            over: false,
        };
        let rendered =
            tmpl.render_captured_to(Value::from(minijinja::value::Serde(&ctx)), &mut out);
        if out.over {
            return Err(ChatError::Limit(format!(
                "the rendered chat is over {} bytes (chat.max_render_bytes)",
                self.limits.max_bytes
            )));
        }
        let _ = rendered.map_err(|e| self.classify(&e))?;
        let text = String::from_utf8(out.buf).map_err(|e| ChatError::Render(e.to_string()))?;
        match opts.continue_final_message {
            true => continue_final_message(text, messages),
            false => Ok(text),
        }
    }

    /// A failed render as a [`ChatError`]: a limit it went past, or the template's own error.
    fn classify(&self, e: &Error) -> ChatError {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
        while let Some(c) = cause {
            if let Some(hit) = c.downcast_ref::<LimitHit>() {
                return ChatError::Limit(hit.0.clone());
            }
            if c.downcast_ref::<Error>()
                .is_some_and(|e| e.kind() == ErrorKind::OutOfFuel)
            {
                return ChatError::Limit(format!(
                    "the template ran more than {} steps (chat.max_render_fuel): it loops \
                     without end or does too much work",
                    self.limits.max_fuel
                ));
            }
            cause = c.source();
        }
        ChatError::Render(describe(e))
    }
}

/// The rendered text, refused past `max` bytes (the render then stops with a write error).
struct BoundedText {
    buf: Vec<u8>,
    max: usize,
    over: bool,
}

impl std::io::Write for BoundedText {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if self.buf.len().saturating_add(bytes.len()) > self.max {
            self.over = true;
            return Err(std::io::Error::other("the rendered chat is too large"));
        }
        self.buf.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The cause of an error a bounded filter raised (templates cannot raise it themselves).
#[derive(Debug, Error)]
#[error("{0}")]
struct LimitHit(String);

/// Options of a render, as `apply_chat_template` names them.
#[derive(Debug, Clone, Default)]
pub struct RenderOptions {
    pub add_generation_prompt: bool,
    /// Cut the text right after the last message's content, so generation continues it.
    pub continue_final_message: bool,
    pub tools: Option<Json>,
    /// `chat_template_kwargs`: more variables for the template (e.g. `enable_thinking`).
    pub extra: serde_json::Map<String, Json>,
}

/// transformers' rule: keep the text up to the last occurrence of the final message's
/// (stripped) content.
fn continue_final_message(text: String, messages: &Json) -> Result<String, ChatError> {
    let last = messages
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m.get("content"))
        .and_then(Json::as_str)
        .map(str::trim)
        .ok_or_else(|| {
            ChatError::Render(
                "continue_final_message needs a final message with text content".into(),
            )
        })?;
    match text.rfind(last) {
        Some(at) => Ok(text[..at + last.len()].to_owned()),
        None => Err(ChatError::Render(
            "continue_final_message is set but the final message does not appear in the rendered chat".into(),
        )),
    }
}

/// Every `*_token` entry, as a string (either a plain string or an AddedToken `{content}`).
fn special_tokens(config: &Json) -> serde_json::Map<String, Json> {
    let mut out = serde_json::Map::new();
    let Some(obj) = config.as_object() else {
        return out;
    };
    for (k, v) in obj {
        if !k.ends_with("_token") {
            continue;
        }
        let s = match v {
            Json::String(s) => Some(s.clone()),
            Json::Object(o) => o.get("content").and_then(Json::as_str).map(str::to_owned),
            _ => None,
        };
        if let Some(s) = s {
            out.insert(k.clone(), Json::String(s));
        }
    }
    out
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// transformers' `strftime_now(format)`: the local time formatted as Python's `strftime`.
fn strftime_now(format: String) -> Result<Value, Error> {
    use std::fmt::Write;
    let mut out = String::new();
    write!(out, "{}", chrono::Local::now().format(&format)).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: invalid format {format:?}"),
        )
    })?;
    Ok(Value::from(out))
}

/// The error text with its cause chain (minijinja nests the template's own message).
fn describe(e: &Error) -> String {
    match e.kind() {
        ErrorKind::InvalidOperation => e.detail().unwrap_or("invalid operation").to_owned(),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_final_message_cuts_after_the_last_content() {
        let t = ChatTemplate::new(
            "{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>{% endfor %}".into(),
            Default::default(),
        )
        .unwrap();
        let msgs = serde_json::json!([
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": " The ans "}]);
        let opts = RenderOptions {
            continue_final_message: true,
            ..Default::default()
        };
        assert_eq!(
            t.render_with(&msgs, &opts).unwrap(),
            "<user>hi</s><assistant> The ans"
        );
        let mut extra = serde_json::Map::new();
        extra.insert("flag".into(), true.into());
        let t = ChatTemplate::new("{{ flag }}".into(), Default::default()).unwrap();
        let opts = RenderOptions {
            extra,
            ..Default::default()
        };
        assert_eq!(
            t.render_with(&msgs, &opts).unwrap(),
            "True",
            "as Python Jinja prints it"
        );
    }

    #[test]
    fn special_tokens_and_helpers() {
        let t = ChatTemplate::new(
            "{{ strftime_now('%Y') }}|{{ strftime_now('%d %b %Y') | length }}".into(),
            Default::default(),
        )
        .unwrap();
        let year = chrono::Local::now().format("%Y").to_string();
        let msgs = serde_json::json!([]);
        assert_eq!(t.render(&msgs, false, None).unwrap(), format!("{year}|11"));
        let bad = ChatTemplate::new("{{ strftime_now('%Q') }}".into(), Default::default());
        let e = bad
            .unwrap()
            .render(&msgs, false, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("strftime_now"), "{e}");
        let cfg = serde_json::json!({"bos_token": {"content": "<s>"}, "eos_token": "</s>", "x": 1});
        let t = special_tokens(&cfg);
        assert_eq!(t["bos_token"], "<s>");
        assert_eq!(t["eos_token"], "</s>");
        assert_eq!(t.len(), 2);
    }
}
