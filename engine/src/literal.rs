//! Literal-choice scoring: the trie of a field's choices and the probability of each choice.
//!
//! In: each choice's token path after the field's selector — the tokens of `" {choice}\n"`
//! tokenized in context, so the path ends with the token that carries the newline following
//! the answer (the end-of-choice token). Out: a [`ChoiceTrie`] whose branching nodes are the
//! only positions that need logits, and, given those logits, per choice the probability that a
//! decoder constrained to the choices emits it.
//!
//! Invariants: every choice ends at its own leaf (no path is a prefix of another, no two paths
//! are equal), so the probabilities of a field sum to one. A node with one child contributes a
//! factor of 1 and is never projected; where one choice is a prefix of another, the node after
//! the shorter one branches between its end-of-choice token and the longer one's next token.
//!
//! The stages of a literal field: [`compile`] (1: paths in context, the trie, the projected
//! positions), [`tree`] (5: one token tree per context, its logits cut per field) and
//! [`assemble`] (6: probabilities and the selected choice per method).

pub mod assemble;
pub mod compile;
pub mod tree;

use crate::softmax::{argmax_first, softmax_scaled};

/// Where a branch sits: right after the selector, or after trie node `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BranchAt {
    Selector,
    Node(usize),
}

/// One token of the trie; `parent == None` follows the selector directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrieNode {
    pub token: u32,
    pub parent: Option<usize>,
}

/// A position with two or more allowed next tokens: one projection each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Branch {
    pub at: BranchAt,
    /// The allowed next tokens' trie nodes, in first-seen (choice) order.
    pub children: Vec<usize>,
}

/// The trie of one field's choices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChoiceTrie {
    nodes: Vec<TrieNode>,
    /// Per choice, the trie nodes of its path (root first, end-of-choice token last).
    paths: Vec<Vec<usize>>,
    /// Branching positions in projection order (the selector first when it branches).
    branches: Vec<Branch>,
}

/// Why a field's choices cannot be scored literally.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrieError {
    #[error("choice {choice:?} has no tokens after the selector")]
    Empty { choice: String },
    #[error("choices {first:?} and {second:?} are the same tokens after the selector, so no decoder can tell them apart")]
    Duplicate { first: String, second: String },
    #[error("choice {choice:?} ends inside choice {longer:?} (its tokens, end-of-choice token included, are a prefix of the other's), so a decoder can never stop on it")]
    Unreachable { choice: String, longer: String },
}

impl ChoiceTrie {
    /// Build the trie from each choice's token path (`names` for error messages, same order).
    pub fn new(names: &[String], paths: &[Vec<u32>]) -> Result<ChoiceTrie, TrieError> {
        let mut nodes: Vec<TrieNode> = Vec::new();
        let mut children: Vec<Vec<usize>> = Vec::new();
        let mut root: Vec<usize> = Vec::new();
        let mut node_paths = Vec::with_capacity(paths.len());
        // the choice whose path ends at a node (a leaf, unless a longer path runs through it)
        let mut ends: Vec<Option<usize>> = Vec::new();
        for (c, path) in paths.iter().enumerate() {
            if path.is_empty() {
                return Err(TrieError::Empty {
                    choice: names[c].clone(),
                });
            }
            let mut parent: Option<usize> = None;
            let mut own = Vec::with_capacity(path.len());
            for &token in path {
                let siblings = match parent {
                    None => &root,
                    Some(p) => &children[p],
                };
                let found = siblings.iter().copied().find(|&n| nodes[n].token == token);
                let n = match found {
                    Some(n) => n,
                    None => {
                        nodes.push(TrieNode { token, parent });
                        children.push(Vec::new());
                        ends.push(None);
                        let n = nodes.len() - 1;
                        match parent {
                            None => root.push(n),
                            Some(p) => children[p].push(n),
                        }
                        n
                    }
                };
                own.push(n);
                parent = Some(n);
            }
            let last = *own.last().unwrap_or(&0);
            if let Some(other) = ends[last] {
                return Err(TrieError::Duplicate {
                    first: names[other].clone(),
                    second: names[c].clone(),
                });
            }
            ends[last] = Some(c);
            node_paths.push(own);
        }
        // A choice that ends on a node with children ends inside a longer choice.
        for (c, own) in node_paths.iter().enumerate() {
            let last = own[own.len() - 1];
            if let Some(&child) = children[last].first() {
                let longer = node_paths
                    .iter()
                    .position(|p| p.contains(&child))
                    .unwrap_or(c);
                return Err(TrieError::Unreachable {
                    choice: names[c].clone(),
                    longer: names[longer].clone(),
                });
            }
        }
        let mut branches = Vec::new();
        if root.len() > 1 {
            branches.push(Branch {
                at: BranchAt::Selector,
                children: root,
            });
        }
        for (n, kids) in children.into_iter().enumerate() {
            if kids.len() > 1 {
                branches.push(Branch {
                    at: BranchAt::Node(n),
                    children: kids,
                });
            }
        }
        Ok(ChoiceTrie {
            nodes,
            paths: node_paths,
            branches,
        })
    }

    pub fn nodes(&self) -> &[TrieNode] {
        &self.nodes
    }
    /// Branching positions, in projection order: logits come in this order.
    pub fn branches(&self) -> &[Branch] {
        &self.branches
    }
    /// Per choice, its trie nodes (root first).
    pub fn paths(&self) -> &[Vec<usize>] {
        &self.paths
    }
    /// Every token any branch may continue with (the ids to project).
    pub fn branch_tokens(&self) -> impl Iterator<Item = u32> + '_ {
        self.branches
            .iter()
            .flat_map(|b| b.children.iter().map(|&n| self.nodes[n].token))
    }

    /// The exact constrained probability of every choice: for each branch, softmax(logits / T)
    /// over its children (`branch_logits[b][k]` is the logit of child `k` of branch `b`), then
    /// per choice the product over the branches its path passes. In f64.
    pub fn exact_probabilities(&self, branch_logits: &[Vec<f32>], temperature: f64) -> Vec<f64> {
        let step: Vec<Vec<f64>> = branch_logits
            .iter()
            .map(|l| softmax_scaled(l, temperature))
            .collect();
        self.paths
            .iter()
            .map(|path| self.passes(path).map(|(b, k)| step[b][k]).product::<f64>())
            .collect()
    }

    /// The choice a constrained greedy decoder emits: at each branch the child with the largest
    /// raw logit (the first child wins ties), so the temperature never changes it.
    pub fn greedy_choice(&self, branch_logits: &[Vec<f32>]) -> usize {
        let best: Vec<usize> = branch_logits.iter().map(|l| argmax_first(l)).collect();
        (0..self.paths.len())
            .find(|&c| self.passes(&self.paths[c]).all(|(b, k)| best[b] == k))
            .unwrap_or(0)
    }

    /// The first-token scores: softmax(logits / T) over the distinct first tokens, a first token's
    /// probability shared equally by the choices that start with it.
    pub fn first_token_probabilities(
        &self,
        branch_logits: &[Vec<f32>],
        temperature: f64,
    ) -> Vec<f64> {
        let n = self.paths.len();
        match self.branches.first() {
            Some(b) if b.at == BranchAt::Selector => {
                let p = softmax_scaled(&branch_logits[0], temperature);
                let share = |k: usize| {
                    let node = b.children[k];
                    let count = self.paths.iter().filter(|p| p[0] == node).count();
                    p[k] / count as f64
                };
                self.paths
                    .iter()
                    .map(|path| {
                        let k = b.children.iter().position(|&c| c == path[0]).unwrap_or(0);
                        share(k)
                    })
                    .collect()
            }
            // every choice starts with the same token
            _ => vec![1.0 / n as f64; n],
        }
    }

    /// The (branch, child) pairs a choice's path passes, in path order.
    fn passes<'a>(&'a self, path: &'a [usize]) -> impl Iterator<Item = (usize, usize)> + 'a {
        self.branches.iter().enumerate().filter_map(move |(b, br)| {
            let from = match br.at {
                BranchAt::Selector => None,
                BranchAt::Node(n) => Some(n),
            };
            let next = match from {
                None => path.first().copied(),
                Some(n) => path
                    .iter()
                    .position(|&x| x == n)
                    .and_then(|i| path.get(i + 1).copied()),
            }?;
            br.children.iter().position(|&c| c == next).map(|k| (b, k))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("c{i}")).collect()
    }

    #[test]
    fn a_prefix_choice_branches_on_its_end_of_choice_token() {
        // "high" = [5, 9(\n)], "high risk" = [5, 7, 9], "low" = [6, 9]
        let t = ChoiceTrie::new(&names(3), &[vec![5, 9], vec![5, 7, 9], vec![6, 9]]).unwrap();
        assert_eq!(t.branches().len(), 2);
        assert_eq!(t.branches()[0].at, BranchAt::Selector);
        let after_high = &t.branches()[1];
        let tokens: Vec<u32> = after_high
            .children
            .iter()
            .map(|&n| t.nodes()[n].token)
            .collect();
        assert_eq!(tokens, [9, 7]);
        // selector: ln 3 vs 0 -> 3/4, 1/4; after "high": end vs " risk" 1/2, 1/2
        let logits = vec![vec![3f32.ln(), 0.0], vec![0.0, 0.0]];
        let p = t.exact_probabilities(&logits, 1.0);
        let want = [0.375, 0.375, 0.25];
        for (a, b) in p.iter().zip(want) {
            assert!((a - b).abs() < 1e-7, "{p:?}"); // ln 3 rounded to f32
        }
        assert_eq!(t.greedy_choice(&logits), 0);
        let first = t.first_token_probabilities(&logits, 1.0);
        assert!((first[0] - 0.375).abs() < 1e-7 && (first[2] - 0.25).abs() < 1e-7);
    }

    #[test]
    fn bad_choices_are_named() {
        let e = ChoiceTrie::new(&names(2), &[vec![1, 9], vec![1, 9]]).unwrap_err();
        assert!(matches!(e, TrieError::Duplicate { .. }), "{e}");
        let e = ChoiceTrie::new(&names(2), &[vec![1, 9], vec![1, 9, 3, 9]]).unwrap_err();
        assert_eq!(
            e,
            TrieError::Unreachable {
                choice: "c0".into(),
                longer: "c1".into()
            }
        );
        let e = ChoiceTrie::new(&names(1), &[vec![]]).unwrap_err();
        assert!(matches!(e, TrieError::Empty { .. }));
    }

    proptest! {
        /// Distinct paths that all end on the same end-of-choice token (never inside another
        /// path) give probabilities that sum to one, for any logits and temperature.
        #[test]
        fn probabilities_sum_to_one(
            stems in proptest::collection::btree_set(proptest::collection::vec(0u32..4, 1..4), 1..12),
            seed in proptest::collection::vec(-8f32..8.0, 64),
            temperature in 0.2f64..3.0,
        ) {
            let paths: Vec<Vec<u32>> = stems.into_iter().map(|mut s| { s.push(99); s }).collect();
            let t = ChoiceTrie::new(&names(paths.len()), &paths).unwrap();
            let logits: Vec<Vec<f32>> = t.branches().iter().enumerate()
                .map(|(b, br)| (0..br.children.len()).map(|k| seed[(b * 7 + k) % seed.len()]).collect())
                .collect();
            let p = t.exact_probabilities(&logits, temperature);
            prop_assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-9);
            let first: f64 = t.first_token_probabilities(&logits, temperature).iter().sum();
            prop_assert!((first - 1.0).abs() < 1e-9);
            let g = t.greedy_choice(&logits);
            prop_assert!(g < paths.len());
        }
    }
}
