//! Stage 1 for a literal-scored field: each choice's token path after the selector, the trie of
//! those paths, and which trie positions the model must be asked about.
//!
//! In: the probe prompt's text and ids up to the end of the field's selector, the field. Out:
//! a [`LiteralField`]. A choice's path is the tail of `tokenize(prefix ++ selector ++ " {choice}\n")`
//! after `prefix ++ selector`'s own ids — the whole text tokenized at once, so the split is
//! exact; when those ids are not a prefix of the whole tokenization (the choice's first
//! characters merge with the selector) the choice is refused. Like the code rows, a path does
//! not depend on the context (the selector starts after the template's last added token), so
//! paths are compiled once on the probe context. Only the prompt's tail after its last added
//! token is tokenized per choice ([`crate::prepare::anchor::AnchoredPrompt`]): the same ids as
//! the whole text, at the cost of a short tokenization, and special-token text in a choice is
//! tokenized as text.
//!
//! Projected positions: for `"literal"` / `"literal-first-token"` only the branching positions
//! (two or more children); for the log-likelihood methods every position on a path (the end of
//! the selector and every trie node with a child), since each path token's full-vocabulary
//! log-probability is needed.

use super::{BranchAt, ChoiceTrie, TrieError};
use crate::prepare::anchor::AnchoredPrompt;
use crate::schema::{Choice, Field, LiteralMethod, Scoring};
use crate::tokenizer::TokenizerError;
use rayon::prelude::*;

/// A position whose next-token logits are projected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    pub at: BranchAt,
    /// The trie nodes that may follow, in first-seen (choice) order.
    pub children: Vec<usize>,
    /// Per child, the index of its token in the schema's tree candidates
    /// (`CompiledSchema::tree_candidates`).
    pub candidate_index: Vec<usize>,
}

/// A compiled literal-scored field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiteralField {
    pub method: LiteralMethod,
    /// Per choice, its token ids after the selector (end-of-choice token last).
    pub paths: Vec<Vec<u32>>,
    pub trie: ChoiceTrie,
    /// The projected positions, selector first, then trie nodes in index order (the order of
    /// the tree's projected nodes).
    pub positions: Vec<Position>,
}

/// Why a literal field does not compile.
#[derive(Debug, thiserror::Error)]
pub enum LiteralError {
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("choice {choice:?} merges with the selector {selector:?} when tokenized, so its tokens cannot follow the selector's")]
    MergesWithSelector { choice: String, selector: String },
    #[error(transparent)]
    Trie(#[from] TrieError),
}

/// The text the model continues the selector with for `choice`.
pub fn choice_text(choice: &str) -> String {
    format!(" {choice}\n")
}

/// The text after field `field`'s selector for `choice`: [`choice_text`], or for a
/// `json`-scored field the choice's JSON value (`"low"`, `true`) and what follows it in an
/// object written with one key per line: `,` before another field, `\n}` after the `last`
/// one (the end of the choice, so no choice's path is a prefix of another's).
pub fn continuation(field: &Field, choice: &Choice, last: bool) -> String {
    if field.scoring == Scoring::Json {
        format!(" {}{}", choice.to_json(), if last { "\n}" } else { "," })
    } else {
        choice_text(&choice.key())
    }
}

/// The tokens of `whole` after `head`, when `head` is a strict prefix of it.
pub fn path_after<'a>(head: &[u32], whole: &'a [u32]) -> Option<&'a [u32]> {
    (whole.len() > head.len() && whole.starts_with(head)).then(|| &whole[head.len()..])
}

/// Each choice's token path after `selector`: the tail of the prompt's tokens with the
/// selector and `" {choice}\n"` appended, after the selector's own tail tokens `selector_tail`
/// (with the prompt's shared head before both, exactly the whole-prompt split: see
/// [`crate::prepare::anchor`]). Choices are tokenized in parallel; each costs one short
/// tokenization, so a field's compile is linear in its choices.
pub fn literal_paths(
    anchored: &AnchoredPrompt,
    selector: &str,
    selector_tail: &[u32],
    field: &Field,
    last: bool,
) -> Result<Vec<Vec<u32>>, LiteralError> {
    let paths: Vec<Result<Vec<u32>, LiteralError>> = field
        .choices
        .par_iter()
        .map(|c| {
            let name = c.key();
            let text = continuation(field, c, last);
            let whole = anchored.tail_ids(&format!("{selector}{text}"))?;
            path_after(selector_tail, &whole)
                .map(<[u32]>::to_vec)
                .ok_or_else(|| LiteralError::MergesWithSelector {
                    choice: name,
                    selector: selector.to_string(),
                })
        })
        .collect();
    // the first failing choice in the schema's order is the one reported
    paths.into_iter().collect()
}

impl LiteralField {
    /// Build `field`'s trie and projected positions (scored by `method`) from its choices'
    /// paths ([`literal_paths`]). `candidates` is the schema's tree candidate union, extended
    /// with this field's projected tokens.
    pub fn from_paths(
        field: &Field,
        method: LiteralMethod,
        paths: Vec<Vec<u32>>,
        candidates: &mut Vec<u32>,
    ) -> Result<LiteralField, LiteralError> {
        let names: Vec<String> = field.choices.iter().map(|c| c.key()).collect();
        let trie = ChoiceTrie::new(&names, &paths)?;
        let positions = positions(&trie, method, candidates);
        Ok(LiteralField {
            method,
            paths,
            trie,
            positions,
        })
    }

    /// Index into [`LiteralField::positions`] of the position right before path token `i` of
    /// choice `c` (None where that position is not projected: a single child, exact methods).
    pub fn position_before(&self, c: usize, i: usize) -> Option<usize> {
        let at = match i {
            0 => BranchAt::Selector,
            _ => BranchAt::Node(self.trie.paths()[c][i - 1]),
        };
        self.positions.iter().position(|p| p.at == at)
    }
}

/// The positions `method` needs, in tree order; their tokens are added to `candidates`.
pub(crate) fn positions(
    trie: &ChoiceTrie,
    method: LiteralMethod,
    candidates: &mut Vec<u32>,
) -> Vec<Position> {
    let nodes = trie.nodes();
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    let mut root = Vec::new();
    for (n, node) in nodes.iter().enumerate() {
        match node.parent {
            None => root.push(n),
            Some(p) => children[p].push(n),
        }
    }
    // branching positions for the constrained methods, every position with a child otherwise
    let least = if method.needs_full_vocabulary() { 1 } else { 2 };
    let mut out = Vec::new();
    let at_nodes = children
        .into_iter()
        .enumerate()
        .map(|(n, kids)| (BranchAt::Node(n), kids));
    for (at, kids) in std::iter::once((BranchAt::Selector, root)).chain(at_nodes) {
        if kids.len() < least {
            continue;
        }
        let candidate_index = kids
            .iter()
            .map(|&k| {
                let token = nodes[k].token;
                candidates
                    .iter()
                    .position(|&c| c == token)
                    .unwrap_or_else(|| {
                        candidates.push(token);
                        candidates.len() - 1
                    })
            })
            .collect();
        out.push(Position {
            at,
            children: kids,
            candidate_index,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_the_tail_after_the_selector_ids() {
        assert_eq!(path_after(&[1, 2], &[1, 2, 3, 4]), Some(&[3, 4][..]));
        // the choice's first characters merged into the selector's last token
        assert_eq!(path_after(&[1, 2], &[1, 7, 4]), None);
        // nothing after the selector
        assert_eq!(path_after(&[1, 2], &[1, 2]), None);
    }

    #[test]
    fn constrained_methods_project_branches_loglik_methods_every_position() {
        // "high" = [5, 9], "high risk" = [5, 7, 9], "low" = [6, 9]
        let names: Vec<String> = ["high", "high risk", "low"].map(String::from).to_vec();
        let trie = ChoiceTrie::new(&names, &[vec![5, 9], vec![5, 7, 9], vec![6, 9]]).unwrap();
        let mut cands = vec![9];
        let exact = positions(&trie, LiteralMethod::Exact, &mut cands);
        assert_eq!(exact.len(), trie.branches().len());
        for (p, b) in exact.iter().zip(trie.branches()) {
            assert_eq!((p.at, &p.children), (b.at, &b.children));
        }
        assert_eq!(cands, [9, 5, 6, 7]);
        assert_eq!(exact[1].candidate_index, [0, 3]);
        let mut cands = Vec::new();
        let all = positions(&trie, LiteralMethod::SumLoglik, &mut cands);
        // selector, after "high", after "high risk", after "low"
        assert_eq!(all.len(), 4);
        assert_eq!(all[0].at, BranchAt::Selector);
    }
}
