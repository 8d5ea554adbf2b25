//! Chat templates: the checkpoint's own Jinja chat template rendered with minijinja (plus the
//! Python string methods real templates call), or a built-in template of the model's family when
//! the checkpoint ships none.

use minijinja::{Environment, Value as JinjaValue};
use serde::Serialize;

/// Which template a prompt was rendered with (recorded in provenance).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TemplateOrigin {
    /// `chat_template` inside `tokenizer_config.json`.
    TokenizerConfig,
    /// The separate `chat_template.jinja` that transformers 5 writes.
    ChatTemplateFile,
    /// A built-in template of the named family: the checkpoint shipped none.
    BuiltIn { family: Family },
    /// Supplied by the caller.
    Custom,
}

/// The model families; each has a built-in fallback template.
pub use forkscore_seam::Family;

/// The built-in template source of a family.
fn built_in_source(family: Family) -> &'static str {
    match family {
        Family::Qwen2 => QWEN2_TEMPLATE,
        Family::Qwen3 => QWEN3_TEMPLATE,
        Family::Qwen3_5 => QWEN3_5_TEMPLATE,
    }
}

// Built-in fallbacks: the single-turn, tool-free subset of the families' official templates,
// which is all forkscore renders (one system + one user message, generation prompt, no thinking).
const QWEN2_TEMPLATE: &str = r#"{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}{%- else %}{{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}{%- endif %}{%- for message in messages %}{%- if not (message.role == 'system' and loop.first) %}{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"#;
const QWEN3_TEMPLATE: &str = r#"{%- for message in messages %}{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}{%- endif %}"#;
const QWEN3_5_TEMPLATE: &str = r#"{%- for message in messages %}{{- '<|im_start|>' + message.role + '\n' + (message.content | trim) + '<|im_end|>\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- else %}{{- '<think>\n' }}{%- endif %}{%- endif %}"#;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TemplateError {
    #[error("chat template ({origin}) does not compile: {message}")]
    Compile { origin: String, message: String },
    #[error("chat template ({origin}) failed to render: {message}")]
    Render { origin: String, message: String },
}

/// Most minijinja instructions one prompt rendering may execute. The built-in and official
/// Qwen templates use a few thousand for forkscore's two messages.
pub const TEMPLATE_FUEL: u64 = 5_000_000;

/// A chat message.
#[derive(Debug, Clone, Serialize)]
pub struct Message {
    pub role: &'static str,
    pub content: String,
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// SHA-256 of the template source (part of a tokenizer's identity).
    source_sha256: String,
    origin: TemplateOrigin,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl ChatTemplate {
    /// Compile `source`; `bos`/`eos` are the token strings templates may reference.
    pub fn new(
        source: String,
        origin: TemplateOrigin,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<ChatTemplate, TemplateError> {
        let mut env = Environment::new();
        // transformers renders chat templates with trim_blocks and lstrip_blocks on.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<JinjaValue, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_function("strftime_now", |_fmt: String| -> String {
            // Date-stamping templates would make prompts non-reproducible; render a fixed date.
            "01 Jan 2026".to_string()
        });
        let origin_name = format!("{origin:?}");
        let source_sha256 = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(source.as_bytes()));
        env.add_template_owned("chat", source)
            .map_err(|e| TemplateError::Compile {
                origin: origin_name,
                message: e.to_string(),
            })?;
        Ok(ChatTemplate {
            env,
            source_sha256,
            origin,
            bos_token,
            eos_token,
        })
    }

    /// The built-in template of `family`.
    pub fn built_in(family: Family) -> ChatTemplate {
        ChatTemplate::new(
            built_in_source(family).to_string(),
            TemplateOrigin::BuiltIn { family },
            None,
            Some("<|im_end|>".to_string()),
        )
        .unwrap_or_else(|e| unreachable!("built-in template must compile: {e}"))
    }

    /// SHA-256 of the template source.
    pub fn source_sha256(&self) -> &str {
        &self.source_sha256
    }

    pub fn origin(&self) -> &TemplateOrigin {
        &self.origin
    }

    /// The end-of-sequence token text the template was given (`eos_token` of
    /// `tokenizer_config.json`; `<|im_end|>` for a built-in template).
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// Render `messages` with the generation prompt open and thinking disabled.
    pub fn render(&self, messages: &[Message]) -> Result<String, TemplateError> {
        let mut kwargs = serde_json::Map::new();
        kwargs.insert("enable_thinking".into(), serde_json::Value::Bool(false));
        self.render_with(&serde_json::json!(messages), true, &kwargs)
    }

    /// Render any message list (JSON, as transformers' `apply_chat_template` takes it) with
    /// explicit template arguments (`enable_thinking`, …; absent ones stay undefined).
    pub fn render_with(
        &self,
        messages: &serde_json::Value,
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, TemplateError> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| self.render_err(e))?;
        let mut ctx = kwargs.clone();
        ctx.insert("messages".into(), messages.clone());
        ctx.insert("add_generation_prompt".into(), add_generation_prompt.into());
        ctx.insert(
            "bos_token".into(),
            self.bos_token.clone().unwrap_or_default().into(),
        );
        ctx.insert(
            "eos_token".into(),
            self.eos_token.clone().unwrap_or_default().into(),
        );
        tmpl.render(JinjaValue::from_serialize(&ctx))
            .map_err(|e| self.render_err(e))
    }

    fn render_err(&self, e: minijinja::Error) -> TemplateError {
        let mut message = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            message.push_str(&format!(": {s}"));
            src = s.source();
        }
        TemplateError::Render {
            origin: format!("{:?}", self.origin),
            message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs() -> Vec<Message> {
        vec![
            Message {
                role: "system",
                content: "Sys".into(),
            },
            Message {
                role: "user",
                content: " Hello \n".into(),
            },
        ]
    }

    #[test]
    fn built_in_templates_render_the_documented_shapes() {
        let q2 = ChatTemplate::built_in(Family::Qwen2)
            .render(&msgs())
            .unwrap();
        assert_eq!(q2, "<|im_start|>system\nSys<|im_end|>\n<|im_start|>user\n Hello \n<|im_end|>\n<|im_start|>assistant\n");
        let q3 = ChatTemplate::built_in(Family::Qwen3)
            .render(&msgs())
            .unwrap();
        assert!(
            q3.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
            "{q3:?}"
        );
        let q35 = ChatTemplate::built_in(Family::Qwen3_5)
            .render(&msgs())
            .unwrap();
        assert_eq!(q35, "<|im_start|>system\nSys<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    }

    #[test]
    fn python_string_methods_and_raise_exception_work() {
        let t = ChatTemplate::new(
            "{{ messages[1].content.strip().startswith('Hello') }}{% if false %}{{ raise_exception('x') }}{% endif %}".into(),
            TemplateOrigin::Custom,
            None,
            None,
        )
        .unwrap();
        assert_eq!(t.render(&msgs()).unwrap(), "True");
        let bad = ChatTemplate::new(
            "{{ raise_exception('nope') }}".into(),
            TemplateOrigin::Custom,
            None,
            None,
        )
        .unwrap();
        let e = bad.render(&msgs()).unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
        assert!(ChatTemplate::new("{% if %}".into(), TemplateOrigin::Custom, None, None).is_err());
    }
}
