//! Stage 5 for literal fields: one [`TokenTree`] per context holding, for every literal field,
//! its selector suffix (a chain from the context's prefix state) with the field's choice trie
//! under it, projecting only the positions the field's method needs; and the logits that come
//! back, cut into per-field, per-position child logits.
//!
//! Node layout of a field's subtree: the selector's suffix ids (root first), then the trie's
//! nodes in trie index order (parents first), a trie root hanging under the selector's last
//! token. The selector's last token is projected when the field projects `BranchAt::Selector`,
//! trie node `n` when it projects `BranchAt::Node(n)`; projected nodes come back in index order,
//! which is the order of [`LiteralField::positions`].

use super::compile::LiteralField;
use super::BranchAt;
use forkscore_seam::{BackendError, TokenTree, TreeNode};

/// What stage 5 needs to score a schema's literal fields.
#[derive(Debug, Clone)]
pub struct TreePlan<'a> {
    /// Per field of the schema, its literal compilation (None: a code field).
    pub fields: Vec<Option<&'a LiteralField>>,
    /// The ids projected at every projected node.
    pub candidates: &'a [u32],
    /// Whether every projected node also needs its full-vocabulary logsumexp.
    pub logsumexp: bool,
}

impl TreePlan<'_> {
    /// True for a field scored through the tree.
    pub fn is_literal(&self, field: usize) -> bool {
        self.fields.get(field).is_some_and(Option::is_some)
    }
}

/// The next-token logits of one literal field at its projected positions.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeScores {
    /// `logits[p][k]`: the logit of child `k` of position `p` (positions of the field, in order).
    pub logits: Vec<Vec<f32>>,
    /// Per position, the f32 logsumexp of the full vocabulary there (log-likelihood methods).
    pub logsumexp: Option<Vec<f32>>,
}

/// One context's tree and where each literal field's projections sit in its output.
#[derive(Debug, Clone)]
pub struct ContextTree {
    pub tree: TokenTree,
    /// Per field of the schema: the range of projected outputs of a literal field, None for a
    /// code field (or a literal field with nothing to project: a single choice).
    pub spans: Vec<Option<std::ops::Range<usize>>>,
}

/// The tree of one context over state `state` (0 in a per-context request): `suffixes[f]` is
/// field `f`'s selector suffix, `literal[f]` its literal compilation (None: a code field).
/// None when no field projects anything.
pub fn context_tree(
    suffixes: &[Vec<u32>],
    literal: &[Option<&LiteralField>],
    state: usize,
) -> Result<Option<ContextTree>, BackendError> {
    let mut nodes: Vec<TreeNode> = Vec::new();
    let mut spans = Vec::with_capacity(literal.len());
    let mut projected = 0usize;
    for (suffix, lit) in suffixes.iter().zip(literal) {
        let Some(lit) = lit.filter(|l| !l.positions.is_empty()) else {
            spans.push(None);
            continue;
        };
        let Some((&last, head)) = suffix.split_last() else {
            return Err(BackendError::InvalidRequest {
                reason: "a literal field has an empty selector suffix".into(),
            });
        };
        let projects = |at: BranchAt| lit.positions.iter().any(|p| p.at == at);
        // the selector chain: its first token continues the prefix state
        let mut parent = None;
        for &token in head {
            nodes.push(TreeNode {
                state,
                parent,
                token,
                project: false,
            });
            parent = Some(nodes.len() - 1);
        }
        let sel_end = nodes.len();
        nodes.push(TreeNode {
            state,
            parent,
            token: last,
            project: projects(BranchAt::Selector),
        });
        let offset = nodes.len();
        for (n, t) in lit.trie.nodes().iter().enumerate() {
            nodes.push(TreeNode {
                state,
                parent: Some(t.parent.map_or(sel_end, |p| offset + p)),
                token: t.token,
                project: projects(BranchAt::Node(n)),
            });
        }
        let count = lit.positions.len();
        spans.push(Some(projected..projected + count));
        projected += count;
    }
    if projected == 0 {
        return Ok(None);
    }
    let tree = TokenTree::new(nodes, state + 1)?;
    if tree.projected().len() != projected {
        return Err(BackendError::InvalidRequest {
            reason: format!(
                "the literal tree projects {} nodes, its fields {projected} positions",
                tree.projected().len()
            ),
        });
    }
    Ok(Some(ContextTree { tree, spans }))
}

/// Cut one context's projected rows (`rows[i]` over the tree candidates, `logsumexp[i]` when
/// asked) into per-field [`NodeScores`] (None for code fields).
pub fn field_scores(
    tree: Option<&ContextTree>,
    literal: &[Option<&LiteralField>],
    rows: &[Vec<f32>],
    logsumexp: Option<&[f32]>,
) -> Result<Vec<Option<NodeScores>>, BackendError> {
    let mut out = Vec::with_capacity(literal.len());
    for (f, lit) in literal.iter().enumerate() {
        let span = tree.and_then(|t| t.spans.get(f).cloned().flatten());
        let (Some(lit), Some(span)) = (lit, span) else {
            // a literal field with a single choice projects nothing
            out.push(lit.map(|_| NodeScores {
                logits: Vec::new(),
                logsumexp: logsumexp.map(|_| Vec::new()),
            }));
            continue;
        };
        let (Some(own), lse) = (
            rows.get(span.clone()),
            logsumexp.map(|l| l.get(span.clone())),
        ) else {
            return Err(BackendError::InvalidRequest {
                reason: format!("{} tree rows for positions {span:?}", rows.len()),
            });
        };
        let logits = lit
            .positions
            .iter()
            .zip(own)
            .map(|(p, row)| {
                p.candidate_index
                    .iter()
                    .map(|&i| {
                        row.get(i)
                            .copied()
                            .ok_or_else(|| BackendError::InvalidRequest {
                                reason: format!("tree candidate {i} of a row of {}", row.len()),
                            })
                    })
                    .collect::<Result<Vec<f32>, _>>()
            })
            .collect::<Result<Vec<_>, _>>()?;
        let logsumexp = match lse {
            None => None,
            Some(Some(l)) => Some(l.to_vec()),
            Some(None) => {
                return Err(BackendError::InvalidRequest {
                    reason: format!("no logsumexp for tree positions {span:?}"),
                })
            }
        };
        out.push(Some(NodeScores { logits, logsumexp }));
    }
    Ok(out)
}
