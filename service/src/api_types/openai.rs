//! The OpenAI-compatible routes' bodies as `utoipa` schemas (see [`crate::openai`] for what
//! each field means to forkscore). The request is parsed by hand ([`crate::openai::request`]);
//! this type describes it.

use super::{Options, ScoreResult};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// `POST /v1/chat/completions`. Sampling parameters (`temperature`, `top_p`, `seed`,
/// `max_tokens`, `max_completion_tokens`, `frequency_penalty`, `presence_penalty`, `stop`) and
/// `user`, `metadata`, `store`, `service_tier` are type-checked and change nothing. Refused
/// (400): `stream: true`, `n` other than 1, tools/functions, `logit_bias`, audio.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ChatRequest {
    /// The served model's id (`GET /v1/models`); another is a 404 `model_not_found`.
    pub model: String,
    /// The context: the text of every system, developer and user message, in order, joined by
    /// a blank line.
    #[schema(min_items = 1)]
    pub messages: Vec<ChatMessage>,
    pub response_format: ResponseFormat,
    /// Add `choices[0].logprobs.content`: one entry per field.
    pub logprobs: Option<bool>,
    /// With `logprobs`: the field's most probable choices listed per entry.
    #[schema(minimum = 0, maximum = 20)]
    pub top_logprobs: Option<u64>,
    /// Only 1.
    #[schema(minimum = 1, maximum = 1)]
    pub n: Option<u64>,
    /// Only false.
    pub stream: Option<bool>,
    /// forkscore's scoring options (the probability temperature is
    /// `forkscore_options.temperature`).
    pub forkscore_options: Option<Options>,
    /// Ignored: no token is sampled.
    #[schema(minimum = 0.0, maximum = 2.0)]
    pub temperature: Option<f64>,
    /// Ignored.
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub top_p: Option<f64>,
    /// Ignored.
    pub seed: Option<i64>,
    /// Ignored.
    #[schema(minimum = 1)]
    pub max_tokens: Option<u64>,
    /// Ignored.
    #[schema(minimum = 1)]
    pub max_completion_tokens: Option<u64>,
    /// Ignored.
    #[schema(minimum = -2.0, maximum = 2.0)]
    pub frequency_penalty: Option<f64>,
    /// Ignored.
    #[schema(minimum = -2.0, maximum = 2.0)]
    pub presence_penalty: Option<f64>,
    /// Ignored (a string or a list of strings).
    pub stop: Option<Value>,
    /// Ignored.
    pub user: Option<String>,
    /// Ignored.
    pub metadata: Option<BTreeMap<String, Value>>,
    /// Ignored.
    pub store: Option<bool>,
    /// Ignored.
    pub service_tier: Option<String>,
}

/// One message: `system`, `developer` or `user` (assistant and tool messages are refused).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    pub role: ChatRole,
    pub content: MessageContent,
    pub name: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ChatRole {
    System,
    Developer,
    User,
}

/// A string, or text parts joined by a newline.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<TextPart>),
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TextPart {
    #[serde(rename = "type")]
    pub kind: TextKind,
    pub text: String,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TextKind {
    Text,
}

/// Only `{"type": "json_schema", "json_schema": {...}}`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResponseFormat {
    #[serde(rename = "type")]
    pub kind: JsonSchemaKind,
    pub json_schema: JsonSchemaFormat,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JsonSchemaKind {
    JsonSchema,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaFormat {
    #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub name: String,
    pub description: Option<String>,
    pub strict: Option<bool>,
    /// A JSON Schema object (`{"type": "object", "properties": {...}}`) whose properties are
    /// enums or booleans; local `$ref`s to `$defs` are inlined.
    pub schema: BTreeMap<String, Value>,
}

/// An OpenAI `chat.completion`, plus the `forkscore` extension field.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChatCompletion {
    pub id: String,
    pub object: ChatCompletionObject,
    pub created: u64,
    pub model: String,
    #[schema(min_items = 1, max_items = 1)]
    pub choices: Vec<Choice>,
    pub usage: Usage,
    /// Extension: exactly the `/v1/score` result (per field, per choice probabilities in
    /// `fields.<name>.scores`).
    pub forkscore: ScoreResult,
}

#[derive(Debug, Serialize, ToSchema)]
pub enum ChatCompletionObject {
    #[serde(rename = "chat.completion")]
    ChatCompletion,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Choice {
    pub index: u32,
    pub message: AssistantMessage,
    /// Null unless the request asked for `logprobs`.
    pub logprobs: Option<ChoiceLogprobs>,
    /// Always `stop`.
    pub finish_reason: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AssistantMessage {
    /// Always `assistant`.
    pub role: String,
    /// The decision (the score result's `output`) as a JSON string.
    pub content: String,
    /// Always null.
    pub refusal: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ChoiceLogprobs {
    /// One entry per field, in the schema's order.
    pub content: Vec<TokenLogprob>,
    /// Always null.
    pub refusal: Option<String>,
}

/// One field: `token` is its chosen value as text, `logprob` the log of its probability
/// (-9999.0 for 0).
#[derive(Debug, Serialize, ToSchema)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f64,
    pub bytes: Vec<u8>,
    /// The field's most probable choices, highest first.
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f64,
    pub bytes: Vec<u8>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Usage {
    /// Prompt prefix tokens plus every field row's suffix tokens.
    pub prompt_tokens: u64,
    /// Always 0: nothing is generated.
    pub completion_tokens: u64,
    pub total_tokens: u64,
}

/// `GET /v1/models`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelList {
    /// Always `list`.
    pub object: String,
    pub data: Vec<ModelEntry>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ModelEntry {
    /// The served model's id (provenance `model_id`); the only model `/v1/chat/completions`
    /// accepts.
    pub id: String,
    /// Always `model`.
    pub object: String,
    /// When the server started (Unix seconds).
    pub created: u64,
    /// Always `forkscore`.
    pub owned_by: String,
}

/// An error in OpenAI's shape.
#[derive(Debug, Serialize, ToSchema)]
pub struct OpenAIError {
    pub error: OpenAIErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OpenAIErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: OpenAIErrorType,
    /// The JSON path in the request (null for the whole body).
    pub param: Option<String>,
    /// The rule broken (the service's error kinds, plus `model_not_found`, …).
    pub code: String,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OpenAIErrorType {
    InvalidRequestError,
    ServerError,
}
