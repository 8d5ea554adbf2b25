use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device};

use super::*;

fn q8(w: &Tensor) -> Result<(Vec<u8>, QTensor)> {
    let q = QTensor::quantize(w, GgmlDType::Q8_0)?;
    Ok((q.data()?.into_owned(), q))
}

/// Both kernels equal the plain-Rust sums bit for bit, on every tail there is: row counts
/// off the tile and row-block sizes, ragged last panels after odd and even counts of whole
/// ones, one block of `k` and many, 3-D and strided inputs, a single row.
#[test]
fn kernels_equal_the_reference_sums() -> Result<()> {
    let levels = Isa::supported();
    if levels.is_empty() {
        eprintln!("no AVX2 + FMA: the q8_0 kernels do not run here");
        return Ok(());
    }
    let dev = Device::Cpu;
    for &isa in levels {
        for (xdims, n) in [
            (vec![37usize, 96], 130usize),
            (vec![2, 19, 64], 48),
            (vec![1, 1, 896], 7),
            (vec![5, 32], 50),
            (vec![MC + 7, 160], 176),
            (vec![13, 1280], 16),
            (vec![MC + 9, 2080], 40),
            (vec![150, 64], 33),
        ] {
            let k = *xdims.last().unwrap();
            let x = Tensor::randn(0f32, 1.0, xdims.clone(), &dev)?;
            let (bytes, _) = q8(&Tensor::randn(0f32, 0.2, (n, k), &dev)?)?;
            let w = PackedQ8::from_blocks(&bytes, n, k, isa).expect("fits");
            assert_eq!(w.dims(), (n, k));
            let m = x.elem_count() / k;
            let xs = x.flatten_all()?.to_vec1::<f32>()?;
            let want = portable::product(&xs, m, &w);
            // with and without the weight prefetch (a hint: the same sums), also past the
            // panel's end (the process-wide setting only changes speed for other tests)
            for pf in [0, 1, 4, 100] {
                set_prefetch(pf);
                let got = linear(&x, &w)?;
                let mut want_dims = xdims.clone();
                *want_dims.last_mut().unwrap() = n;
                assert_eq!(got.dims(), &want_dims[..]);
                let got = got.flatten_all()?.to_vec1::<f32>()?;
                assert!(
                    got == want,
                    "{isa:?} {xdims:?} x ({n}, {k}), prefetch {pf}: differs"
                );
            }
            set_prefetch(usize::MAX);
        }
        let x = Tensor::randn(0f32, 1.0, (64, 10), &dev)?.t()?; // (10, 64), strided
        let (bytes, _) = q8(&Tensor::randn(0f32, 0.2, (20, 64), &dev)?)?;
        let w = PackedQ8::from_blocks(&bytes, 20, 64, isa).expect("fits");
        let got = linear(&x, &w)?.flatten_all()?.to_vec1::<f32>()?;
        let xs = x.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
        assert!(
            got == portable::product(&xs, 10, &w),
            "{isa:?} strided input"
        );
    }
    Ok(())
}

/// The reference sums are the product of the dequantized weight and the activations
/// rounded to 8-bit blocks, up to f32 rounding; and the packed weight dequantizes to
/// exactly candle's dequantization.
#[test]
fn the_reference_is_the_product_of_the_rounded_operands() -> Result<()> {
    let dev = Device::Cpu;
    let (m, n, k) = (9usize, 40usize, 128usize);
    let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?;
    let (bytes, qt) = q8(&Tensor::randn(0f32, 0.2, (n, k), &dev)?)?;
    let dense = qt.dequantize(&dev)?;
    // the activations rounded to 8-bit blocks, dequantized
    let xs = x.to_vec2::<f32>()?;
    let rounded: Vec<f32> = xs
        .iter()
        .flat_map(|row| {
            row.chunks_exact(BLOCK)
                .flat_map(|b| {
                    let (d, q) = portable::quantize_block(b);
                    q.map(|q| q as f32 * d)
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let xr = Tensor::from_vec(rounded, (m, k), &dev)?;
    let want = xr.matmul(&dense.t()?)?.flatten_all()?.to_vec1::<f32>()?;
    let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
    for isa in [Isa::Avx2, Isa::AvxVnni, Isa::Avx512] {
        let w = PackedQ8::from_blocks(&bytes, n, k, isa).expect("fits");
        assert_eq!(w.rows(), dense.flatten_all()?.to_vec1::<f32>()?, "{isa:?}");
        let got = portable::product(&x.flatten_all()?.to_vec1::<f32>()?, m, &w);
        let diff = got
            .iter()
            .zip(&want)
            .fold(0f32, |a, (g, w)| a.max((g - w).abs()));
        assert!(diff <= 1e-5 * scale, "{isa:?}: {diff} vs scale {scale}");
    }
    Ok(())
}

/// The fused gate|up SwiGLU equals the stacked product followed by the SwiGLU pass, bit for
/// bit, at every level the CPU has: row counts off the tile and across row blocks, one
/// pair of panels and many, one block of `k` and many; and `gate_up` refuses an `F` that is
/// not a multiple of 16 and differing shapes.
#[test]
fn fused_swiglu_equals_product_then_swiglu() -> Result<()> {
    let dev = Device::Cpu;
    for &isa in Isa::supported() {
        for (m, f, k) in [
            (1usize, 16usize, 32usize),
            (7, 48, 96),
            (MC + 11, 80, 64),
            (13, 16, 1280),
        ] {
            let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?;
            let pack = |seed: f32| -> Result<PackedQ8> {
                let w = (Tensor::randn(0f32, 0.2, (f, k), &dev)? + seed as f64)?;
                let (bytes, _) = q8(&w)?;
                Ok(PackedQ8::from_blocks(&bytes, f, k, isa).expect("fits"))
            };
            let (gate, up) = (pack(0.0)?, pack(0.01)?);
            let fused = PackedQ8::gate_up(&gate, &up).expect("fits");
            let stacked = PackedQ8::stack(&[&gate, &up]).expect("stacks");
            let want = super::super::super::layers::swiglu::swiglu(&linear(&x, &stacked)?)?;
            let got = swiglu(&x, &fused)?;
            assert_eq!(got.dims(), &[m, f]);
            let (got, want) = (
                got.flatten_all()?.to_vec1::<f32>()?,
                want.flatten_all()?.to_vec1::<f32>()?,
            );
            assert!(got == want, "{isa:?} m {m} F {f} k {k}: differs");
        }
        let (bytes, _) = q8(&Tensor::randn(0f32, 0.2, (24, 64), &dev)?)?;
        let odd = PackedQ8::from_blocks(&bytes, 24, 64, isa).expect("fits");
        assert!(PackedQ8::gate_up(&odd, &odd).is_none(), "F = 24");
        let (bytes, _) = q8(&Tensor::randn(0f32, 0.2, (32, 64), &dev)?)?;
        let a = PackedQ8::from_blocks(&bytes, 32, 64, isa).expect("fits");
        let (bytes, _) = q8(&Tensor::randn(0f32, 0.2, (16, 64), &dev)?)?;
        let b = PackedQ8::from_blocks(&bytes, 16, 64, isa).expect("fits");
        assert!(PackedQ8::gate_up(&a, &b).is_none(), "32 vs 16 rows");
    }
    Ok(())
}

/// Stacking equals packing the stacked blocks; unaligned parts, differing `in` or
/// kernels are refused, and so are blocks that do not fit the shape.
#[test]
fn stacking_and_refusals() -> Result<()> {
    let dev = Device::Cpu;
    let ws: Vec<Tensor> = [32usize, 16, 7]
        .iter()
        .map(|&r| Tensor::randn(0f32, 1.0, (r, 64), &dev))
        .collect::<Result<_>>()?;
    let all = Tensor::cat(&ws, 0)?;
    for isa in [Isa::Avx2, Isa::AvxVnni, Isa::Avx512] {
        let parts: Vec<PackedQ8> = ws
            .iter()
            .map(|w| {
                let (b, _) = q8(w)?;
                Ok(PackedQ8::from_blocks(&b, w.dim(0)?, 64, isa).expect("fits"))
            })
            .collect::<Result<_>>()?;
        let refs: Vec<&PackedQ8> = parts.iter().collect();
        let stacked = PackedQ8::stack(&refs).expect("aligned");
        let (b, _) = q8(&all)?;
        let whole = PackedQ8::from_blocks(&b, 55, 64, isa).expect("fits");
        assert_eq!(stacked.dims(), (55, 64));
        assert_eq!(stacked, whole);
        assert!(
            PackedQ8::stack(&[&parts[2], &parts[0]]).is_none(),
            "7 rows first"
        );
    }
    let (b, _) = q8(&ws[1])?;
    let a2 = PackedQ8::from_blocks(&b, 16, 64, Isa::Avx2).expect("fits");
    let a5 = PackedQ8::from_blocks(&b, 16, 64, Isa::Avx512).expect("fits");
    assert!(PackedQ8::stack(&[&a2, &a5]).is_none(), "two kernels");
    assert!(PackedQ8::stack(&[]).is_none());
    assert!(
        PackedQ8::from_blocks(&b, 16, 32, Isa::Avx2).is_none(),
        "bytes of (16, 64)"
    );
    assert!(
        PackedQ8::from_blocks(&[0u8; 34], 1, 40, Isa::Avx2).is_none(),
        "k 40"
    );
    Ok(())
}

/// A mis-sized or non-f32 input is an error naming the shapes, never a panic.
#[test]
fn a_mis_sized_input_is_an_error() -> Result<()> {
    let dev = Device::Cpu;
    let (b, _) = q8(&Tensor::zeros((4, 64), DType::F32, &dev)?)?;
    let Some(&isa) = Isa::supported().first() else {
        return Ok(());
    };
    let w = PackedQ8::from_blocks(&b, 4, 64, isa).expect("fits");
    let e = linear(&Tensor::zeros((3, 32), DType::F32, &dev)?, &w).expect_err("k 32 vs 64");
    assert!(e.to_string().contains("does not fit"), "{e}");
    let e = linear(&Tensor::zeros((3, 64), DType::F64, &dev)?, &w).expect_err("f64");
    assert!(e.to_string().contains("does not fit"), "{e}");
    assert_eq!(
        linear(&Tensor::zeros((0, 64), DType::F32, &dev)?, &w)?.dims(),
        &[0, 4]
    );
    // all-zero activations round to zero blocks (scale 0), not NaN
    let y = linear(&Tensor::zeros((2, 64), DType::F32, &dev)?, &w)?;
    assert_eq!(y.flatten_all()?.to_vec1::<f32>()?, vec![0f32; 8]);
    Ok(())
}
