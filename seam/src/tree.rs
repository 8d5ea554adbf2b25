//! A token tree over retained states ([`TokenTree`], checked once) and the request that scores
//! it ([`TreeRequest`]).
//!
//! Flat rows are chains; a literal-choice field is a trie of its choices' tokens under the
//! field's selector. Node `i` continues the prefix of state `nodes[i].state` with the tokens of
//! its ancestors (root first) and then its own token: its logits are those a causal model gives
//! after `prefix ++ path(i)`. Only nodes marked `project` are projected.
//!
//! Invariants of a [`TokenTree`] (every backend relies on them): every parent precedes its child
//! (so index order is a topological order), a child continues its parent's state, at least one
//! node is projected. Token ids are not checked here (their bound is the backend's vocabulary).

use crate::error::BackendError;
use crate::request::ScoreRow;
use crate::state::PrefixState;
use crate::vocab::check_top_k;

/// One token of a tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeNode {
    /// Index into the request's states of the prefix this node's root continues.
    pub state: usize,
    /// The previous token on this node's path (`None`: the token right after the prefix).
    pub parent: Option<usize>,
    pub token: u32,
    /// Whether this node's next-token logits are wanted.
    pub project: bool,
}

/// A forest of token paths over retained states; valid by construction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenTree {
    nodes: Vec<TreeNode>,
    /// Depth of each node (a root has depth 0).
    depth: Vec<usize>,
    /// Indices of the projected nodes, in index order (the order of the logits).
    projected: Vec<usize>,
}

impl TokenTree {
    /// Check `nodes` (see the module docs) for a request over `states` states.
    pub fn new(nodes: Vec<TreeNode>, states: usize) -> Result<TokenTree, BackendError> {
        let invalid = |reason: String| Err(BackendError::InvalidRequest { reason });
        let mut depth = Vec::with_capacity(nodes.len());
        for (i, n) in nodes.iter().enumerate() {
            if n.state >= states {
                return invalid(format!("tree node {i} names state {} of {states}", n.state));
            }
            match n.parent {
                None => depth.push(0),
                Some(p) if p >= i => {
                    return invalid(format!(
                        "tree node {i} has parent {p}: parents must come first"
                    ))
                }
                Some(p) if nodes[p].state != n.state => {
                    return invalid(format!(
                        "tree node {i} continues state {} but its parent {p} state {}",
                        n.state, nodes[p].state
                    ))
                }
                Some(p) => depth.push(depth[p] + 1),
            }
        }
        let projected: Vec<usize> = (0..nodes.len()).filter(|&i| nodes[i].project).collect();
        if projected.is_empty() {
            return invalid("the token tree projects no node".into());
        }
        Ok(TokenTree {
            nodes,
            depth,
            projected,
        })
    }

    /// Flat rows as chains, each projecting its last token only: the tree that asks exactly
    /// what `Backend::score` answers for `rows`.
    pub fn from_rows(rows: &[ScoreRow<'_>], states: usize) -> Result<TokenTree, BackendError> {
        let mut nodes = Vec::with_capacity(rows.iter().map(|r| r.suffix.len()).sum());
        for (i, r) in rows.iter().enumerate() {
            if r.suffix.is_empty() {
                return Err(BackendError::InvalidRequest {
                    reason: format!("row {i} has an empty suffix"),
                });
            }
            for (t, &token) in r.suffix.iter().enumerate() {
                nodes.push(TreeNode {
                    state: r.state,
                    parent: (t > 0).then(|| nodes.len() - 1),
                    token,
                    project: t + 1 == r.suffix.len(),
                });
            }
        }
        TokenTree::new(nodes, states)
    }

    pub fn nodes(&self) -> &[TreeNode] {
        &self.nodes
    }
    pub fn len(&self) -> usize {
        self.nodes.len()
    }
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
    /// Number of ancestors of node `i` (its offset after the prefix).
    pub fn depth(&self, i: usize) -> usize {
        self.depth[i]
    }
    /// The projected nodes, in index order: logits come back in this order.
    pub fn projected(&self) -> &[usize] {
        &self.projected
    }

    /// The tokens from node `i`'s root down to node `i` itself.
    pub fn path(&self, i: usize) -> Vec<u32> {
        self.path_nodes(i)
            .into_iter()
            .map(|n| self.nodes[n].token)
            .collect()
    }

    /// The node indices from node `i`'s root down to node `i` itself.
    pub fn path_nodes(&self, i: usize) -> Vec<usize> {
        let mut out = Vec::with_capacity(self.depth[i] + 1);
        let mut at = Some(i);
        while let Some(n) = at {
            out.push(n);
            at = self.nodes[n].parent;
        }
        out.reverse();
        out
    }

    /// Nodes without children (each root-to-leaf path is one row when a tree is scored as
    /// batched rows).
    pub fn leaves(&self) -> Vec<usize> {
        let mut has_child = vec![false; self.nodes.len()];
        for n in &self.nodes {
            if let Some(p) = n.parent {
                has_child[p] = true;
            }
        }
        (0..self.nodes.len()).filter(|&i| !has_child[i]).collect()
    }
}

/// A token tree over retained states, with the candidate ids to project at its projected nodes.
#[derive(Debug)]
pub struct TreeRequest<'a, S> {
    states: &'a [&'a S],
    tree: &'a TokenTree,
    candidates: &'a [u32],
    vocab_top_k: Option<usize>,
}

impl<'a, S: PrefixState> TreeRequest<'a, S> {
    /// `tree` must have been checked for `states.len()` states; at least one candidate.
    pub fn new(
        states: &'a [&'a S],
        tree: &'a TokenTree,
        candidates: &'a [u32],
    ) -> Result<Self, BackendError> {
        let invalid = |reason: String| Err(BackendError::InvalidRequest { reason });
        if candidates.is_empty() {
            return invalid("no candidate ids".into());
        }
        if let Some(i) = tree.nodes.iter().position(|n| n.state >= states.len()) {
            return invalid(format!(
                "tree node {i} names state {} of {}",
                tree.nodes[i].state,
                states.len()
            ));
        }
        Ok(TreeRequest {
            states,
            tree,
            candidates,
            vocab_top_k: None,
        })
    }

    /// Also ask for each projected node's full-vocabulary summary with the top `top_k` tokens
    /// (0: the logsumexp alone), as [`crate::ScoreRequest::with_vocab`] does for rows.
    pub fn with_vocab(mut self, top_k: usize) -> Result<Self, BackendError> {
        check_top_k(top_k)?;
        self.vocab_top_k = Some(top_k);
        Ok(self)
    }

    /// `Some(K)` when the caller asked for full-vocabulary summaries.
    pub fn vocab_top_k(&self) -> Option<usize> {
        self.vocab_top_k
    }

    pub fn states(&self) -> &'a [&'a S] {
        self.states
    }
    pub fn tree(&self) -> &'a TokenTree {
        self.tree
    }
    pub fn candidates(&self) -> &'a [u32] {
        self.candidates
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(state: usize, parent: Option<usize>, token: u32, project: bool) -> TreeNode {
        TreeNode {
            state,
            parent,
            token,
            project,
        }
    }

    #[test]
    fn a_trie_knows_its_depths_paths_and_leaves() {
        // 0 -> 1 -> {2, 3}; 4 (another root)
        let t = TokenTree::new(
            vec![
                node(0, None, 10, false),
                node(0, Some(0), 11, true),
                node(0, Some(1), 12, false),
                node(0, Some(1), 13, true),
                node(1, None, 20, true),
            ],
            2,
        )
        .unwrap();
        assert_eq!(
            (0..5).map(|i| t.depth(i)).collect::<Vec<_>>(),
            [0, 1, 2, 2, 0]
        );
        assert_eq!(t.path(3), [10, 11, 13]);
        assert_eq!(t.leaves(), [2, 3, 4]);
        assert_eq!(t.projected(), [1, 3, 4]);
    }

    #[test]
    fn rows_become_chains_projecting_their_last_token() {
        let rows = [
            ScoreRow {
                state: 0,
                suffix: &[1, 2],
            },
            ScoreRow {
                state: 0,
                suffix: &[3],
            },
        ];
        let t = TokenTree::from_rows(&rows, 1).unwrap();
        assert_eq!(t.projected(), [1, 2]);
        assert_eq!(t.path(1), [1, 2]);
        assert_eq!(t.path(2), [3]);
    }

    #[test]
    fn malformed_trees_are_refused_with_a_reason() {
        let cases = [
            (vec![node(0, Some(0), 1, true)], "parents must come first"),
            (vec![node(3, None, 1, true)], "names state 3 of 1"),
            (vec![node(0, None, 1, false)], "projects no node"),
        ];
        for (nodes, want) in cases {
            let e = TokenTree::new(nodes, 1).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        let cross = vec![node(0, None, 1, false), node(1, Some(0), 2, true)];
        let e = TokenTree::new(cross, 2).unwrap_err().to_string();
        assert!(e.contains("continues state 1"), "{e}");
    }
}
