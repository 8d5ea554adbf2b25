//! The user turn's arrangement, shared by the scoring prompt ([`super::render`]) and the
//! generation prompt ([`crate::generate::prompt`]): where the context sits between a listing
//! of the fields and a closing line, in either [`Layout`].

use crate::options::Layout;

/// A user turn from its parts in `layout`, and the byte offset of the context inside it:
/// context-first `Context:\n{context}\n\n{listing}\n{closing}`, fields-first
/// `{listing}\nContext:\n{context}\n\n{closing}` (the scoring and the generation prompts
/// differ only in their listing and closing line).
pub fn arrange(layout: Layout, context: &str, listing: &str, closing: &str) -> (String, usize) {
    let mut out = String::with_capacity(
        listing.len() + CONTEXT_HEAD.len() + context.len() + closing.len() + 3,
    );
    let at = match layout {
        Layout::ContextFirst => {
            out.push_str(CONTEXT_HEAD);
            out.push_str(context);
            out.push_str("\n\n");
            out.push_str(listing);
            out.push('\n');
            CONTEXT_HEAD.len()
        }
        Layout::FieldsFirst => {
            out.push_str(listing);
            out.push('\n');
            out.push_str(CONTEXT_HEAD);
            let at = out.len();
            out.push_str(context);
            out.push_str("\n\n");
            at
        }
    };
    out.push_str(closing);
    (out, at)
}

/// The head of the user turn, before the context.
pub const CONTEXT_HEAD: &str = "Context:\n";
