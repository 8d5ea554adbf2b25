//! Prompt rendering: instructions + context + a catalogue of every field as ONE chat prefix
//! (system + user turn, generation prompt open), and a short per-field selector after it.
//!
//! Layout of a full prompt for field `f`:
//! `template(system: INSTRUCTIONS, user: context + catalogue)` ++ `"{f}:"` and the model's next
//! token is the code (`" A"`, `" B"`, …). The selector starts right after the template's
//! assistant header (which ends in a newline), so its tokens do not depend on the context.
//! [`Layout::FieldsFirst`] puts the field listing before the context instead
//! (`user: listing + context + closing line`), with the same selectors after the header.
//!
//! A literal-scored field (`"scoring": "literal…"`) lists its choices by their text (`  - low`),
//! without code letters, so it may have more than 26; the model's continuation is the choice
//! text itself (`" low\n"`). Only a schema with a literal field uses the instructions and the
//! closing line that mention answering with a choice's text: a code-only schema renders exactly
//! as before literal scoring existed.
//!
//! A `json`-scored schema ([`answers_in_json`]) renders the generation baseline's prompt
//! instead: its instructions, listing and closing line ([`crate::generate::prompt`], a request
//! for one JSON object) in the same arrangement,
//! each field's selector is the object's opening `{\n  "name":` (indented as the models write
//! it), and a choice continues it with its JSON value and what follows it in the object
//! (`" low",`; see
//! [`crate::literal::compile::continuation`]).

pub use super::arrange::{arrange, CONTEXT_HEAD};
use crate::generate::prompt as json_prompt;
use crate::options::Layout;
use crate::schema::{Field, Scoring};
use crate::template::{ChatTemplate, Message, TemplateError};
use std::borrow::Cow;

/// Code letters: choice `i` of a field is `CODES[i]`.
pub const CODES: [char; 26] = [
    'A', 'B', 'C', 'D', 'E', 'F', 'G', 'H', 'I', 'J', 'K', 'L', 'M', 'N', 'O', 'P', 'Q', 'R', 'S',
    'T', 'U', 'V', 'W', 'X', 'Y', 'Z',
];

const INSTRUCTIONS: &str = "You classify a context into the fields of a catalogue. Each field lists its \
choices, each labelled with a capital-letter code. For each field, answer with the code of the single \
best choice, written as `field_name: CODE`.";

const LITERAL_INSTRUCTIONS: &str = "You classify a context into the fields of a catalogue. Each field lists its \
choices. For a field whose choices are labelled with capital-letter codes, answer with the code of the single \
best choice; for a field whose choices are listed without codes, answer with the exact text of the single best \
choice. Write each answer as `field_name: ANSWER`.";

/// True when some field of `fields` is scored by its choices' text.
pub fn has_literal(fields: &[Field]) -> bool {
    fields.iter().any(|f| f.scoring != Scoring::Code)
}

/// True when the schema's fields are scored as JSON values (all of them: the schema checks it).
pub fn answers_in_json(fields: &[Field]) -> bool {
    fields.first().is_some_and(|f| f.scoring == Scoring::Json)
}

/// The code of choice `i` (`A` for 0).
pub fn code(i: usize) -> char {
    CODES[i]
}

/// The text the model continues with for choice `i`: the code with its leading space.
pub fn code_text(i: usize) -> String {
    format!(" {}", CODES[i])
}

/// The per-field selector appended after the prefix: `name:`, or for a `json`-scored field the
/// object opened as chat models write it, indented by two spaces: `{\n  "name":` (the field's
/// name as a JSON string).
pub fn selector(field: &Field) -> String {
    if field.scoring == Scoring::Json {
        format!("{{\n  {}:", serde_json::Value::String(field.name.clone()))
    } else {
        format!("{}:", field.name)
    }
}

/// The user turn in `layout`, and the byte offset of the context inside it.
/// - context-first: `Context:\n{context}` + [`catalogue`];
/// - fields-first: [`listing`] + `\nContext:\n{context}\n\n` + [`closing`] — the schema's whole
///   text before the context, so every context of a schema shares it as prompt head.
pub fn user_message_in(context: &str, fields: &[Field], layout: Layout) -> (String, usize) {
    arrange(layout, context, &listing(fields), &closing(fields))
}

/// The schema's own text as the user turn lists it, whatever the layout: the listing of
/// [`catalogue`] (context-first) or the listing alone (fields-first, before the context).
pub fn schema_text(fields: &[Field], layout: Layout) -> String {
    match layout {
        Layout::ContextFirst => catalogue(fields),
        Layout::FieldsFirst => listing(fields),
    }
}

/// What the user turn holds after the context in the context-first layout: a blank line, the
/// [`listing`], a blank line and the [`closing`] line.
pub fn catalogue(fields: &[Field]) -> String {
    let (listing, closing) = (listing(fields), closing(fields));
    let mut out = String::with_capacity(listing.len() + closing.len() + 3);
    out.push_str("\n\n");
    out.push_str(&listing);
    out.push('\n');
    out.push_str(&closing);
    out
}

/// `Fields:` and every field's name, description and choices (the schema's own text), each
/// choice line ending in a newline (a json schema: the generation prompt's listing). Linear in
/// the schema's size.
pub fn listing(fields: &[Field]) -> String {
    use std::fmt::Write;
    if answers_in_json(fields) {
        return json_prompt::listing(fields);
    }
    let mut out = String::with_capacity(64 * fields.len() + 128);
    out.push_str("Fields:\n");
    for f in fields {
        let _ = write!(out, "\n{}", f.name);
        if let Some(d) = &f.description {
            let _ = write!(out, ": {d}");
        }
        out.push('\n');
        let literal = f.scoring != Scoring::Code;
        for (i, (c, d)) in f.choices.iter().zip(&f.choice_descriptions).enumerate() {
            if literal {
                let _ = write!(out, "  - {}", c.key());
            } else {
                let _ = write!(out, "  {} = {}", code(i), c.key());
            }
            if let Some(d) = d {
                let _ = write!(out, " ({d})");
            }
            out.push('\n');
        }
    }
    out
}

/// The closing line: how to write the answers (a json schema: the generation prompt's, naming
/// the keys).
pub fn closing(fields: &[Field]) -> Cow<'static, str> {
    if answers_in_json(fields) {
        Cow::Owned(json_prompt::closing(fields))
    } else if has_literal(fields) {
        Cow::Borrowed("Answer every field on its own line as `field_name: ANSWER`.")
    } else {
        Cow::Borrowed("Answer every field on its own line as `field_name: CODE`.")
    }
}

/// The system instructions: the generation prompt's for a json schema, those mentioning a
/// choice's text where a field is literal, else those of code letters.
fn instructions(fields: &[Field]) -> &'static str {
    if answers_in_json(fields) {
        json_prompt::INSTRUCTIONS
    } else if has_literal(fields) {
        LITERAL_INSTRUCTIONS
    } else {
        INSTRUCTIONS
    }
}

/// Render the shared prefix text for `context` in `layout`.
pub fn render_prefix(
    template: &ChatTemplate,
    context: &str,
    fields: &[Field],
    layout: Layout,
) -> Result<String, TemplateError> {
    template.render(&[
        Message {
            role: "system",
            content: instructions(fields).to_string(),
        },
        Message {
            role: "user",
            content: user_message_in(context, fields, layout).0,
        },
    ])
}
