use super::super::host::checks::{max_rel, sum_tolerance};
use super::*;
use candle_core::{DType, Device};

/// Where AMX-INT8 runs: `Q8_0` products on the int8 tiles equal the plain-Rust sums (and so
/// the VNNI kernel) bit for bit, on every tail: rows not a multiple of 16 or 32, ragged
/// and odd panel counts, one block, long `k`, a single row; `cpu_qgemm::linear` takes them.
/// Elsewhere the call is refused with a clear error.
#[test]
fn amx_q8_equals_the_reference_bit_for_bit() -> Result<()> {
    use super::super::isa::Isa;
    use super::super::qgemm::PackedQ8;
    use candle_core::quantized::{GgmlDType, QTensor};
    use forkscore_kernels::cpu::qgemm::portable;
    let dev = Device::Cpu;
    let q8 = |n: usize, k: usize| -> Result<Option<PackedQ8>> {
        let w = Tensor::randn(0f32, 0.3, (n, k), &dev)?;
        let bytes = QTensor::quantize(&w, GgmlDType::Q8_0)?.data()?.into_owned();
        Ok(PackedQ8::from_blocks(&bytes, n, k, Isa::Avx512))
    };
    if !kernel::q8_available() {
        eprintln!("no AMX-INT8 here: the int8 tiles do not run");
        let w = q8(16, 32)?.expect("fits");
        let e = kernel::q8_product(&[0.0; 32], 1, &w).expect_err("no AMX-INT8");
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
        let got = kernel::q8_product(&x, m, &w).map_err(kernel_err)?;
        let want = portable::product(&x, m, &w);
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
