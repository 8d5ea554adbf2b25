//! Stage 6 for a literal field: its per-position child logits in, per choice a probability, a
//! log-score and the selected choice out.
//!
//! - `"literal"`: the exact constrained probability (product over the path's branching
//!   positions of softmax(logits / T) over the children); log-score = ln of that probability
//!   at T = 1.
//! - `"literal-first-token"`: softmax(logits / T) over the distinct first tokens, shared by the
//!   choices that start with the same token; log-score = ln of that probability at T = 1.
//! - `"literal-sum-loglik"` / `"literal-mean-loglik"`: log-score = Σ over the path of the
//!   token's unconstrained log-probability, `logit − logsumexp` of the full vocabulary at its
//!   position (divided by the path's length for the mean); probabilities = softmax(log-score / T)
//!   over the choices.
//!
//! The value of every method is, by default ([`LiteralValue::Argmax`]), the choice with the
//! largest reported probability (the first choice wins ties), so a value never has a lower
//! probability than another choice. [`LiteralValue::Greedy`] selects instead what a constrained
//! greedy decoder emits (at each branching position the child with the largest raw logit) for
//! `"literal"` and `"literal-first-token"`; that choice can have a lower product probability
//! than another one. The log-likelihood methods' argmax is their largest log-score under either
//! rule (softmax is monotone).

use super::compile::LiteralField;
use super::tree::NodeScores;
// defined in `options` and `softmax`; re-exported at their former paths
pub use crate::options::LiteralValue;
use crate::schema::LiteralMethod;
pub use crate::softmax::argmax_f64_first;
use crate::softmax::argmax_first;

/// A literal field's scores.
#[derive(Debug, Clone, PartialEq)]
pub struct LiteralScores {
    /// Index of the selected choice.
    pub value: usize,
    /// Per choice, its probability (sums to one).
    pub probabilities: Vec<f64>,
    /// Per choice, the method's log-score (see the module docs).
    pub log_scores: Vec<f32>,
}

/// Why a literal field's logits cannot be assembled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LiteralScoreError {
    #[error("{got} positions of logits for {want} projected positions")]
    Positions { got: usize, want: usize },
    #[error("the log-likelihood needs each position's full-vocabulary logsumexp, which the backend did not return")]
    MissingLogsumexp,
    #[error("choice {choice} passes position {position} that was not projected")]
    Unprojected { choice: usize, position: usize },
}

/// Score `field` from its node logits at temperature `t`, selecting the value by `rule`.
pub fn literal_scores(
    field: &LiteralField,
    scores: &NodeScores,
    t: f64,
    rule: LiteralValue,
) -> Result<LiteralScores, LiteralScoreError> {
    if scores.logits.len() != field.positions.len() {
        return Err(LiteralScoreError::Positions {
            got: scores.logits.len(),
            want: field.positions.len(),
        });
    }
    let trie = &field.trie;
    let ln = |p: Vec<f64>| p.into_iter().map(|p| p.ln() as f32).collect::<Vec<f32>>();
    match field.method {
        LiteralMethod::Exact | LiteralMethod::FirstToken => {
            let at = |t| match field.method {
                LiteralMethod::Exact => trie.exact_probabilities(&scores.logits, t),
                _ => trie.first_token_probabilities(&scores.logits, t),
            };
            let probabilities = at(t);
            let value = match rule {
                LiteralValue::Argmax => argmax_f64_first(&probabilities),
                LiteralValue::Greedy => trie.greedy_choice(&scores.logits),
            };
            Ok(LiteralScores {
                value,
                probabilities,
                log_scores: ln(at(1.0)),
            })
        }
        LiteralMethod::SumLoglik | LiteralMethod::MeanLoglik => {
            let lse = scores
                .logsumexp
                .as_ref()
                .filter(|l| l.len() == field.positions.len())
                .ok_or(LiteralScoreError::MissingLogsumexp)?;
            let mut log_scores = Vec::with_capacity(field.paths.len());
            for (c, path) in trie.paths().iter().enumerate() {
                let mut sum = 0f64;
                for (i, &node) in path.iter().enumerate() {
                    let p = field
                        .position_before(c, i)
                        .ok_or(LiteralScoreError::Unprojected {
                            choice: c,
                            position: i,
                        })?;
                    let k = field.positions[p]
                        .children
                        .iter()
                        .position(|&n| n == node)
                        .ok_or(LiteralScoreError::Unprojected {
                            choice: c,
                            position: i,
                        })?;
                    sum += f64::from(scores.logits[p][k]) - f64::from(lse[p]);
                }
                if field.method == LiteralMethod::MeanLoglik {
                    sum /= path.len() as f64;
                }
                log_scores.push(sum as f32);
            }
            Ok(LiteralScores {
                value: argmax_first(&log_scores),
                probabilities: softmax_f64(&log_scores, t),
                log_scores,
            })
        }
    }
}

/// softmax(x / t) in f64 (max subtracted first).
fn softmax_f64(x: &[f32], t: f64) -> Vec<f64> {
    let max = x
        .iter()
        .map(|&v| f64::from(v))
        .fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = x
        .iter()
        .map(|&v| ((f64::from(v) - max) / t).exp())
        .collect();
    let sum: f64 = e.iter().sum();
    e.into_iter().map(|v| v / sum).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::literal::compile::LiteralField;
    use crate::literal::ChoiceTrie;

    fn field(method: LiteralMethod) -> LiteralField {
        // "ab" = [1, 2, 9], "ac" = [1, 3, 9], "d" = [4, 9]
        let names: Vec<String> = ["ab", "ac", "d"].map(String::from).to_vec();
        let paths = vec![vec![1, 2, 9], vec![1, 3, 9], vec![4, 9]];
        let trie = ChoiceTrie::new(&names, &paths).unwrap();
        let mut cands = Vec::new();
        let positions = crate::literal::compile::positions(&trie, method, &mut cands);
        LiteralField {
            method,
            paths,
            trie,
            positions,
        }
    }

    #[test]
    fn sum_and_mean_loglik_add_the_unconstrained_log_probabilities() {
        let f = field(LiteralMethod::SumLoglik);
        // positions: selector {1, 4}, after 1 {2, 3}, after 2 {9}, after 3 {9}, after 4 {9}
        assert_eq!(f.positions.len(), 5);
        let logits = vec![
            vec![0.0, -1.0],
            vec![-0.5, -2.0],
            vec![-0.25],
            vec![-3.0],
            vec![-0.125],
        ];
        let scores = NodeScores {
            logits: logits.clone(),
            logsumexp: Some(vec![0.0; 5]),
        };
        let s = literal_scores(&f, &scores, 1.0, LiteralValue::Argmax).unwrap();
        assert_eq!(s.log_scores, [-0.75, -5.0, -1.125]);
        assert_eq!(s.value, 0);
        assert!((s.probabilities.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        let m = literal_scores(
            &field(LiteralMethod::MeanLoglik),
            &scores,
            1.0,
            LiteralValue::Argmax,
        )
        .unwrap();
        assert_eq!(m.log_scores, [-0.25, -5.0 / 3.0, -0.5625]);
        let missing = NodeScores {
            logits,
            logsumexp: None,
        };
        assert_eq!(
            literal_scores(&f, &missing, 1.0, LiteralValue::Argmax),
            Err(LiteralScoreError::MissingLogsumexp)
        );
    }

    #[test]
    fn exact_probabilities_multiply_the_constrained_steps() {
        let f = field(LiteralMethod::Exact);
        assert_eq!(f.positions.len(), 2);
        let scores = NodeScores {
            logits: vec![vec![0.0, 0.0], vec![3f32.ln(), 0.0]],
            logsumexp: None,
        };
        let s = literal_scores(&f, &scores, 1.0, LiteralValue::Argmax).unwrap();
        let want = [0.375, 0.125, 0.5];
        for (a, b) in s.probabilities.iter().zip(want) {
            assert!((a - b).abs() < 1e-7, "{:?}", s.probabilities);
        }
        // "d" (0.5) is the most probable; a greedy decoder ties at the selector, takes the first
        // child (token 1) and then "b": "ab" (0.375)
        assert_eq!(s.value, 2);
        let greedy = literal_scores(&f, &scores, 1.0, LiteralValue::Greedy).unwrap();
        assert_eq!(greedy.value, 0);
    }

    #[test]
    fn the_value_is_the_most_probable_choice_unless_greedy_is_asked() {
        // "ab" = [1, 2, 9], "ac" = [1, 3, 9], "d" = [4, 9]. Selector: token 1 (0.6) over 4
        // (0.4), so greedy walks into "a…"; after 1: "b" and "c" split 0.5 / 0.5, so "ab" and
        // "ac" have 0.3 each while "d" has 0.4, the largest product.
        let f = field(LiteralMethod::Exact);
        let scores = NodeScores {
            logits: vec![vec![0.6f32.ln(), 0.4f32.ln()], vec![0.0, 0.0]],
            logsumexp: None,
        };
        let argmax = literal_scores(&f, &scores, 1.0, LiteralValue::Argmax).unwrap();
        assert!((argmax.probabilities[2] - 0.4).abs() < 1e-6, "{argmax:?}");
        assert!(argmax.probabilities[0] < argmax.probabilities[2]);
        assert_eq!(argmax.value, 2);
        let greedy = literal_scores(&f, &scores, 1.0, LiteralValue::Greedy).unwrap();
        assert_eq!(greedy.value, 0);
        assert_eq!(greedy.probabilities, argmax.probabilities);
    }
}
