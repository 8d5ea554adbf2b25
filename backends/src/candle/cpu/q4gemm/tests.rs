use candle_core::quantized::QTensor;
use candle_core::{DType, Device};

use super::*;

fn blocks(w: &Tensor, format: GgmlDType) -> Result<(Vec<u8>, QTensor)> {
    let q = QTensor::quantize(w, format)?;
    Ok((q.data()?.into_owned(), q))
}

/// Both kernels equal the plain-Rust sums bit for bit, for both formats, on every tail
/// there is: row counts off the tile and row-block sizes, ragged last panels after odd and
/// even counts of whole ones, one block of `k` and many, 3-D and strided inputs, one row.
#[test]
fn kernels_equal_the_reference_sums() -> Result<()> {
    let levels = Isa::supported();
    if levels.is_empty() {
        eprintln!("no AVX2 + FMA: the 4-bit kernels do not run here");
        return Ok(());
    }
    let dev = Device::Cpu;
    for &isa in levels {
        for (format, xdims, n) in [
            (GgmlDType::Q4_0, vec![37usize, 96], 130usize),
            (GgmlDType::Q4_0, vec![2, 19, 64], 48),
            (GgmlDType::Q4_0, vec![1, 1, 896], 7),
            (GgmlDType::Q4_0, vec![MC + 7, 160], 176),
            (GgmlDType::Q4_0, vec![150, 32], 33),
            (GgmlDType::Q4K, vec![37, 256], 130),
            (GgmlDType::Q4K, vec![MC + 9, 1280], 40),
            (GgmlDType::Q4K, vec![1, 512], 16),
            (GgmlDType::Q4K, vec![13, 2, 768], 50),
            (GgmlDType::Q5_0, vec![37, 96], 130),
            (GgmlDType::Q5_0, vec![1, 1, 896], 7),
            (GgmlDType::Q5_0, vec![MC + 7, 160], 176),
            (GgmlDType::Q5_0, vec![6, 32], 33),
            (GgmlDType::Q6K, vec![37, 256], 130),
            (GgmlDType::Q6K, vec![MC + 9, 768], 40),
            (GgmlDType::Q6K, vec![1, 1, 512], 17),
            (GgmlDType::Q6K, vec![5, 256], 32),
        ] {
            let k = *xdims.last().unwrap();
            let x = Tensor::randn(0f32, 1.0, xdims.clone(), &dev)?;
            let (bytes, _) = blocks(&Tensor::randn(0f32, 0.2, (n, k), &dev)?, format)?;
            let w = from_blocks(format, &bytes, n, k, isa).expect("fits");
            assert_eq!((w.dims(), ggml(&w)), ((n, k), format));
            let got = linear(&x, &w)?;
            let mut want_dims = xdims.clone();
            *want_dims.last_mut().unwrap() = n;
            assert_eq!(got.dims(), &want_dims[..]);
            let m = x.elem_count() / k;
            let want = portable::product(&x.flatten_all()?.to_vec1::<f32>()?, m, &w);
            let got = got.flatten_all()?.to_vec1::<f32>()?;
            assert!(
                got == want,
                "{isa:?} {format:?} {xdims:?} x ({n}, {k}): differs"
            );
        }
        let x = Tensor::randn(0f32, 1.0, (256, 10), &dev)?.t()?; // (10, 256), strided
        let (bytes, _) = blocks(&Tensor::randn(0f32, 0.2, (20, 256), &dev)?, GgmlDType::Q4K)?;
        let w = from_blocks(GgmlDType::Q4K, &bytes, 20, 256, isa).expect("fits");
        let got = linear(&x, &w)?.flatten_all()?.to_vec1::<f32>()?;
        let xs = x.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
        assert!(
            got == portable::product(&xs, 10, &w),
            "{isa:?} strided input"
        );
    }
    Ok(())
}

/// 5- and 6-bit values at their largest (`q = 31`, `63`) against activations at theirs (`127`)
/// in nearly every position: the block sums reach 32 · 31 · 127 and 16 · 63 · 127 per half,
/// past what 16-bit lanes hold, and every kernel still equals the reference sums and the
/// dequantized product.
#[test]
fn high_bit_sums_at_their_largest_stay_exact() -> Result<()> {
    let dev = Device::Cpu;
    let (m, n, k) = (7usize, 32usize, 512usize);
    // per 16 values: -1 then 15 of 0.97, so the largest magnitude is negative and the rest
    // take the top code (Q5_0: d = 1/16, q = 31; Q6_K: q = 63)
    let w: Vec<f32> = (0..n * k)
        .map(|i| if i % 16 == 0 { -1.0 } else { 0.97 })
        .collect();
    let w = Tensor::from_vec(w, (n, k), &dev)?;
    let x = vec![1f32; m * k];
    for (format, top) in [(GgmlDType::Q5_0, 31u8), (GgmlDType::Q6K, 63)] {
        let (bytes, qt) = blocks(&w, format)?;
        let dense = qt.dequantize(&dev)?.flatten_all()?.to_vec1::<f32>()?;
        // x is exactly representable per block (d = 1/127, q = 127): the product is the row
        // sums
        let want: Vec<f32> = (0..m)
            .flat_map(|_| (0..n).map(|c| dense[c * k..][..k].iter().sum::<f32>()))
            .collect();
        for &isa in Isa::supported() {
            let packed = from_blocks(format, &bytes, n, k, isa).expect("fits");
            assert_eq!(packed.rows(), dense, "{format:?}");
            let tops = (0..k).filter(|&i| packed.code(0, i) == top).count();
            assert!(
                tops >= k * 7 / 8,
                "{format:?}: {tops} of {k} at the top code"
            );
            let reference = portable::product(&x, m, &packed);
            let got = linear(&Tensor::from_vec(x.clone(), (m, k), &dev)?, &packed)?;
            let got = got.flatten_all()?.to_vec1::<f32>()?;
            assert_eq!(got, reference, "{isa:?} {format:?}");
            let diff = reference
                .iter()
                .zip(&want)
                .fold(0f32, |a, (g, w)| a.max((g - w).abs()));
            assert!(diff <= 1e-4 * want[0].abs(), "{isa:?} {format:?}: {diff}");
        }
    }
    Ok(())
}

/// The packed weight dequantizes to exactly candle's dequantization of the same blocks, and
/// the reference sums are the product of that weight and the activations rounded to 8-bit
/// blocks, up to f32 rounding.
#[test]
fn the_reference_is_the_product_of_the_dequantized_weight() -> Result<()> {
    let dev = Device::Cpu;
    let (m, n, k) = (9usize, 40usize, 512usize);
    let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?;
    let xs = x.to_vec2::<f32>()?;
    let rounded: Vec<f32> = xs
        .iter()
        .flat_map(|row| {
            row.chunks_exact(BLOCK)
                .flat_map(|b| {
                    let (d, q) = quantize_block(b);
                    q.map(|q| q as f32 * d)
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let xr = Tensor::from_vec(rounded, (m, k), &dev)?;
    for format in [
        GgmlDType::Q4_0,
        GgmlDType::Q4K,
        GgmlDType::Q5_0,
        GgmlDType::Q6K,
    ] {
        // a weight with an offset, so Q4_K's mins are not all zero
        let wt = (Tensor::randn(0f32, 0.2, (n, k), &dev)? + 0.05)?;
        let (bytes, qt) = blocks(&wt, format)?;
        let dense = qt.dequantize(&dev)?;
        let want = xr.matmul(&dense.t()?)?.flatten_all()?.to_vec1::<f32>()?;
        let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
        for isa in [Isa::Avx2, Isa::AvxVnni, Isa::Avx512] {
            let w = from_blocks(format, &bytes, n, k, isa).expect("fits");
            assert_eq!(
                w.rows(),
                dense.flatten_all()?.to_vec1::<f32>()?,
                "{format:?}"
            );
            let got = portable::product(&x.flatten_all()?.to_vec1::<f32>()?, m, &w);
            let diff = got
                .iter()
                .zip(&want)
                .fold(0f32, |a, (g, w)| a.max((g - w).abs()));
            assert!(diff <= 1e-5 * scale, "{format:?}: {diff} vs scale {scale}");
        }
    }
    Ok(())
}

/// The fused gate|up SwiGLU equals the stacked product followed by the SwiGLU pass, bit for
/// bit, at every level the CPU has, for both formats: row counts off the tile and across
/// row blocks, one pair of panels and many; `gate_up` refuses an `F` that is not a multiple
/// of 16 and mixed formats.
#[test]
fn fused_swiglu_equals_product_then_swiglu() -> Result<()> {
    let dev = Device::Cpu;
    for &isa in Isa::supported() {
        for (format, m, f, k) in [
            (GgmlDType::Q4_0, 1usize, 16usize, 32usize),
            (GgmlDType::Q4_0, 7, 48, 96),
            (GgmlDType::Q4K, MC + 11, 80, 256),
            (GgmlDType::Q4K, 13, 16, 512),
            (GgmlDType::Q5_0, 7, 48, 96),
            (GgmlDType::Q5_0, MC + 1, 32, 64),
            (GgmlDType::Q6K, 7, 48, 256),
            (GgmlDType::Q6K, MC + 3, 16, 512),
        ] {
            let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?;
            let pack = |shift: f64| -> Result<PackedQ4> {
                let w = (Tensor::randn(0f32, 0.2, (f, k), &dev)? + shift)?;
                let (bytes, _) = blocks(&w, format)?;
                Ok(from_blocks(format, &bytes, f, k, isa).expect("fits"))
            };
            let (gate, up) = (pack(0.0)?, pack(0.05)?);
            let fused = PackedQ4::gate_up(&gate, &up).expect("fits");
            let stacked = PackedQ4::stack(&[&gate, &up]).expect("stacks");
            let want = super::super::super::layers::swiglu::swiglu(&linear(&x, &stacked)?)?;
            let got = swiglu(&x, &fused)?;
            assert_eq!(got.dims(), &[m, f]);
            let got = got.flatten_all()?.to_vec1::<f32>()?;
            let want = want.flatten_all()?.to_vec1::<f32>()?;
            assert!(got == want, "{isa:?} {format:?} m {m} F {f} k {k}: differs");
        }
        let w = Tensor::randn(0f32, 0.2, (24, 256), &dev)?;
        let (b0, _) = blocks(&w, GgmlDType::Q4_0)?;
        let odd = from_blocks(GgmlDType::Q4_0, &b0, 24, 256, isa).expect("fits");
        assert!(PackedQ4::gate_up(&odd, &odd).is_none(), "F = 24");
        let w = Tensor::randn(0f32, 0.2, (16, 256), &dev)?;
        let (b0, _) = blocks(&w, GgmlDType::Q4_0)?;
        let (bk, _) = blocks(&w, GgmlDType::Q4K)?;
        let q0 = from_blocks(GgmlDType::Q4_0, &b0, 16, 256, isa).expect("fits");
        let qk = from_blocks(GgmlDType::Q4K, &bk, 16, 256, isa).expect("fits");
        assert!(PackedQ4::gate_up(&q0, &qk).is_none(), "mixed formats");
    }
    Ok(())
}

/// Stacking equals packing the stacked blocks; unaligned parts, mixed formats or kernels,
/// other formats and blocks that do not fit the shape are refused.
#[test]
fn stacking_and_refusals() -> Result<()> {
    let dev = Device::Cpu;
    let ws: Vec<Tensor> = [32usize, 16, 7]
        .iter()
        .map(|&r| Tensor::randn(0f32, 1.0, (r, 256), &dev))
        .collect::<Result<_>>()?;
    let all = Tensor::cat(&ws, 0)?;
    for format in [
        GgmlDType::Q4_0,
        GgmlDType::Q4K,
        GgmlDType::Q5_0,
        GgmlDType::Q6K,
    ] {
        let parts: Vec<PackedQ4> = ws
            .iter()
            .map(|w| {
                let (b, _) = blocks(w, format)?;
                Ok(from_blocks(format, &b, w.dim(0)?, 256, Isa::Avx2).expect("fits"))
            })
            .collect::<Result<_>>()?;
        let refs: Vec<&PackedQ4> = parts.iter().collect();
        let stacked = PackedQ4::stack(&refs).expect("aligned");
        let (b, _) = blocks(&all, format)?;
        let whole = from_blocks(format, &b, 55, 256, Isa::Avx2).expect("fits");
        assert_eq!(stacked.dims(), (55, 256));
        assert_eq!(stacked, whole);
        assert!(
            PackedQ4::stack(&[&parts[2], &parts[0]]).is_none(),
            "7 rows first"
        );
    }
    let (b0, _) = blocks(&ws[1], GgmlDType::Q4_0)?;
    let (bk, _) = blocks(&ws[1], GgmlDType::Q4K)?;
    let q0 = from_blocks(GgmlDType::Q4_0, &b0, 16, 256, Isa::Avx2).expect("fits");
    let qk = from_blocks(GgmlDType::Q4K, &bk, 16, 256, Isa::Avx2).expect("fits");
    let q5 = from_blocks(GgmlDType::Q4_0, &b0, 16, 256, Isa::Avx512).expect("fits");
    assert!(PackedQ4::stack(&[&q0, &qk]).is_none(), "two formats");
    assert!(PackedQ4::stack(&[&q0, &q5]).is_none(), "two kernels");
    assert!(PackedQ4::stack(&[]).is_none());
    assert!(
        from_blocks(GgmlDType::Q4_0, &b0, 16, 128, Isa::Avx2).is_none(),
        "bytes of (16, 256)"
    );
    assert!(
        from_blocks(GgmlDType::Q4K, &bk, 32, 128, Isa::Avx2).is_none(),
        "k 128"
    );
    assert!(
        from_blocks(GgmlDType::Q8_0, &b0, 16, 256, Isa::Avx2).is_none(),
        "q8_0"
    );
    Ok(())
}

/// A mis-sized or non-f32 input is an error naming the shapes, never a panic; zero rows
/// give an empty output and all-zero activations zeros (`Q4_0` rows with zero `d`).
#[test]
fn a_mis_sized_input_is_an_error() -> Result<()> {
    let dev = Device::Cpu;
    let Some(&isa) = Isa::supported().first() else {
        return Ok(());
    };
    let (b, _) = blocks(&Tensor::randn(0f32, 1.0, (4, 64), &dev)?, GgmlDType::Q4_0)?;
    let w = from_blocks(GgmlDType::Q4_0, &b, 4, 64, isa).expect("fits");
    let e = linear(&Tensor::zeros((3, 32), DType::F32, &dev)?, &w).expect_err("k 32 vs 64");
    assert!(e.to_string().contains("does not fit"), "{e}");
    let e = linear(&Tensor::zeros((3, 64), DType::F64, &dev)?, &w).expect_err("f64");
    assert!(e.to_string().contains("does not fit"), "{e}");
    assert_eq!(
        linear(&Tensor::zeros((0, 64), DType::F32, &dev)?, &w)?.dims(),
        &[0, 4]
    );
    let y = linear(&Tensor::zeros((2, 64), DType::F32, &dev)?, &w)?;
    assert_eq!(y.flatten_all()?.to_vec1::<f32>()?, vec![0f32; 8]);
    Ok(())
}
