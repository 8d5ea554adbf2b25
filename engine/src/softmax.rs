//! The numeric core of assembly: softmax(logits / T) in f64 and the first-wins argmax, shared
//! by code fields (`assemble`) and literal fields (`literal`). Pure functions over slices.

/// Index of the largest value; the first wins ties. NaN never wins.
pub fn argmax_first(values: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] || (values[best].is_nan() && !v.is_nan()) {
            best = i;
        }
    }
    best
}

/// softmax(logits / t) in f64.
pub fn softmax_scaled(logits: &[f32], t: f64) -> Vec<f64> {
    // Subtract the max before dividing: logits / t can overflow for a tiny t (inf - inf = NaN).
    let max = logits
        .iter()
        .map(|&l| f64::from(l))
        .fold(f64::NEG_INFINITY, f64::max);
    let exps: Vec<f64> = logits
        .iter()
        .map(|&l| ((f64::from(l) - max) / t).exp())
        .collect();
    let sum: f64 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

/// Index of the largest probability; the first wins ties (NaN never wins).
pub fn argmax_f64_first(values: &[f64]) -> usize {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] || (values[best].is_nan() && !v.is_nan()) {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_prefers_the_first_of_equal_values_and_skips_nan() {
        assert_eq!(argmax_first(&[1.0, 3.0, 3.0]), 1);
        assert_eq!(argmax_first(&[f32::NAN, 0.5, 0.5]), 1);
        assert_eq!(argmax_first(&[2.0]), 0);
    }

    #[test]
    fn softmax_is_normalised_and_temperature_flattens() {
        let p = softmax_scaled(&[1.0, 2.0, 3.0], 1.0);
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        let hot = softmax_scaled(&[1.0, 2.0, 3.0], 2.179);
        assert!(hot[2] < p[2] && hot[0] > p[0]);
        let big = softmax_scaled(&[1000.0, -1000.0], 1.0);
        assert_eq!(big, vec![1.0, 0.0]);
        // A tiny temperature is a hard argmax, never NaN.
        assert_eq!(
            softmax_scaled(&[1.0, 3.0, 2.0], 1e-310),
            vec![0.0, 1.0, 0.0]
        );
    }

    #[test]
    fn f64_argmax_prefers_the_first_of_equal_values_and_skips_nan() {
        assert_eq!(argmax_f64_first(&[0.25, 0.5, 0.5]), 1);
        assert_eq!(argmax_f64_first(&[f64::NAN, 0.5]), 1);
    }
}
