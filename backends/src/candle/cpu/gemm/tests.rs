use super::super::host::checks::{max_rel, sum_tolerance};
use super::*;
use candle_core::{DType, Device};

/// The gate|up SwiGLU taken block by block equals the stacked product followed by the
/// SwiGLU pass, bit for bit, at every f32 level and under blockings with ragged row blocks,
/// odd panel blocks (taken one larger), several `k` blocks and one; a `k` above `short_k`
/// and an `F` that is not a multiple of 16 are refused (an error, a `None`).
#[test]
fn swiglu_equals_product_then_swiglu() -> Result<()> {
    let dev = Device::Cpu;
    for &isa in Isa::supported().iter().filter(|&&l| l.f32_level() == l) {
        for spec in [
            "",
            "mr=4,kc=7,mc=12,nc=3",
            "mr=1,kc=64,mc=5,nc=1",
            "nc=2,kc=1000",
        ] {
            let bl = Blocking::parse(spec, isa).expect("spec");
            for (m, f, k) in [(1usize, 16usize, 32usize), (37, 48, 96), (100, 80, 200)] {
                let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?;
                let gate = PackedWeight::pack(&Tensor::randn(0f32, 0.2, (f, k), &dev)?)?;
                let up = PackedWeight::pack(&Tensor::randn(0f32, 0.2, (f, k), &dev)?)?;
                let fused = PackedWeight::gate_up(&gate, &up).expect("fits");
                let stacked = PackedWeight::stack(&[&gate, &up]).expect("stacks");
                let want = super::super::super::layers::swiglu::swiglu(&linear_with(
                    &x, &stacked, isa, &bl,
                )?)?;
                let got = swiglu_with(&x, &fused, isa, &bl)?;
                assert_eq!(got.dims(), &[m, f]);
                let got = got.flatten_all()?.to_vec1::<f32>()?;
                let want = want.flatten_all()?.to_vec1::<f32>()?;
                assert!(got == want, "{isa:?} {spec} m {m} F {f} k {k}: differs");
            }
        }
        let w = PackedWeight::pack(&Tensor::randn(0f32, 0.2, (16, 64), &dev)?)?;
        let fused = PackedWeight::gate_up(&w, &w).expect("fits");
        let short = Blocking::parse("short_k=32", isa).expect("spec");
        let x = Tensor::randn(0f32, 1.0, (3, 64), &dev)?;
        let e = swiglu_with(&x, &fused, isa, &short).expect_err("k above short_k");
        assert!(e.to_string().contains("does not fit"), "{e}");
        let odd = PackedWeight::pack(&Tensor::randn(0f32, 0.2, (24, 64), &dev)?)?;
        assert!(PackedWeight::gate_up(&odd, &odd).is_none(), "F = 24");
    }
    Ok(())
}

/// The packed kernel equals candle's matmul to f32 rounding (a tolerance growing like √k,
/// from 2e-6 of the largest output), under every instruction level
/// the CPU has and blockings from the default to degenerate ones (1-row tiles, odd `k`,
/// row and panel blocks, the `k`-outermost order for every `k`, weight prefetches), on
/// every tail there is:
/// rows that are not a multiple of the tile or of the row block, ragged last panels (after
/// an odd and an even count of whole ones), `k` not a multiple of the `k` block, a `k`
/// above the default `short_k` (the other loop order), 3-D inputs, a strided input, and a
/// single row.
#[test]
fn packed_linear_equals_candle_matmul() -> Result<()> {
    let levels = Isa::supported();
    if levels.is_empty() {
        eprintln!("no AVX2 + FMA: the packed kernel does not run here");
        return Ok(());
    }
    let dev = Device::Cpu;
    // seeded inputs: the tolerance is a bound on rounding, so the test must not depend on a draw
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut randn = |dims: &[usize]| -> Result<Tensor> {
        let n: usize = dims.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                // uniform on [−√3, √3): unit variance, as the normal draws it replaces
                ((seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * 3f32.sqrt()
            })
            .collect();
        Tensor::from_vec(v, dims, &dev)
    };
    let specs = [
        "",
        "mr=1,kc=7,mc=3,nc=1,short_k=0",
        "mr=5,kc=64,mc=10,nc=3",
        "mr=4,kc=300,mc=200,nc=16,short_k=100000",
        "mr=8,nc=2",
        "mr=12,mc=96",
        "mr=14,kc=100,mc=20,nc=5,short_k=0",
        "pf=0",
        "mr=5,kc=33,nc=3,pf=3",
        "mr=13,kc=33,nc=3,pf=1,short_k=0",
    ];
    // AVX-VNNI's f32 kernel is AVX2's
    for &isa in levels.iter().filter(|&&l| l.f32_level() == l) {
        let d = Blocking::default_for(isa);
        for spec in specs {
            let Ok(bl) = Blocking::parse(spec, isa) else {
                assert!(isa == Isa::Avx2, "{spec} is valid for {isa:?}");
                continue;
            };
            for (xdims, n) in [
                (vec![37usize, 96], 130usize),
                (vec![2, 19, 64], 48),
                (vec![1, 1, 896], 7),
                (vec![150, 300], 33),
                (vec![7, 40], 50),
                (vec![13, d.short_k + 40], 40),
                (vec![d.mc + 5, 257], 16 * d.nc + 16),
                (vec![9, 64], 16 * d.nc + 48),
            ] {
                let k = *xdims.last().unwrap();
                let x = randn(&xdims)?;
                let w = randn(&[n, k])?;
                let p = PackedWeight::pack(&w)?;
                assert_eq!(p.dims(), (n, k));
                let got = linear_with(&x, &p, isa, &bl)?;
                let want = x.broadcast_matmul(&w.t()?)?;
                assert_eq!(got.dims(), want.dims());
                let d = max_rel(&got, &want);
                let tol = sum_tolerance(k);
                assert!(d <= tol, "{isa:?} {spec} {xdims:?} x ({n}, {k}): {d:e}");
                assert_eq!(unpack(&p)?.to_vec2::<f32>()?, w.to_vec2::<f32>()?);
            }
            let x = randn(&[24, 10])?.t()?; // (10, 24), not contiguous
            let w = randn(&[20, 24])?;
            let got = linear_with(&x, &PackedWeight::pack(&w)?, isa, &bl)?;
            let d = max_rel(&got, &x.matmul(&w.t()?)?);
            assert!(d <= 2e-6, "{isa:?} {spec} strided input: {d:e}");
        }
    }
    Ok(())
}

/// A blocking spec is parsed over the default; a wrong one is an error naming what is
/// wrong, and a blocking the tile cannot hold is refused by the product, never run.
#[test]
fn blocking_specs_are_parsed_or_refused_by_name() -> Result<()> {
    let isa = Isa::Avx512;
    let d = Blocking::default_for(isa);
    assert_eq!(Blocking::parse("", isa), Ok(d));
    let b = Blocking::parse(" mr=12 , kc=128,short_k=0,pf=8", isa).expect("valid");
    assert_eq!(
        (b.mr, b.kc, b.mc, b.nc, b.short_k, b.pf),
        (12, 128, 84, d.nc, 0, 8)
    );
    assert_eq!(Blocking::parse("mr=5,mc=12", isa).map(|b| b.mc), Ok(15));
    // the default row block is rounded up to a multiple of a smaller tile's rows
    assert_eq!(Blocking::parse("mr=5", isa).map(|b| b.mc), Ok(85));
    for (spec, says) in [
        ("mr", "not key=value"),
        ("kc=big", "`big` is not a count"),
        ("mc=0", "at least 1"),
        ("tile=4", "unknown key `tile`"),
        ("mr=15", "more rows than a avx512 tile holds (14)"),
    ] {
        let e = Blocking::parse(spec, isa).expect_err(spec);
        assert!(e.contains(says), "{spec}: {e}");
    }
    let e = Blocking::parse("mr=7", Isa::Avx2).expect_err("avx2 holds 6");
    assert!(e.contains("(6)"), "{e}");
    if Isa::supported().contains(&Isa::Avx2) {
        let dev = Device::Cpu;
        let p = PackedWeight::pack(&Tensor::zeros((4, 8), DType::F32, &dev)?)?;
        let x = Tensor::zeros((3, 8), DType::F32, &dev)?;
        let bad = Blocking {
            mr: 7,
            ..Blocking::default_for(Isa::Avx2)
        };
        let e = linear_with(&x, &p, Isa::Avx2, &bad).expect_err("7 rows");
        assert!(e.to_string().contains("does not fit"), "{e}");
        let bad = Blocking {
            mr: 4,
            mc: 6,
            ..bad
        };
        let e = linear_with(&x, &p, Isa::Avx2, &bad).expect_err("mc 6");
        assert!(e.to_string().contains("not a multiple"), "{e}");
    }
    Ok(())
}

/// Stacking packed weights equals packing the stacked rows, aligned (panels concatenated)
/// or not (rows repacked); differing `in` is refused.
#[test]
fn stacking_packed_weights_equals_packing_the_stack() -> Result<()> {
    let dev = Device::Cpu;
    for rows in [[32usize, 16, 7], [5, 16, 9]] {
        let ws: Vec<Tensor> = rows
            .iter()
            .map(|&r| Tensor::randn(0f32, 1.0, (r, 24), &dev))
            .collect::<Result<_>>()?;
        let packed: Vec<PackedWeight> = ws.iter().map(PackedWeight::pack).collect::<Result<_>>()?;
        let refs: Vec<&PackedWeight> = packed.iter().collect();
        let stacked = PackedWeight::stack(&refs).expect("one in");
        let want = Tensor::cat(&ws, 0)?;
        assert_eq!(stacked.dims(), want.dims2()?);
        assert_eq!(unpack(&stacked)?.to_vec2::<f32>()?, want.to_vec2::<f32>()?);
        assert_eq!(stacked.panels(), PackedWeight::pack(&want)?.panels());
    }
    let a = PackedWeight::pack(&Tensor::zeros((4, 8), DType::F32, &dev)?)?;
    let b = PackedWeight::pack(&Tensor::zeros((4, 9), DType::F32, &dev)?)?;
    assert!(PackedWeight::stack(&[&a, &b]).is_none());
    assert!(PackedWeight::stack(&[]).is_none());
    Ok(())
}

/// Packing Q8_0 / Q4_0 blocks directly equals packing candle's dequantization bit for bit;
/// other types and mis-sized bytes are refused.
#[test]
fn packing_blocks_equals_packing_the_dequantized_weight() -> Result<()> {
    use candle_core::quantized::QTensor;
    let dev = Device::Cpu;
    for (n, k) in [(37usize, 64usize), (16, 896), (5, 32)] {
        let w = Tensor::randn(0f32, 1.0, (n, k), &dev)?;
        for ggml in [GgmlDType::Q8_0, GgmlDType::Q4_0] {
            let q = QTensor::quantize(&w, ggml)?;
            let direct = from_blocks(ggml, &q.data()?, n, k).expect("packs");
            let via = PackedWeight::pack(&q.dequantize(&dev)?)?;
            assert_eq!(direct.panels(), via.panels(), "{ggml:?} ({n}, {k})");
        }
    }
    let q = QTensor::quantize(&Tensor::zeros((4, 256), DType::F32, &dev)?, GgmlDType::Q4K)?;
    assert!(from_blocks(GgmlDType::Q4K, &q.data()?, 4, 256).is_none());
    assert!(from_blocks(GgmlDType::Q8_0, &[0u8; 33], 1, 32).is_none());
    Ok(())
}

/// A mis-sized or non-f32 input is an error naming the shapes, never a panic.
#[test]
fn a_mis_sized_input_is_an_error() -> Result<()> {
    let dev = Device::Cpu;
    let p = PackedWeight::pack(&Tensor::zeros((4, 8), DType::F32, &dev)?)?;
    let e = linear(&Tensor::zeros((3, 7), DType::F32, &dev)?, &p).expect_err("k 7 vs 8");
    assert!(e.to_string().contains("does not fit"), "{e}");
    let e = linear(&Tensor::zeros((3, 8), DType::F64, &dev)?, &p).expect_err("f64");
    assert!(e.to_string().contains("does not fit"), "{e}");
    assert_eq!(
        linear(&Tensor::zeros((0, 8), DType::F32, &dev)?, &p)?.dims(),
        &[0, 4]
    );
    Ok(())
}
