//! Token trees on the candle backend (CPU f32, tiny real-architecture models): the packed
//! `score_tree` of the attention-only models (Qwen2.5, Qwen3: each state's nodes in one sequence
//! under a tree mask, positions `prefix + depth`) equals the seam's reference (one flat row per
//! projected node, `score_tree_by_rows`) and `forward_full(prefix ++ path)` per projected node —
//! trees with shared internal nodes, several states, depth > 1, a single node, random forests
//! (proptest); the full-vocabulary summaries agree; states are left bit-identical. Qwen3.5 (the
//! hybrid, which cannot take a tree mask) scores one row per root-to-leaf path, equal to the
//! same references.

mod common;

use common::{candidates, ids, models};
use forkscore_backends::candle::LayerState;
use forkscore_backends::{
    score_tree_by_rows, Backend, CandleBackend, CandleState, TokenTree, TreeNode, TreePacking,
    TreeRequest,
};
use forkscore_testkit::tiny_qwen35::{Qwen35Layout, TinyQwen35};
use forkscore_testkit::tolerance::Tolerance;
use proptest::prelude::*;

/// Packed vs flat rows vs full forward differ only in summation order (CPU f32 logits).
const LOGITS: Tolerance = Tolerance::CPU_F32_LOGITS;

const VOCAB: usize = 151_643;

fn node(state: usize, parent: Option<usize>, token: u32, project: bool) -> TreeNode {
    TreeNode {
        state,
        parent,
        token,
        project,
    }
}

fn snapshot(state: &CandleState) -> Vec<Vec<f32>> {
    state
        .layers()
        .iter()
        .flat_map(|l| match l {
            LayerState::Attention { k, v } => vec![k.clone(), v.clone()],
            LayerState::Linear { conv, recurrent } => vec![conv.clone(), recurrent.clone()],
        })
        .map(|t| {
            t.flatten_all()
                .and_then(|t| t.to_vec1::<f32>())
                .expect("host")
        })
        .collect()
}

/// Check `tree` over `prefixes` on `m`: packed == reference == forward_full per projected node.
/// Returns the worst |diff| against forward_full.
fn check(name: &str, m: &CandleBackend, prefixes: &[Vec<u32>], tree: &TokenTree) -> f32 {
    let cands = candidates();
    let states: Vec<CandleState> = prefixes
        .iter()
        .map(|p| m.prefill(p).expect("prefill"))
        .collect();
    let refs: Vec<&CandleState> = states.iter().collect();
    let before: Vec<_> = states.iter().map(snapshot).collect();
    let request = TreeRequest::new(&refs, tree, &cands).expect("request");
    let packed = m.score_tree(&request).expect("packed");
    let reference = score_tree_by_rows(m, &request).expect("reference");
    packed
        .check_shape(tree.projected().len(), cands.len())
        .expect("shape");
    let mut worst = 0f32;
    for (r, &i) in tree.projected().iter().enumerate() {
        let what = format!("{name} node {i}");
        LOGITS.assert_close(
            &format!("{what} vs reference"),
            packed.row(r),
            reference.row(r),
        );
        let full: Vec<u32> = [prefixes[tree.nodes()[i].state].as_slice(), &tree.path(i)].concat();
        let full = m.forward_full(&full, &cands).expect("full");
        worst = worst.max(Tolerance::max_abs_diff(packed.row(r), &full));
        LOGITS.assert_close(&format!("{what} vs forward_full"), packed.row(r), &full);
    }
    let after: Vec<_> = states.iter().map(snapshot).collect();
    assert!(before == after, "{name}: a state changed");
    worst
}

#[test]
fn dense_models_pack_and_the_hybrid_does_not() {
    for (name, m) in models() {
        assert_eq!(m.tree_packing(), TreePacking::Packed, "{name}");
    }
    let dir = TinyQwen35::new(5, Qwen35Layout::TextOnly)
        .ensure()
        .expect("qwen3.5");
    let m = common::load_dir(&dir);
    assert_eq!(m.tree_packing(), TreePacking::RowPerLeaf);
}

#[test]
fn a_trie_with_shared_nodes_over_two_states_equals_the_reference() {
    // state 0: 0 -> 1 -> {2 -> 4, 3}, 1 projected (an internal node), 5 a second root chain
    // state 1 (a shorter prefix): 6 -> {7, 8 -> 9}
    let t = |s: u64, i: usize| ids(s, i + 1, VOCAB)[i];
    let tree = TokenTree::new(
        vec![
            node(0, None, t(1, 0), false),
            node(0, Some(0), t(1, 1), true),
            node(0, Some(1), t(1, 2), false),
            node(0, Some(1), t(1, 3), true),
            node(0, Some(2), t(1, 4), true),
            node(0, None, t(1, 5), true),
            node(1, None, t(2, 0), true),
            node(1, Some(6), t(2, 1), true),
            node(1, Some(6), t(2, 2), false),
            node(1, Some(8), t(2, 3), true),
        ],
        2,
    )
    .expect("tree");
    for (name, m) in models() {
        let worst = check(name, m, &[ids(3, 29, VOCAB), ids(4, 11, VOCAB)], &tree);
        eprintln!("{name}: packed tree vs forward_full max |diff| = {worst:e}");
    }
}

#[test]
fn interleaved_states_and_a_single_node() {
    // nodes of two states interleaved in index order; then a one-node tree
    let tree = TokenTree::new(
        vec![
            node(1, None, 11, false),
            node(0, None, 21, true),
            node(1, Some(0), 12, true),
            node(0, Some(1), 22, true),
            node(1, Some(2), 13, true),
        ],
        3,
    )
    .expect("tree");
    let single = TokenTree::new(vec![node(0, None, 777, true)], 1).expect("single");
    for (name, m) in models() {
        check(
            name,
            m,
            &[ids(5, 17, VOCAB), ids(6, 23, VOCAB), ids(7, 5, VOCAB)],
            &tree,
        );
        check(name, m, &[ids(8, 9, VOCAB)], &single);
    }
}

#[test]
fn rows_as_chains_equal_score() {
    // `TokenTree::from_rows` asks exactly what `score` answers
    for (name, m) in models() {
        let prefix = ids(9, 31, VOCAB);
        let state = m.prefill(&prefix).expect("prefill");
        let suffixes: Vec<Vec<u32>> = (0..4).map(|i| ids(20 + i, 1 + i as usize, VOCAB)).collect();
        let rows: Vec<forkscore_backends::ScoreRow> = suffixes
            .iter()
            .map(|s| forkscore_backends::ScoreRow {
                state: 0,
                suffix: s,
            })
            .collect();
        let tree = TokenTree::from_rows(&rows, 1).expect("chains");
        let cands = candidates();
        let states = [&state];
        let request = TreeRequest::new(&states, &tree, &cands).expect("request");
        let packed = m.score_tree(&request).expect("packed");
        let flat = m.score_rows(&[&state], &rows, &cands).expect("score");
        for r in 0..rows.len() {
            LOGITS.assert_close(&format!("{name} row {r}"), packed.row(r), flat.row(r));
        }
    }
}

#[test]
fn vocabulary_summaries_agree_with_the_reference() {
    let tree = TokenTree::new(
        vec![
            node(0, None, 100, true),
            node(0, Some(0), 200, true),
            node(0, Some(0), 300, true),
        ],
        1,
    )
    .expect("tree");
    for (name, m) in models() {
        let state = m.prefill(&ids(10, 13, VOCAB)).expect("prefill");
        let cands = candidates();
        let states = [&state];
        let request = TreeRequest::new(&states, &tree, &cands)
            .and_then(|r| r.with_vocab(3))
            .expect("request");
        let packed = m.score_tree(&request).expect("packed");
        let reference = score_tree_by_rows(m, &request).expect("reference");
        let (pv, rv) = (
            packed.vocab.expect("packed vocab"),
            reference.vocab.expect("ref vocab"),
        );
        assert_eq!(pv.len(), 3, "{name}");
        for (p, r) in pv.iter().zip(&rv) {
            LOGITS.assert_close(&format!("{name} logsumexp"), &[p.logsumexp], &[r.logsumexp]);
            let ids =
                |v: &forkscore_backends::VocabRow| v.top.iter().map(|t| t.id).collect::<Vec<_>>();
            assert_eq!(ids(p), ids(r), "{name}: top-3 ids");
        }
    }
}

#[test]
fn the_hybrid_scores_one_row_per_leaf_equal_to_the_references() {
    let dir = TinyQwen35::new(6, Qwen35Layout::TextOnly)
        .ensure()
        .expect("qwen3.5");
    let m = common::load_dir(&dir);
    // state 0: 0 (projected) -> {1 -> 3, 2}, 3 and 2 projected; state 1: 4 -> 5, both projected
    let tree = TokenTree::new(
        vec![
            node(0, None, 1000, true),
            node(0, Some(0), 2000, false),
            node(0, Some(0), 3000, true),
            node(0, Some(1), 3500, true),
            node(1, None, 4000, true),
            node(1, Some(4), 4500, true),
        ],
        2,
    )
    .expect("tree");
    let cands = [15, 1000, 90_000, 248_044];
    let prefixes = [vec![248_045, 10, 20, 30, 40], vec![248_045, 50, 60]];
    let states: Vec<CandleState> = prefixes
        .iter()
        .map(|p| m.prefill(p).expect("prefill"))
        .collect();
    let refs: Vec<&CandleState> = states.iter().collect();
    let request = TreeRequest::new(&refs, &tree, &cands)
        .and_then(|r| r.with_vocab(2))
        .expect("request");
    let got = m.score_tree(&request).expect("tree");
    let reference = score_tree_by_rows(&m, &request).expect("reference");
    for (r, &i) in tree.projected().iter().enumerate() {
        let full: Vec<u32> = [prefixes[tree.nodes()[i].state].as_slice(), &tree.path(i)].concat();
        let full = m.forward_full(&full, &cands).expect("full");
        Tolerance::CPU_F32_STRICT.assert_close(&format!("qwen3.5 node {i}"), got.row(r), &full);
        Tolerance::CPU_F32_STRICT.assert_close(
            &format!("qwen3.5 node {i} vs reference"),
            got.row(r),
            reference.row(r),
        );
    }
    let (gv, rv) = (
        got.vocab.expect("vocab"),
        reference.vocab.expect("ref vocab"),
    );
    for (g, r) in gv.iter().zip(&rv) {
        Tolerance::CPU_F32_STRICT.assert_close("qwen3.5 logsumexp", &[g.logsumexp], &[r.logsumexp]);
    }
}

/// A random forest over `states` states: node `i` continues a random earlier node of its state
/// or starts a root; about half the nodes projected (at least one).
fn random_tree(seed: u64, n: usize, states: usize) -> TokenTree {
    let r = ids(seed, 4 * n, 1 << 30);
    let mut nodes: Vec<TreeNode> = Vec::with_capacity(n);
    for i in 0..n {
        let state = r[4 * i] as usize % states;
        let earlier: Vec<usize> = (0..i).filter(|&j| nodes[j].state == state).collect();
        let parent = match r[4 * i + 1] as usize % (earlier.len() + 1) {
            0 => None,
            k => Some(earlier[k - 1]),
        };
        let project = r[4 * i + 2].is_multiple_of(2) || i + 1 == n;
        nodes.push(node(state, parent, r[4 * i + 3] % VOCAB as u32, project));
    }
    TokenTree::new(nodes, states).expect("random tree")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]
    #[test]
    fn random_forests_equal_the_reference(seed in 1u64..1_000_000, n in 1usize..14, states in 1usize..4) {
        let tree = random_tree(seed, n, states);
        let prefixes: Vec<Vec<u32>> = (0..states).map(|s| ids(seed + 7 * s as u64, 3 + 5 * s, VOCAB)).collect();
        for (name, m) in models() {
            check(name, m, &prefixes, &tree);
        }
    }
}
