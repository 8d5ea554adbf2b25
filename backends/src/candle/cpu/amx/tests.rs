use super::super::host::checks::{max_rel, sum_tolerance};
use super::*;
use candle_core::{DType, Device};
use proptest::prelude::*;

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
fn six_part_products_are_f32_accurate() -> Result<()> {
    let dev = Device::Cpu;
    for (m, n, k, scale) in [
        (5usize, 19usize, 70usize, 1.0f32),
        (3, 33, 257, 1e3),
        (2, 16, 32, 1e-3),
    ] {
        let x = Tensor::randn(0f32, scale, (m, k), &dev)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let wv = Tensor::randn(0f32, 1.0, (n, k), &dev)?
            .flatten_all()?
            .to_vec1::<f32>()?;
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
    Ok(())
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
    let bf16 = super::super::bf16gemm::PackedBf16::from_rows(&w, n, k);
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
            let got = linear_with(&Tensor::from_vec(x.clone(), (m, k), &Device::Cpu)?, &w, &bl)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            let want = product_reference(&x, m, &w);
            let d = super::super::host::checks::max_rel_to(&got, &want);
            let tol = sum_tolerance(k) as f64;
            assert!(d <= tol, "{spec} ({m}, {n}, {k}): {d:e}");
        }
    }
    Ok(())
}

/// Where AMX-INT8 runs: `Q8_0` products on the int8 tiles equal the plain-Rust sums (and so
/// the VNNI kernel) bit for bit, on every tail: rows not a multiple of 16 or 32, ragged
/// and odd panel counts, one block, long `k`, a single row; `cpu_qgemm::linear` takes them.
/// Elsewhere the call is refused with a clear error.
#[test]
fn amx_q8_equals_the_reference_bit_for_bit() -> Result<()> {
    use super::super::isa::Isa;
    use super::super::qgemm::PackedQ8;
    use candle_core::quantized::{GgmlDType, QTensor};
    let dev = Device::Cpu;
    let q8 = |n: usize, k: usize| -> Result<Option<PackedQ8>> {
        let w = Tensor::randn(0f32, 0.3, (n, k), &dev)?;
        let bytes = QTensor::quantize(&w, GgmlDType::Q8_0)?.data()?.into_owned();
        Ok(PackedQ8::from_blocks(&bytes, n, k, Isa::Avx512))
    };
    if !q8_available() {
        eprintln!("no AMX-INT8 here: the int8 tiles do not run");
        let w = q8(16, 32)?.expect("fits");
        let e = q8_product(&[0.0; 32], 1, &w).expect_err("no AMX-INT8");
        assert!(e.to_string().contains("AMX"), "{e}");
        return Ok(());
    }
    for (m, n, k) in [
        (37usize, 130usize, 96usize),
        (1, 7, 64),
        (150, 33, 320),
        (13, 40, 4864),
        (64, 32, 32),
        (33, 16, 896),
        (17, 48, 128),
    ] {
        let w = q8(n, k)?.expect("k a multiple of 32");
        let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let got = q8_product(&x, m, &w)?;
        let want = super::super::qgemm::product_reference(&x, m, &w);
        assert!(
            got == want,
            "({m}, {n}, {k}): the int8 tiles differ from the sums"
        );
        if q8_runs()? {
            let xt = Tensor::from_vec(x.clone(), (m, k), &dev)?;
            let y = q8_linear(&xt, &w)?.flatten_all()?.to_vec1::<f32>()?;
            assert!(
                y == want,
                "({m}, {n}, {k}): linear did not take the tiles' sums"
            );
        }
    }
    Ok(())
}

/// Where AMX runs: the kernel equals candle's matmul to f32 rounding on every tail (rows not
/// a multiple of 16 or 32 or of the row block, ragged and odd panel counts, `k` not a
/// multiple of 32, a long `k`, 3-D and strided inputs, one row). Elsewhere it says so and
/// checks that the call is refused with a clear error.
#[test]
fn amx_linear_equals_candle_matmul() -> Result<()> {
    let dev = Device::Cpu;
    if !available() {
        eprintln!("no AMX bf16 tiles here: the AMX kernel does not run");
        let w = AmxWeight::from_rows(&[0.0; 8], 1, 8);
        let e = linear(&Tensor::zeros((2, 8), DType::F32, &dev)?, &w).expect_err("no AMX");
        assert!(e.to_string().contains("does not run AMX"), "{e}");
        return Ok(());
    }
    for spec in [
        "",
        "mc=32",
        "mc=64,pf=1",
        "mc=256,pf=2",
        "kb=1",
        "kb=3,mc=64",
        "kb=2,kc=5",
        "kc=3",
        "nb=1",
        "nb=3,kc=4",
    ] {
        let bl = AmxBlocking::parse(spec).expect("valid");
        for (xdims, n) in [
            (vec![37usize, 96], 130usize),
            (vec![2, 19, 64], 48),
            (vec![1, 1, 896], 7),
            (vec![150, 300], 33),
            (vec![7, 40], 50),
            (vec![AmxBlocking::DEFAULT.mc + 45, 257], 16 * 5),
            (vec![13, 4864], 40),
            (vec![64, 32], 16),
        ] {
            let k = *xdims.last().unwrap();
            let x = Tensor::randn(0f32, 1.0, xdims.clone(), &dev)?;
            let w = Tensor::randn(0f32, 1.0, (n, k), &dev)?;
            let p = AmxWeight::pack(&w)?;
            let got = linear_with(&x, &p, &bl)?;
            let want = x.broadcast_matmul(&w.t()?)?;
            assert_eq!(got.dims(), want.dims());
            let d = max_rel(&got, &want);
            let tol = sum_tolerance(k);
            assert!(d <= tol, "{spec} {xdims:?} x ({n}, {k}): {d:e}");
        }
    }
    let x = Tensor::randn(0f32, 1.0, (24, 10), &dev)?.t()?; // (10, 24), not contiguous
    let w = Tensor::randn(0f32, 1.0, (20, 24), &dev)?;
    let got = linear(&x, &AmxWeight::pack(&w)?)?;
    let want = x.matmul(&w.t()?)?;
    let d = (&got - &want)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar::<f32>()?;
    assert!(d <= 2e-5, "strided input: {d:e}");
    let e = linear(
        &Tensor::zeros((3, 7), DType::F32, &dev)?,
        &AmxWeight::from_rows(&[0.0; 8], 1, 8),
    )
    .expect_err("k 7 vs 8");
    assert!(e.to_string().contains("does not fit"), "{e}");
    Ok(())
}
