//! Pure pieces of `forkscore calibrate`: the seeded stratified split and the one-dimensional
//! temperature fit.
//!
//! Calibrated probabilities of an item: softmax(s / T − b) over its classes, `s` the log-scores
//! at T = 1 and `b` an optional per-class shift (ln of the content-free probabilities of
//! contextual calibration). The fit minimises the mean negative log-likelihood of the true class
//! over the training items by golden-section search on ln T over [ln 0.05, ln 20]; the NLL is
//! convex in 1/T, hence unimodal in ln T, so the search finds its minimum within the bounds.

/// The calibrated probabilities of one item.
pub fn probabilities(s: &[f32], t: f64, shift: Option<&[f64]>) -> Vec<f64> {
    let z: Vec<f64> = s
        .iter()
        .enumerate()
        .map(|(k, &v)| f64::from(v) / t - shift.map_or(0.0, |b| b[k]))
        .collect();
    let max = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = z.iter().map(|v| (v - max).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.into_iter().map(|v| v / sum).collect()
}

/// Mean −ln p(true class) at temperature `t` (p floored at f64::MIN_POSITIVE).
pub fn nll(items: &[(&[f32], usize)], t: f64, shift: Option<&[f64]>) -> f64 {
    items
        .iter()
        .map(|(s, y)| -probabilities(s, t, shift)[*y].max(f64::MIN_POSITIVE).ln())
        .sum::<f64>()
        / items.len().max(1) as f64
}

pub const T_MIN: f64 = 0.05;
pub const T_MAX: f64 = 20.0;

/// The temperature in [`T_MIN`, `T_MAX`] minimising [`nll`] (1 for no items).
pub fn fit_temperature(items: &[(&[f32], usize)], shift: Option<&[f64]>) -> f64 {
    if items.is_empty() {
        return 1.0;
    }
    let f = |u: f64| nll(items, u.exp(), shift);
    let (mut a, mut b) = (T_MIN.ln(), T_MAX.ln());
    let g = (5f64.sqrt() - 1.0) / 2.0;
    let (mut c, mut d) = (b - g * (b - a), a + g * (b - a));
    let (mut fc, mut fd) = (f(c), f(d));
    for _ in 0..200 {
        if (b - a).abs() < 1e-10 {
            break;
        }
        if fc < fd {
            b = d;
            d = c;
            fd = fc;
            c = b - g * (b - a);
            fc = f(c);
        } else {
            a = c;
            c = d;
            fc = fd;
            d = a + g * (b - a);
            fd = f(d);
        }
    }
    ((a + b) / 2.0).exp()
}

/// splitmix64: a tiny, well-mixed deterministic generator (no dependency, stable forever).
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Split item indices `0..strata.len()` into (train, held-out): within each stratum (items with
/// equal keys, in first-seen order) a seeded Fisher–Yates shuffle, then the first items held out
/// — round(fraction × items seen so far) − held out so far, so the held-out total is
/// round(fraction × N) however small the strata (singletons alternate instead of all rounding
/// the same way). Both lists come back sorted.
pub fn stratified_split(strata: &[String], fraction: f64, seed: u64) -> (Vec<usize>, Vec<usize>) {
    let mut groups: indexmap::IndexMap<&str, Vec<usize>> = indexmap::IndexMap::new();
    for (i, k) in strata.iter().enumerate() {
        groups.entry(k.as_str()).or_default().push(i);
    }
    let mut rng = SplitMix(seed);
    let (mut train, mut held) = (Vec::new(), Vec::new());
    let mut seen = 0usize;
    for (_, mut g) in groups {
        for i in (1..g.len()).rev() {
            let j = (rng.next() % (i as u64 + 1)) as usize;
            g.swap(i, j);
        }
        seen += g.len();
        let target = (fraction * seen as f64).round() as usize;
        let h = target.saturating_sub(held.len()).min(g.len());
        held.extend_from_slice(&g[..h]);
        train.extend_from_slice(&g[h..]);
    }
    train.sort_unstable();
    held.sort_unstable();
    (train, held)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Items drawn from softmax(z / T_true): the fit recovers T_true.
    #[test]
    fn the_fit_recovers_a_known_temperature() {
        let mut rng = SplitMix(7);
        let mut unit = || (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
        for t_true in [0.5, 1.0, 2.5] {
            let mut data: Vec<(Vec<f32>, usize)> = Vec::new();
            for _ in 0..20_000 {
                let z: Vec<f32> = (0..4).map(|_| (unit() * 8.0 - 4.0) as f32).collect();
                let p = probabilities(&z, t_true, None);
                let r = unit();
                let mut acc = 0.0;
                let y = p
                    .iter()
                    .position(|&q| {
                        acc += q;
                        r < acc
                    })
                    .unwrap_or(3);
                data.push((z, y));
            }
            let items: Vec<(&[f32], usize)> =
                data.iter().map(|(z, y)| (z.as_slice(), *y)).collect();
            let t = fit_temperature(&items, None);
            assert!((t / t_true - 1.0).abs() < 0.05, "fitted {t} for {t_true}");
            assert!(nll(&items, t, None) <= nll(&items, t_true, None) + 1e-12);
        }
    }

    #[test]
    fn a_shift_divides_by_the_content_free_probabilities() {
        let s = [0.0f32, 0.0];
        let shift = [0.8f64.ln(), 0.2f64.ln()];
        let p = probabilities(&s, 1.0, Some(&shift));
        // (0.5 / 0.8, 0.5 / 0.2) renormalised = (0.2, 0.8)
        assert!(
            (p[0] - 0.2).abs() < 1e-12 && (p[1] - 0.8).abs() < 1e-12,
            "{p:?}"
        );
    }

    #[test]
    fn the_split_is_seeded_stratified_and_complete() {
        let strata: Vec<String> = (0..40).map(|i| format!("k{}", i % 4)).collect();
        let (train, held) = stratified_split(&strata, 0.5, 3);
        assert_eq!(train.len() + held.len(), 40);
        assert_eq!(held.len(), 20);
        for k in 0..4 {
            let n = held.iter().filter(|&&i| i % 4 == k).count();
            assert_eq!(n, 5, "stratum {k}");
        }
        assert_eq!(
            stratified_split(&strata, 0.5, 3),
            (train.clone(), held.clone())
        );
        assert_ne!(stratified_split(&strata, 0.5, 4).1, held);
        // all-singleton strata still split in half, not all one way
        let unique: Vec<String> = (0..17).map(|i| format!("u{i}")).collect();
        let (train, held) = stratified_split(&unique, 0.5, 0);
        assert_eq!((train.len(), held.len()), (8, 9));
    }
}
