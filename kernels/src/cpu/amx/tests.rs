//! The split arithmetic against exact products, the blocking specs, and (where AMX runs) the
//! tiles against the f64 sums of the kept part products.

use super::super::host::checks::{max_rel_to, sum_tolerance};
use super::*;
use crate::cpu::testing::Rng;
use proptest::prelude::*;

/// The f32 product the kernel computes, in plain Rust, summed in f64: per output the six kept
/// part products (three parts; the tests hold the split arithmetic to an exact product with
/// it, and the kernel to candle's matmul), or `Σ bf16(x) · bf16(w)` (one part; the kernel is
/// held to it).
fn product_reference(x: &[f32], m: usize, w: &AmxWeight) -> Vec<f64> {
    let (n, k) = (w.n, w.k);
    let wr: Vec<[u16; 3]> = w.rows().iter().map(|&v| split(v)).collect();
    let mut y = vec![0f64; m * n];
    for r in 0..m {
        let xs: Vec<[u16; 3]> = x[r * k..][..k].iter().map(|&v| split(v)).collect();
        for c in 0..n {
            let mut s = 0f64;
            for kk in 0..k {
                let (a, b) = (xs[kk], wr[c * k + kk]);
                let v = |i: usize, j: usize| bf16_value(a[i]) as f64 * bf16_value(b[j]) as f64;
                s += match w.parts {
                    Parts::Three => v(0, 0) + v(0, 1) + v(1, 0) + v(0, 2) + v(2, 0) + v(1, 1),
                    Parts::One => v(0, 0),
                };
            }
            y[r * n + c] = s;
        }
    }
    y
}

proptest! {
    /// The three parts sum back to the value exactly, for every finite f32 from 2⁻¹¹⁰ up
    /// and zero.
    #[test]
    fn the_split_sums_back_exactly(bits in any::<u32>()) {
        let v = f32::from_bits(bits);
        prop_assume!(v.is_finite() && (v == 0.0 || v.abs() >= 2f32.powi(-110)));
        let [h, m, l] = split(v);
        prop_assert_eq!(bf16_value(h) + (bf16_value(m) + bf16_value(l)), v);
        // each part is a bf16 that is no larger than the remainder it rounds
        prop_assert!(bf16_value(m).abs() <= bf16_value(h).abs());
    }
}

proptest! {
    /// The activations' branch-free rounding gives the guarded rounding's bits for every
    /// finite value up to the largest bf16.
    #[test]
    fn fast_rounding_equals_guarded_rounding(bits in any::<u32>()) {
        let v = f32::from_bits(bits);
        prop_assume!(v.is_finite() && v.abs() <= bf16_value(0x7F7F));
        prop_assert_eq!(bf16_bits_fast(v), bf16_bits(v));
    }
}

#[test]
fn amx_blocking_specs_are_parsed_or_refused_by_name() {
    assert_eq!(AmxBlocking::parse(""), Ok(AmxBlocking::DEFAULT));
    assert_eq!(
        AmxBlocking::parse("mc=64, pf=2,kb=4"),
        Ok(AmxBlocking {
            mc: 64,
            pf: 2,
            kb: 4,
            kc: 0,
            nb: 0,
            hot: false
        })
    );
    for (spec, says) in [
        ("mc=48", "multiple of 32"),
        ("mc=0", "multiple of 32"),
        ("pf=x", "`x` is not a count"),
        ("nc=2", "unknown key `nc`"),
        ("mc", "not key=value"),
    ] {
        let e = AmxBlocking::parse(spec).expect_err(spec);
        assert!(e.contains(says), "{spec}: {e}");
    }
}

#[test]
fn non_finite_values_keep_their_kind() {
    assert!(bf16_value(split(f32::NAN)[0]).is_nan());
    assert_eq!(bf16_value(split(f32::INFINITY)[0]), f32::INFINITY);
    let big = split(f32::MAX);
    let back = bf16_value(big[0]) + (bf16_value(big[1]) + bf16_value(big[2]));
    assert_eq!(back, f32::MAX);
}

fn exact(x: &[f32], m: usize, w: &[f32], n: usize, k: usize) -> Vec<f64> {
    let mut y = vec![0f64; m * n];
    for r in 0..m {
        for c in 0..n {
            y[r * n + c] = (0..k)
                .map(|kk| x[r * k + kk] as f64 * w[c * k + kk] as f64)
                .sum();
        }
    }
    y
}

/// The six kept part products are an f32-accurate product: against the exact sum, their
/// error is within a few f32 roundings of the row's magnitude, on random and on
/// wide-ranging values; the planes give back the weight's rows bit for bit.
#[test]
fn six_part_products_are_f32_accurate() {
    let mut rng = Rng::new(4);
    for (m, n, k, scale) in [
        (5usize, 19usize, 70usize, 1.0f32),
        (3, 33, 257, 1e3),
        (2, 16, 32, 1e-3),
    ] {
        let x = rng.normal(m * k, scale);
        let wv = rng.normal(n * k, 1.0);
        let w = AmxWeight::from_rows(&wv, n, k);
        assert_eq!(w.rows(), wv);
        let got = product_reference(&x, m, &w);
        let want = exact(&x, m, &wv, n, k);
        for r in 0..m {
            for c in 0..n {
                let mag: f64 = (0..k)
                    .map(|kk| (x[r * k + kk] * wv[c * k + kk]).abs() as f64)
                    .sum();
                let d = (got[r * n + c] - want[r * n + c]).abs();
                assert!(
                    d <= f32::EPSILON as f64 / 4.0 * mag,
                    "({m},{n},{k}) [{r},{c}]: {d:e} vs {mag:e}"
                );
            }
        }
    }
}

/// Stacking split weights equals splitting the stacked rows, aligned (planes concatenated)
/// or not (rows split again); differing `in` is refused.
#[test]
fn stacking_split_weights_equals_splitting_the_stack() {
    for rows in [[32usize, 16, 7], [5, 16, 9]] {
        let parts: Vec<Vec<f32>> = rows
            .iter()
            .enumerate()
            .map(|(i, &r)| {
                (0..r * 40)
                    .map(|j| ((i * 7919 + j) as f32 * 0.37).sin())
                    .collect()
            })
            .collect();
        let ws: Vec<AmxWeight> = parts
            .iter()
            .zip(rows)
            .map(|(p, r)| AmxWeight::from_rows(p, r, 40))
            .collect();
        let stacked = AmxWeight::stack(&ws.iter().collect::<Vec<_>>()).expect("one in");
        let all: Vec<f32> = parts.concat();
        assert_eq!(stacked.dims(), (rows.iter().sum(), 40));
        assert_eq!(stacked.rows(), all);
        let direct = AmxWeight::from_rows(&all, rows.iter().sum(), 40);
        for i in 0..3 {
            assert_eq!(&*stacked.planes[i], &*direct.planes[i]);
        }
    }
    let a = AmxWeight::from_rows(&[0.0; 8], 1, 8);
    let b = AmxWeight::from_rows(&[0.0; 9], 1, 9);
    assert!(AmxWeight::stack(&[&a, &b]).is_none());
    assert!(AmxWeight::stack(&[]).is_none());
}

/// One part is the value rounded to nearest even bf16, the rounding of the AVX-512 BF16
/// kernel's packing; it stacks (aligned or not) like three, and one- and three-part weights
/// do not stack together.
#[test]
fn one_part_is_the_bf16_rounding() {
    let (n, k) = (21, 70);
    let w: Vec<f32> = (0..n * k).map(|j| (j as f32 * 0.61).sin() * 3.0).collect();
    let one = AmxWeight::split_rows(&w, n, k, Parts::One);
    assert_eq!(one.parts(), Parts::One);
    let bf16 = super::super::bf16::PackedBf16::from_rows(&w, n, k);
    assert_eq!(one.rows(), bf16.rows());
    for split_at in [16, 5] {
        let (a, b) = (
            AmxWeight::split_rows(&w[..split_at * k], split_at, k, Parts::One),
            AmxWeight::split_rows(&w[split_at * k..], n - split_at, k, Parts::One),
        );
        let stacked = AmxWeight::stack(&[&a, &b]).expect("one part, one in");
        assert_eq!(stacked.parts(), Parts::One);
        assert_eq!(&*stacked.planes[0], &*one.planes[0], "split at {split_at}");
    }
    let three = AmxWeight::from_rows(&w, n, k);
    assert!(AmxWeight::stack(&[&one, &three]).is_none());
}

/// Where AMX runs: one-part (bf16) products equal their plain-Rust sums within f32
/// rounding on every tail and blocking (as the three-part test below); elsewhere nothing
/// to run.
#[test]
fn amx_bf16_linear_equals_the_reference() -> Result<()> {
    if !available() {
        eprintln!("no AMX bf16 tiles here: the AMX kernel does not run");
        return Ok(());
    }
    for spec in ["", "mc=32", "kb=3,mc=64,pf=1", "kc=3", "nb=3,kc=4"] {
        let bl = AmxBlocking::parse(spec).expect("valid");
        for (m, n, k) in [
            (37usize, 130usize, 96usize),
            (1, 7, 896),
            (150, 33, 300),
            (13, 40, 4864),
            (AmxBlocking::DEFAULT.mc + 45, 80, 257),
        ] {
            let x: Vec<f32> = (0..m * k)
                .map(|j| ((j * 7 + 3) as f32 * 0.37).sin())
                .collect();
            let wv: Vec<f32> = (0..n * k)
                .map(|j| ((j * 5 + 1) as f32 * 0.53).cos())
                .collect();
            let w = AmxWeight::split_rows(&wv, n, k, Parts::One);
            let got = product(&x, m, &w, &bl)?;
            let want = product_reference(&x, m, &w);
            let d = max_rel_to(&got, &want);
            let tol = sum_tolerance(k) as f64;
            assert!(d <= tol, "{spec} ({m}, {n}, {k}): {d:e}");
        }
    }
    Ok(())
}

/// The in-place kernels' test shapes `(m, F, k)`: ragged rows, one row, several weight blocks
/// (`k` = 4864), odd panels, ragged `k`, tiny `k`.
const IN_PLACE_SHAPES: [(usize, usize, usize); 5] = [
    (37, 32, 96),
    (1, 16, 896),
    (150, 48, 4864),
    (64, 96, 257),
    (33, 16, 31),
];

/// `len` deterministic values in [-1, 1] (a sine ramp from `seed`).
fn ramp(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|j| ((j * 7 + seed) as f32 * 0.37).sin())
        .collect()
}

/// The bit patterns of `v`, for bit-for-bit comparisons.
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Where AMX runs: the in-place bf16 product (weight blocks, row chunks, stores straight into
/// `y`) equals the blocked product bit for bit on ragged rows, odd panels, ragged `k`, several
/// weight blocks (`k` = 4864: one panel pair per block) and several row chunks; its SwiGLU over
/// an alternating gate | up weight equals the stacked product followed by `silu_mul` on each
/// row's halves, bit for bit.
#[test]
fn in_place_bf16_product_and_swiglu_equal_the_blocked_product() -> Result<()> {
    if !available() {
        eprintln!("no AMX bf16 tiles here: the in-place kernel does not run");
        return Ok(());
    }
    for (m, f, k) in IN_PLACE_SHAPES {
        let x = ramp(m * k, 3);
        let (g, u) = (ramp(f * k, 5), ramp(f * k, 11));
        let gate = AmxWeight::split_rows(&g, f, k, Parts::One);
        let up = AmxWeight::split_rows(&u, f, k, Parts::One);
        let stacked = AmxWeight::stack(&[&gate, &up]).expect("one k");
        let blocked = product(&x, m, &stacked, &AmxBlocking::DEFAULT)?;
        assert_eq!(
            bits(&bf16_product(&x, m, &stacked)?),
            bits(&blocked),
            "({m}, {f}, {k})"
        );
        // odd panel counts and a ragged last panel: the gate alone, and 7 columns of it
        for n in [f, 7] {
            let w = AmxWeight::split_rows(&g[..n * k], n, k, Parts::One);
            let want = product(&x, m, &w, &AmxBlocking::DEFAULT)?;
            assert_eq!(
                bits(&bf16_product(&x, m, &w)?),
                bits(&want),
                "({m}, {n}, {k})"
            );
        }
        let mut want = vec![0f32; m * f];
        for (row, out) in blocked.chunks_exact(2 * f).zip(want.chunks_exact_mut(f)) {
            crate::cpu::math::silu_mul(&row[..f], &row[f..], out);
        }
        let gu = AmxWeight::gate_up(&gate, &up).expect("whole panels");
        assert_eq!(
            bits(&bf16_swiglu_product(&x, m, &gu)?),
            bits(&want),
            "swiglu ({m}, {f}, {k})"
        );
    }
    Ok(())
}

/// The in-place entry points refuse what they cannot compute, with the reason.
#[test]
fn in_place_bf16_refuses_wrong_operands() {
    let w3 = AmxWeight::split_rows(&[0.5f32; 32 * 64], 32, 64, Parts::Three);
    let w1 = AmxWeight::split_rows(&[0.5f32; 32 * 64], 32, 64, Parts::One);
    let odd = AmxWeight::split_rows(&[0.5f32; 8 * 64], 8, 64, Parts::One);
    assert!(
        AmxWeight::gate_up(&odd, &odd).is_none(),
        "8 outputs are not a panel"
    );
    assert!(AmxWeight::gate_up(&w3, &w3).is_none(), "three parts");
    assert!(AmxWeight::gate_up(&w1, &odd).is_none(), "shapes differ");
    if !available() {
        assert!(bf16_product(&[0.0; 64], 1, &w1).is_err());
        return;
    }
    let e = bf16_product(&[0.0; 64], 1, &w3).unwrap_err().to_string();
    assert!(e.contains("three parts"), "{e}");
    let e = bf16_product(&[0.0; 63], 1, &w1).unwrap_err().to_string();
    assert!(e.contains("63 values are not 1 rows of 64"), "{e}");
    let e = bf16_swiglu_product(&[0.0; 64], 1, &odd)
        .unwrap_err()
        .to_string();
    assert!(e.contains("not whole gate | up panel pairs"), "{e}");
}

/// The per-row int8 rounding: every value within half a step of its row's scale, the largest
/// magnitude on ±127, zero rows at scale 0, a non-finite value making the scale non-finite.
#[test]
fn int8_rows_round_within_half_a_step() {
    let mut rng = Rng::new(23);
    for k in [1usize, 31, 64, 300] {
        let v = rng.uniform(k, -3.0, 3.0);
        let mut q = vec![0i8; k];
        let s = int8::round_row(&v, &mut q);
        let amax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert_eq!(s, amax / 127.0);
        for (&x, &qi) in v.iter().zip(&q) {
            assert!(
                (x - qi as f32 * s).abs() <= 0.5 * s * 1.0001,
                "{x} {qi} {s}"
            );
        }
        assert!(q.iter().any(|&x| x.unsigned_abs() == 127));
        let inv = 127.0 / amax;
        for (&x, &qi) in v.iter().zip(&q) {
            assert_eq!(qi as f32, (x * inv).round_ties_even(), "{x}");
        }
    }
    // the vector form equals the plain one on every length and on ties
    for k in [1usize, 15, 16, 17, 64, 333] {
        let mut v = rng.uniform(k, -5.0, 5.0);
        v[0] = 127.0 / 254.0 * 5.0; // a tie when the maximum is 5
        v[k - 1] = 5.0;
        let (mut a, mut b) = (vec![0i8; k], vec![0i8; k]);
        assert_eq!(
            int8::round_row(&v, &mut a),
            int8::round_row_portable(&v, &mut b)
        );
        assert_eq!(a, b, "k {k}");
    }
    let mut q = vec![5i8; 4];
    assert_eq!(int8::round_row(&[0.0; 4], &mut q), 0.0);
    assert_eq!(q, [0; 4]);
    assert!(!int8::round_row(&[1.0, f32::INFINITY], &mut q[..2]).is_finite());
    assert!(!int8::round_row(&[f32::NAN, 1.0], &mut q[..2]).is_finite());
    assert_eq!(q[..2], [0, 0]);
}

/// Where AMX-INT8 runs: the int8 product equals its plain-Rust reference bit for bit (ragged
/// rows, odd panels, ragged `k`, a wide `k` cut into chunks), its SwiGLU equals the stacked
/// product followed by `silu_mul` bit for bit; the dequantized rows are the scaled values.
#[test]
fn int8_product_and_swiglu_equal_the_reference() -> Result<()> {
    let w = AmxI8Weight::quantize_rows(&ramp(7 * 40, 1), 7, 40);
    for (got, want) in w.rows().iter().zip(ramp(7 * 40, 1)) {
        assert!((got - want).abs() <= 0.5 / 127.0 * 1.0001, "{got} {want}");
    }
    if !q8_available() {
        assert!(int8_product(&[0.0; 40], 1, &w).is_err());
        eprintln!("no AMX-INT8 tiles here: the int8 kernel does not run");
        return Ok(());
    }
    // and a wide `k` cut into chunks (600 rows of 4864)
    for (m, f, k) in IN_PLACE_SHAPES.into_iter().chain([(600, 16, 4864)]) {
        let x = ramp(m * k, 3);
        let (g, u) = (ramp(f * k, 5), ramp(f * k, 11));
        let gate = AmxI8Weight::quantize_rows(&g, f, k);
        let up = AmxI8Weight::quantize_rows(&u, f, k);
        for n in [f, 7] {
            let w = AmxI8Weight::quantize_rows(&g[..n * k], n, k);
            let want = int8::product_reference(&x, m, &w);
            assert_eq!(
                bits(&int8_product(&x, m, &w)?),
                bits(&want),
                "({m}, {n}, {k})"
            );
        }
        let stacked: Vec<f32> = g.iter().chain(&u).copied().collect();
        let full = int8_product(&x, m, &AmxI8Weight::quantize_rows(&stacked, 2 * f, k))?;
        let mut want = vec![0f32; m * f];
        for (row, out) in full.chunks_exact(2 * f).zip(want.chunks_exact_mut(f)) {
            crate::cpu::math::silu_mul(&row[..f], &row[f..], out);
        }
        let gu = AmxI8Weight::gate_up(&gate, &up).expect("whole panels");
        assert_eq!(
            bits(&int8_swiglu_product(&x, m, &gu)?),
            bits(&want),
            "swiglu ({m}, {f}, {k})"
        );
    }
    let e = int8_product(&[0.0; 39], 1, &w).unwrap_err().to_string();
    assert!(e.contains("39 values are not 1 rows of 40"), "{e}");
    Ok(())
}
