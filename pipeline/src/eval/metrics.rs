//! Classification metrics of one field, as pure functions of (true label, predicted label,
//! per-class probabilities) per item. Definitions (the same as `docs/evaluation.md`):
//!
//! - accuracy: the fraction of items whose predicted class is the true class;
//! - confusion matrix: `m[true][predicted]` counts (rows: true class, scikit-learn's layout);
//! - macro-F1: the unweighted mean of per-class F1 = 2·TP / (2·TP + FP + FN) over the classes
//!   present in the true or the predicted labels (scikit-learn's default label set; a class with
//!   a zero denominator cannot occur in that set);
//! - Brier score (multi-class): mean over items of Σ_k (p_k − y_k)², y the one-hot true class
//!   (range [0, 2]; for two classes twice scikit-learn's binary `brier_score_loss`);
//! - log-loss: mean over items of −ln p_true, p clipped to [ε, 1 − ε] with ε = f64::EPSILON
//!   (scikit-learn's `eps="auto"` for float64);
//! - ECE on the top-label confidence (the probability of the predicted class): Σ_b (n_b / N) ·
//!   |accuracy_b − mean confidence_b|, over `bins` equal-width bins of [0, 1] (bin b holds
//!   confidences in [b/B, (b+1)/B), the last bin includes 1) or over `bins` equal-mass bins (the
//!   items sorted by confidence, bin b the items ⌊bN/B⌋ … ⌊(b+1)N/B⌋ − 1; ties keep input order).

use serde::Serialize;

/// One scored item of a field: class indices and the probabilities over the field's classes.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    pub truth: usize,
    pub predicted: usize,
    pub probabilities: Vec<f64>,
}

impl Scored {
    /// The probability of the predicted class (the top-label confidence under argmax values).
    pub fn confidence(&self) -> f64 {
        self.probabilities[self.predicted]
    }
    pub fn correct(&self) -> bool {
        self.truth == self.predicted
    }
}

/// Why metrics cannot be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetricsError {
    #[error("no items")]
    Empty,
    #[error("item {item}: {what}")]
    BadItem { item: usize, what: String },
    #[error("the bin count must be at least 1")]
    ZeroBins,
}

/// Check every item against `classes` classes.
pub fn check(items: &[Scored], classes: usize) -> Result<(), MetricsError> {
    if items.is_empty() {
        return Err(MetricsError::Empty);
    }
    for (i, it) in items.iter().enumerate() {
        let bad = |what: String| Err(MetricsError::BadItem { item: i, what });
        if it.probabilities.len() != classes {
            return bad(format!(
                "{} probabilities for {classes} classes",
                it.probabilities.len()
            ));
        }
        if it.truth >= classes || it.predicted >= classes {
            return bad(format!(
                "class index out of range ({} / {} of {classes})",
                it.truth, it.predicted
            ));
        }
        if it
            .probabilities
            .iter()
            .any(|p| !(p.is_finite() && *p >= 0.0))
        {
            return bad("a probability is negative or not finite".into());
        }
    }
    Ok(())
}

pub fn accuracy(items: &[Scored]) -> f64 {
    items.iter().filter(|i| i.correct()).count() as f64 / items.len() as f64
}

/// `m[true][predicted]`.
pub fn confusion(items: &[Scored], classes: usize) -> Vec<Vec<u64>> {
    let mut m = vec![vec![0u64; classes]; classes];
    for it in items {
        m[it.truth][it.predicted] += 1;
    }
    m
}

/// Per-class F1 (None for a class neither true nor predicted) and their macro mean.
pub fn f1(items: &[Scored], classes: usize) -> (Vec<Option<f64>>, f64) {
    let m = confusion(items, classes);
    let per: Vec<Option<f64>> = (0..classes)
        .map(|k| {
            let tp = m[k][k] as f64;
            let fn_ = m[k].iter().sum::<u64>() as f64 - tp;
            let fp = (0..classes).map(|t| m[t][k]).sum::<u64>() as f64 - tp;
            let denom = 2.0 * tp + fp + fn_;
            (denom > 0.0).then(|| 2.0 * tp / denom)
        })
        .collect();
    let present: Vec<f64> = per.iter().flatten().copied().collect();
    let macro_f1 = if present.is_empty() {
        0.0
    } else {
        present.iter().sum::<f64>() / present.len() as f64
    };
    (per, macro_f1)
}

/// Multi-class Brier score: mean over items of Σ_k (p_k − y_k)².
pub fn brier(items: &[Scored]) -> f64 {
    items
        .iter()
        .map(|it| {
            it.probabilities
                .iter()
                .enumerate()
                .map(|(k, p)| {
                    let y = if k == it.truth { 1.0 } else { 0.0 };
                    (p - y) * (p - y)
                })
                .sum::<f64>()
        })
        .sum::<f64>()
        / items.len() as f64
}

/// Mean −ln p_true, p clipped to [ε, 1 − ε].
pub fn log_loss(items: &[Scored]) -> f64 {
    let eps = f64::EPSILON;
    items
        .iter()
        .map(|it| -it.probabilities[it.truth].clamp(eps, 1.0 - eps).ln())
        .sum::<f64>()
        / items.len() as f64
}

/// How ECE bins are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Binning {
    EqualWidth,
    EqualMass,
}

/// One reliability bin.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Bin {
    /// Confidence range the bin covers (for equal mass: its items' min and max confidence).
    pub lower: f64,
    pub upper: f64,
    pub count: usize,
    /// None for an empty bin.
    pub accuracy: Option<f64>,
    pub mean_confidence: Option<f64>,
}

/// Reliability bins and the ECE they give.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reliability {
    pub binning: Binning,
    pub bins: Vec<Bin>,
    pub ece: f64,
}

pub fn reliability(
    items: &[Scored],
    bins: usize,
    binning: Binning,
) -> Result<Reliability, MetricsError> {
    if bins == 0 {
        return Err(MetricsError::ZeroBins);
    }
    if items.is_empty() {
        return Err(MetricsError::Empty);
    }
    let n = items.len();
    let mut groups: Vec<Vec<&Scored>> = vec![Vec::new(); bins];
    let mut ranges: Vec<(f64, f64)> = Vec::with_capacity(bins);
    match binning {
        Binning::EqualWidth => {
            for it in items {
                let c = it.confidence().clamp(0.0, 1.0);
                let b = ((c * bins as f64).floor() as usize).min(bins - 1);
                groups[b].push(it);
            }
            for b in 0..bins {
                ranges.push((b as f64 / bins as f64, (b + 1) as f64 / bins as f64));
            }
        }
        Binning::EqualMass => {
            let mut sorted: Vec<&Scored> = items.iter().collect();
            sorted.sort_by(|a, b| a.confidence().total_cmp(&b.confidence()));
            for (b, group) in groups.iter_mut().enumerate() {
                let (from, to) = (b * n / bins, (b + 1) * n / bins);
                *group = sorted[from..to].to_vec();
                let lo = group.first().map_or(f64::NAN, |i| i.confidence());
                let hi = group.last().map_or(f64::NAN, |i| i.confidence());
                ranges.push((lo, hi));
            }
        }
    }
    let mut ece = 0.0;
    let out = groups
        .iter()
        .zip(ranges)
        .map(|(g, (lower, upper))| {
            let count = g.len();
            let (accuracy, mean_confidence) = if count == 0 {
                (None, None)
            } else {
                let acc = g.iter().filter(|i| i.correct()).count() as f64 / count as f64;
                let conf = g.iter().map(|i| i.confidence()).sum::<f64>() / count as f64;
                ece += count as f64 / n as f64 * (acc - conf).abs();
                (Some(acc), Some(conf))
            };
            Bin {
                lower,
                upper,
                count,
                accuracy,
                mean_confidence,
            }
        })
        .collect();
    Ok(Reliability {
        binning,
        bins: out,
        ece,
    })
}

/// Every metric of one field.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FieldMetrics {
    pub n: usize,
    pub accuracy: f64,
    pub macro_f1: f64,
    /// Per class F1 (null for a class neither true nor predicted).
    pub f1: Vec<Option<f64>>,
    /// `confusion[true][predicted]`.
    pub confusion: Vec<Vec<u64>>,
    pub brier: f64,
    pub log_loss: f64,
    pub mean_confidence: f64,
    pub ece_equal_width: f64,
    pub ece_equal_mass: f64,
    pub bins: usize,
    pub reliability_equal_width: Reliability,
    pub reliability_equal_mass: Reliability,
}

pub fn field_metrics(
    items: &[Scored],
    classes: usize,
    bins: usize,
) -> Result<FieldMetrics, MetricsError> {
    check(items, classes)?;
    let (f1, macro_f1) = f1(items, classes);
    let width = reliability(items, bins, Binning::EqualWidth)?;
    let mass = reliability(items, bins, Binning::EqualMass)?;
    Ok(FieldMetrics {
        n: items.len(),
        accuracy: accuracy(items),
        macro_f1,
        f1,
        confusion: confusion(items, classes),
        brier: brier(items),
        log_loss: log_loss(items),
        mean_confidence: items.iter().map(Scored::confidence).sum::<f64>() / items.len() as f64,
        ece_equal_width: width.ece,
        ece_equal_mass: mass.ece,
        bins,
        reliability_equal_width: width,
        reliability_equal_mass: mass,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    fn reference() -> Value {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fixtures/reference/metrics.json"
        );
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    fn items_of(case: &Value) -> (Vec<Scored>, usize) {
        let n = case["n_classes"].as_u64().unwrap() as usize;
        let idx = |v: &Value| v.as_u64().unwrap() as usize;
        let items = case["y_true"]
            .as_array()
            .unwrap()
            .iter()
            .zip(case["y_pred"].as_array().unwrap())
            .zip(case["probs"].as_array().unwrap())
            .map(|((t, p), probs)| Scored {
                truth: idx(t),
                predicted: idx(p),
                probabilities: probs
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap())
                    .collect(),
            })
            .collect();
        (items, n)
    }

    #[test]
    fn metrics_equal_scikit_learns_figures() {
        let r = reference();
        let cases = r["cases"].as_array().unwrap();
        assert!(cases.len() >= 4);
        for case in cases {
            let name = case["name"].as_str().unwrap();
            let (items, n) = items_of(case);
            let m = field_metrics(&items, n, 10).unwrap();
            let close = |a: f64, key: &str| {
                let b = case[key].as_f64().unwrap();
                assert!((a - b).abs() < 1e-12, "{name} {key}: {a} vs sklearn {b}");
            };
            close(m.accuracy, "accuracy");
            close(m.macro_f1, "macro_f1");
            close(m.log_loss, "log_loss");
            close(m.brier, "brier_multiclass");
            if let Some(b) = case.get("brier_binary_sklearn") {
                assert!(
                    (m.brier - 2.0 * b.as_f64().unwrap()).abs() < 1e-12,
                    "{name}"
                );
            }
            let want: Vec<Vec<u64>> =
                serde_json::from_value(case["confusion_matrix"].clone()).unwrap();
            assert_eq!(m.confusion, want, "{name}");
        }
    }

    fn item(truth: usize, predicted: usize, p_predicted: f64) -> Scored {
        let mut probabilities = vec![0.0; 2];
        probabilities[predicted] = p_predicted;
        probabilities[1 - predicted] = 1.0 - p_predicted;
        Scored {
            truth,
            predicted,
            probabilities,
        }
    }

    #[test]
    fn ece_by_hand() {
        // conf 0.9 right, 0.9 wrong, 0.6 right, 0.7 right. Equal width, 10 bins: bin 9 {0.9, 0.9}
        // acc 0.5 conf 0.9; bin 6 {0.6} acc 1 conf 0.6; bin 7 {0.7} acc 1 conf 0.7.
        // ECE = 0.5·0.4 + 0.25·0.4 + 0.25·0.3 = 0.375.
        let items = [
            item(0, 0, 0.9),
            item(1, 0, 0.9),
            item(1, 1, 0.6),
            item(0, 0, 0.7),
        ];
        let w = reliability(&items, 10, Binning::EqualWidth).unwrap();
        assert!((w.ece - 0.375).abs() < 1e-12, "{w:?}");
        assert_eq!(w.bins.iter().map(|b| b.count).sum::<usize>(), 4);
        // Equal mass, 2 bins: sorted 0.6 (right), 0.7 (right) | 0.9 right, 0.9 wrong.
        // bin 0: acc 1, conf 0.65 → 0.35; bin 1: acc 0.5, conf 0.9 → 0.4; ECE = 0.375.
        let m = reliability(&items, 2, Binning::EqualMass).unwrap();
        assert!((m.ece - 0.375).abs() < 1e-12, "{m:?}");
        assert_eq!(m.bins[0].count, 2);
        // a confidence of exactly 1 lands in the last equal-width bin
        let one = reliability(&[item(0, 0, 1.0)], 10, Binning::EqualWidth).unwrap();
        assert_eq!(one.bins[9].count, 1);
        assert_eq!(one.ece, 0.0);
        assert_eq!(
            reliability(&items, 0, Binning::EqualMass),
            Err(MetricsError::ZeroBins)
        );
    }

    #[test]
    fn perfectly_calibrated_data_has_a_small_ece() {
        // Deterministic: for each confidence level c = 0.05, 0.15, …, 0.95, 500 items of which
        // exactly 500·c are right; each level fills one equal-width and one equal-mass bin.
        let mut items = Vec::new();
        for step in 0..10 {
            let c = 0.05 + 0.1 * step as f64;
            let right = (500.0 * c).round() as usize;
            for i in 0..500 {
                let truth = if i < right { 0 } else { 1 };
                items.push(item(truth, 0, c));
            }
        }
        for binning in [Binning::EqualWidth, Binning::EqualMass] {
            let r = reliability(&items, 10, binning).unwrap();
            assert!(r.ece < 1e-9, "{binning:?}: {}", r.ece);
        }
        // and an over-confident model is caught: same outcomes, confidence 0.99
        let over: Vec<Scored> = items.iter().map(|i| item(i.truth, 0, 0.99)).collect();
        assert!(reliability(&over, 10, Binning::EqualWidth).unwrap().ece > 0.2);
    }

    proptest! {
        #[test]
        fn ece_lies_in_the_unit_interval(
            raw in proptest::collection::vec((0usize..3, 0usize..3, proptest::collection::vec(0.001f64..1.0, 3)), 1..60),
            bins in 1usize..20,
        ) {
            let items: Vec<Scored> = raw.into_iter().map(|(t, p, w)| {
                let s: f64 = w.iter().sum();
                Scored { truth: t, predicted: p, probabilities: w.iter().map(|x| x / s).collect() }
            }).collect();
            for binning in [Binning::EqualWidth, Binning::EqualMass] {
                let r = reliability(&items, bins, binning).unwrap();
                prop_assert!((0.0..=1.0).contains(&r.ece), "{}", r.ece);
                prop_assert_eq!(r.bins.iter().map(|b| b.count).sum::<usize>(), items.len());
            }
            let m = field_metrics(&items, 3, bins).unwrap();
            prop_assert!((0.0..=2.0).contains(&m.brier));
            prop_assert!((0.0..=1.0).contains(&m.macro_f1));
        }
    }
}
