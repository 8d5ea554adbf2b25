//! The generation prompt: the same chat template as scoring, asking the model to WRITE the
//! answer as one JSON object.
//!
//! `template(system: INSTRUCTIONS, user: "Context:\n…\n\nFields:\n" + one line per field)`
//! with the generation prompt open and thinking disabled, exactly as the scoring prompt is
//! rendered ([`crate::template::ChatTemplate::render`]). Each field line gives its name, its
//! description, and its allowed values as JSON (`"low"`, `"medium"`, … or `true or false`),
//! with each choice's description where the schema has one; the closing line names the keys in
//! schema order. No example object is shown, so no choice is favoured by the prompt.
//! [`Layout::FieldsFirst`] lists the fields before the context (`listing + "\nContext:\n…\n\n" +
//! closing line`), as the scoring prompt of that layout does.

use crate::options::Layout;
use crate::schema::{Field, FieldKind};
use crate::template::{ChatTemplate, Message, TemplateError};

pub(crate) const INSTRUCTIONS: &str =
    "You classify a context into the fields of a catalogue. For each field, \
choose the single best of its allowed values. Reply with one JSON object only, mapping every field \
name to its chosen value: no explanation, no markdown, no text before or after the object.";

/// The user turn in `layout`, and the byte offset of the context inside it.
pub fn user_message_in(context: &str, fields: &[Field], layout: Layout) -> (String, usize) {
    crate::prepare::arrange::arrange(layout, context, &listing(fields), &closing(fields))
}

/// The schema's own text as the user turn of `layout` holds it: the [`catalogue`] after the
/// context, or the [`listing`] before it.
pub fn schema_text(fields: &[Field], layout: Layout) -> String {
    match layout {
        Layout::ContextFirst => catalogue(fields),
        Layout::FieldsFirst => listing(fields),
    }
}

/// What the user turn holds after the context (context-first): a blank line, the
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

/// `Fields:` and every field with its allowed values (the schema's own text).
pub fn listing(fields: &[Field]) -> String {
    let mut out = String::with_capacity(256 * fields.len());
    out.push_str("Fields:\n");
    for f in fields {
        out.push_str(&format!("\n- \"{}\"", f.name));
        if let Some(d) = &f.description {
            out.push_str(&format!(": {d}"));
        }
        out.push('\n');
        match f.kind {
            FieldKind::Boolean => out.push_str("  allowed values: true or false\n"),
            FieldKind::Enum => {
                let described = f.choice_descriptions.iter().any(Option::is_some);
                if described {
                    out.push_str("  allowed values:\n");
                    for (c, d) in f.choices.iter().zip(&f.choice_descriptions) {
                        out.push_str(&format!("    {}", c.to_json()));
                        if let Some(d) = d {
                            out.push_str(&format!(" ({d})"));
                        }
                        out.push('\n');
                    }
                } else {
                    let list: Vec<String> =
                        f.choices.iter().map(|c| c.to_json().to_string()).collect();
                    out.push_str(&format!("  allowed values: {}\n", list.join(", ")));
                }
            }
        }
    }
    out
}

/// The closing line: the keys to write, in schema order.
pub fn closing(fields: &[Field]) -> String {
    let keys: Vec<String> = fields.iter().map(|f| format!("\"{}\"", f.name)).collect();
    format!(
        "Reply with one JSON object with exactly these keys, in this order: {}. Each value must be \
one of the field's allowed values, written as shown (strings in double quotes, booleans as true or false).",
        keys.join(", ")
    )
}

/// The rendered prompt text for `context` in `layout`.
pub fn render(
    template: &ChatTemplate,
    context: &str,
    fields: &[Field],
    layout: Layout,
) -> Result<String, TemplateError> {
    template.render(&[
        Message {
            role: "system",
            content: INSTRUCTIONS.to_string(),
        },
        Message {
            role: "user",
            content: user_message_in(context, fields, layout).0,
        },
    ])
}
