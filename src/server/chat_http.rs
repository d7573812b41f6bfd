//! `/v1/chat/completions` and `/v1/chat/completions/render`: conversations rendered with the
//! model's chat template (as transformers' `apply_chat_template`), then run like a completion;
//! `render` only returns the token ids (speculators' `prepare_data.py` calls it).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::http::{
    ApiError, DEFAULT_MAX_TOKENS, Job, KvTransferParams, ParsedBody, check_common, custom_path,
    read_body, run_prompts, unix_now, usage,
};
use super::{Rejection, Shared};
use crate::chat::RenderOptions;

/// The conversation and how to render it (shared by both endpoints).
#[derive(Debug, Deserialize)]
struct Conversation {
    messages: Value,
    #[serde(default = "yes")]
    add_generation_prompt: bool,
    #[serde(default)]
    continue_final_message: bool,
    tools: Option<Value>,
    #[serde(default)]
    chat_template_kwargs: Map<String, Value>,
}

fn yes() -> bool {
    true
}

impl Conversation {
    fn options(&self) -> Result<RenderOptions, ApiError> {
        if self.add_generation_prompt && self.continue_final_message {
            return Err(ApiError::bad(
                "add_generation_prompt and continue_final_message cannot both be true",
            ));
        }
        if !self.messages.is_array() {
            return Err(ApiError::bad(
                "messages must be a list of {role, content} objects",
            ));
        }
        Ok(RenderOptions {
            add_generation_prompt: self.add_generation_prompt,
            continue_final_message: self.continue_final_message,
            tools: self.tools.clone(),
            extra: self.chat_template_kwargs.clone(),
        })
    }
}

/// Fields of vLLM's chat request that matter here; other OpenAI fields are ignored (greedy).
#[derive(Debug, Deserialize)]
struct ChatRequest {
    #[serde(flatten)]
    conversation: Conversation,
    model: Option<String>,
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
    #[serde(default)]
    return_token_ids: bool,
    kv_transfer_params: Option<KvTransferParams>,
    #[serde(default)]
    stream: bool,
    n: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct RenderRequest {
    #[serde(flatten)]
    conversation: Conversation,
    model: Option<String>,
}

fn parse<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::bad(format!("invalid request: {e}")))
}

/// Parses a `/v1/chat/completions` body (`render`: a `/v1/chat/completions/render` body) as the
/// handler does, up to rendering; for the reliability suite's fuzz test.
pub fn parse_chat_body(bytes: &[u8], render: bool) -> Result<ParsedBody, String> {
    let (conversation, max_tokens, kv) = if render {
        let req: RenderRequest = parse(bytes).map_err(|e| e.message())?;
        (req.conversation, 0, None)
    } else {
        let req: ChatRequest = parse(bytes).map_err(|e| e.message())?;
        let max = req.max_completion_tokens.or(req.max_tokens);
        let kv = req.kv_transfer_params;
        (req.conversation, max.unwrap_or(DEFAULT_MAX_TOKENS), kv)
    };
    let opts = conversation.options().map_err(|e| e.message())?;
    Ok(ParsedBody {
        conversation: Some((conversation.messages, opts)),
        hidden_states_path: kv.and_then(|k| k.hidden_states_path),
        max_tokens,
        ..Default::default()
    })
}

async fn render_ids(shared: &Arc<Shared>, c: Conversation) -> Result<(String, Vec<u32>), ApiError> {
    let opts = c.options()?;
    Ok(shared.render_chat(c.messages, opts).await?)
}

/// `POST /v1/chat/completions/render`: `{"token_ids": [...], "text": "..."}`.
pub(super) async fn render(
    State(shared): State<Arc<Shared>>,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_body(&shared, body).await?;
    let req: RenderRequest = parse(&bytes)?;
    check_common(&shared, req.model.as_deref(), false, None)?;
    let (text, token_ids) = render_ids(&shared, req.conversation).await?;
    Ok(axum::Json(json!({"token_ids": token_ids, "text": text})).into_response())
}

/// `POST /v1/chat/completions`: answered once the file is renamed into place.
pub(super) async fn chat_completions(
    State(shared): State<Arc<Shared>>,
    body: Body,
) -> Result<Response, ApiError> {
    let result = chat(&shared, body).await;
    if let Err(e) = &result
        && let Some(reason) = e.rejection()
    {
        shared.count_rejection(reason);
    }
    result
}

async fn chat(shared: &Arc<Shared>, body: Body) -> Result<Response, ApiError> {
    let bytes = read_body(shared, body).await?;
    let req: ChatRequest = parse(&bytes)?;
    check_common(shared, req.model.as_deref(), req.stream, req.n)?;
    let (_, prompt) = render_ids(shared, req.conversation).await?;
    if prompt.is_empty() {
        return Err(Rejection::EmptyPrompt("the chat template rendered no tokens".into()).into());
    }
    let kv = req.kv_transfer_params.unwrap_or_default();
    let base = shared.new_id("chatcmpl");
    let job = Job {
        base: &base,
        max_tokens: req
            .max_completion_tokens
            .or(req.max_tokens)
            .unwrap_or(DEFAULT_MAX_TOKENS),
        include_output_tokens: kv.include_output_tokens,
        custom_path: custom_path(shared, kv.hidden_states_path.as_deref(), 1)?,
    };
    let prompts = [prompt];
    let done = run_prompts(shared, &prompts, job).await?;
    let d = &done[0];
    let ids = |v: &[u32]| req.return_token_ids.then(|| json!(v));
    Ok(axum::Json(json!({
        "id": base,
        "object": "chat.completion",
        "created": unix_now(),
        "model": shared.engine().info().model_name,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": shared.detokenize(&d.output)},
            "logprobs": null,
            "finish_reason": "length",
            "stop_reason": null,
            "token_ids": ids(&d.output),
        }],
        "usage": usage(&prompts, &done),
        "prompt_token_ids": ids(&prompts[0]),
        "kv_transfer_params": {"hidden_states_path": &d.path},
    }))
    .into_response())
}
