//! The bf16 kernel held to the plain-Rust sums (f64) and its packing to bf16 rounding.

use super::super::host::checks::{max_rel_to, sum_tolerance};
use super::*;
use crate::cpu::testing::Rng;

/// `len` values uniform in [-1, 1).
fn random(len: usize) -> Vec<f32> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEED: AtomicU64 = AtomicU64::new(1);
    Rng::new(SEED.fetch_add(1, Ordering::Relaxed)).uniform(len, -1.0, 1.0)
}

/// The product the kernel computes, in plain Rust: per output, `Σ bf16(x) · w` over the
/// weight's bf16 values, summed in f64 (bf16 subnormals read as 0, as `vdpbf16ps` reads them).
fn product_reference(x: &[f32], m: usize, w: &PackedBf16) -> Vec<f64> {
    let (n, k) = w.dims();
    let flush = |v: f32| {
        if v.abs() < f32::MIN_POSITIVE {
            0.0
        } else {
            v as f64
        }
    };
    let wr: Vec<f64> = w.rows().into_iter().map(flush).collect();
    let mut y = vec![0f64; m * n];
    for r in 0..m {
        let xs: Vec<f64> = x[r * k..][..k]
            .iter()
            .map(|&v| flush(bf16_value(bf16_bits(v))))
            .collect();
        for c in 0..n {
            y[r * n + c] = xs.iter().zip(&wr[c * k..][..k]).map(|(a, b)| a * b).sum();
        }
    }
    y
}

/// Packing rounds every weight to nearest even bf16 and unpacks to exactly those values;
/// an odd `k` and a ragged last panel come back without the padding.
#[test]
fn packing_rounds_to_bf16_and_unpacks_exactly() {
    for (n, k) in [(1, 1), (16, 2), (17, 3), (33, 64), (5, 897)] {
        let w = random(n * k);
        let p = PackedBf16::from_rows(&w, n, k);
        assert_eq!(p.dims(), (n, k));
        let want: Vec<f32> = w.iter().map(|&v| bf16_value(bf16_bits(v))).collect();
        assert_eq!(p.rows(), want, "({n}, {k})");
    }
}

/// The kernel equals the plain-Rust sums within f32 rounding (the f32 kernels' tolerance:
/// 2e-6 of the largest output, growing like √k) on every tail: 1-row and odd row counts, rows past the row block,
/// ragged last panels after odd and even counts of whole ones, odd `k`, `k` past the `k`
/// block and past `short_k` (the other loop order), blockings from the default to 1-row
/// tiles. (The backends' shell holds 3-D and strided inputs to the same path.)
#[test]
fn bf16_linear_equals_the_reference() -> Result<()> {
    if !has_bf16_dot() {
        eprintln!("skipped: this CPU has no AVX-512 BF16");
        return Ok(());
    }
    let default = Blocking::default_for(Isa::Avx512);
    let blockings = [
        default,
        Blocking::parse("mr=1,mc=3,kc=5,nc=1,short_k=0", Isa::Avx512).expect("spec"),
        Blocking::parse("mr=5,mc=10,kc=7,nc=3", Isa::Avx512).expect("spec"),
    ];
    for bl in &blockings {
        for (m, n, k) in [
            (1, 16, 2),
            (3, 17, 3),
            (14, 48, 64),
            (29, 40, 129),
            (90, 33, 896),
            (15, 64, 3101),
        ] {
            let x = random(m * k);
            let w = PackedBf16::from_rows(&random(n * k), n, k);
            let got = product(&x, m, &w, bl)?;
            assert_eq!(got.len(), m * n);
            let want = product_reference(&x, m, &w);
            let tol = sum_tolerance(k) as f64;
            let err = max_rel_to(&got, &want);
            assert!(
                err <= tol,
                "{bl:?} ({m}, {n}, {k}): error {err:e} > {tol:e}"
            );
        }
    }
    Ok(())
}

/// Stacking equals packing the stacked rows, aligned parts (panels concatenated) and
/// unaligned ones (packed again) alike; differing `in` or an empty list is `None`.
#[test]
fn stacking_equals_packing_the_stacked_rows() {
    let k = 35;
    for ns in [[16, 32, 5], [7, 16, 9]] {
        let rows: Vec<Vec<f32>> = ns.iter().map(|&n| random(n * k)).collect();
        let parts: Vec<PackedBf16> = rows
            .iter()
            .zip(ns)
            .map(|(r, n)| PackedBf16::from_rows(r, n, k))
            .collect();
        let stacked = PackedBf16::stack(&parts.iter().collect::<Vec<_>>()).expect("stack");
        let all: Vec<f32> = rows.concat();
        let want = PackedBf16::from_rows(&all, ns.iter().sum(), k);
        assert_eq!(stacked.dims(), want.dims());
        assert_eq!(&*stacked.panels, &*want.panels, "{ns:?}");
    }
    let a = PackedBf16::from_rows(&random(16 * 4), 16, 4);
    let b = PackedBf16::from_rows(&random(16 * 6), 16, 6);
    assert!(PackedBf16::stack(&[&a, &b]).is_none());
    assert!(PackedBf16::stack(&[]).is_none());
}
