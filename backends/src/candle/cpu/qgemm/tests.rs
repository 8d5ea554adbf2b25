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
            let want = product_reference(&xs, m, &w);
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
            got == product_reference(&xs, 10, &w),
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
                    let (d, q) = quantize_block_scalar(b);
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
        let got = product_reference(&x.flatten_all()?.to_vec1::<f32>()?, m, &w);
        let diff = got
            .iter()
            .zip(&want)
            .fold(0f32, |a, (g, w)| a.max((g - w).abs()));
        assert!(diff <= 1e-5 * scale, "{isa:?}: {diff} vs scale {scale}");
    }
    Ok(())
}

/// One broadcast unit of `isa`'s kernel from `G` rounded values.
#[cfg(target_arch = "x86_64")]
fn pack_unit(vals: &[i8], isa: Isa) -> u32 {
    match isa {
        // two i16, the first in the low half (vpmaddwd's pair order)
        Isa::Avx2 => (vals[0] as i16 as u16 as u32) | ((vals[1] as i16 as u16 as u32) << 16),
        // four u8 offset by 128, the first in the low byte
        Isa::AvxVnni | Isa::Avx512 => u32::from_le_bytes([
            (vals[0] as i32 + 128) as u8,
            (vals[1] as i32 + 128) as u8,
            (vals[2] as i32 + 128) as u8,
            (vals[3] as i32 + 128) as u8,
        ]),
    }
}

/// The vector rounding of a block equals the scalar one: random blocks of several scales,
/// exact ties (x · 127 / max|x| = k + 0.5), an all-zero block, one large value.
#[cfg(target_arch = "x86_64")]
#[test]
fn vector_rounding_equals_scalar_rounding() -> Result<()> {
    let dev = Device::Cpu;
    let mut blocks: Vec<Vec<f32>> = Vec::new();
    for scale in [1e-6f32, 1.0, 3e4] {
        let x = Tensor::randn(0f32, scale, (200, BLOCK), &dev)?.to_vec2::<f32>()?;
        blocks.extend(x);
    }
    // max 127: every x = k + 0.5 is an exact tie of x · 127 / 127
    blocks.push(
        (0..BLOCK)
            .map(|i| i as f32 + 0.5)
            .chain([127.0])
            .skip(1)
            .collect(),
    );
    blocks.push(vec![0.0; BLOCK]);
    let mut big = vec![1e-3f32; BLOCK];
    big[17] = -9e9;
    blocks.push(big);
    for &isa in Isa::supported() {
        let g = group(isa);
        for b in &blocks {
            assert_eq!(b.len(), BLOCK);
            let (d, q) = quantize_block_scalar(b);
            let want: Vec<u32> = q.chunks_exact(g).map(|v| pack_unit(v, isa)).collect();
            let mut units = vec![0u32; BLOCK / g];
            // SAFETY: the CPU has `isa`; `b` holds 32 floats, `units` the block's units.
            let dv = unsafe { x86::quantize_units(b, isa, units.as_mut_ptr(), 1) };
            assert_eq!(
                (d.to_bits(), want),
                (dv.to_bits(), units),
                "{} {b:?}",
                isa.name()
            );
        }
    }
    Ok(())
}

/// The rows' rounding and packing in registers (`quantize_units`) equals rounding each
/// block with the scalar form and packing its units one by one, at every ISA level: random
/// rows of three scales, exact ties, zeros and a huge value, row counts not a multiple of
/// the tile's.
#[cfg(target_arch = "x86_64")]
#[test]
fn packed_rounding_equals_scalar_rounding_and_packing() -> Result<()> {
    let dev = Device::Cpu;
    let k = 4 * BLOCK;
    let mut rows: Vec<Vec<f32>> = Vec::new();
    for scale in [1e-6f32, 1.0, 3e4] {
        rows.extend(Tensor::randn(0f32, scale, (5, k), &dev)?.to_vec2::<f32>()?);
    }
    let ties: Vec<f32> = (0..BLOCK)
        .map(|i| i as f32 + 0.5)
        .skip(1)
        .chain([127.0])
        .collect();
    let mut special = ties.clone();
    special.extend(vec![0.0; BLOCK]);
    let mut big = vec![1e-3f32; BLOCK];
    big[17] = -9e9;
    special.extend(big);
    special.extend(ties.iter().map(|x| -x));
    rows.push(special);
    for &isa in Isa::supported() {
        for m in [1, rows.len() - 3, rows.len()] {
            let x: Vec<f32> = rows[..m].concat();
            // SAFETY: the CPU has `isa`
            let (a, s) = unsafe { x86::quantize_rows(&x, m, k, isa) };
            let (mr, g) = (mr(isa), group(isa));
            let units = BLOCK / g;
            let (mut want_a, mut want_s) = (vec![0u32; a.len()], vec![0f32; s.len()]);
            for r in 0..m {
                let (gi, rr) = (r / mr, r % mr);
                for (b, xs) in x[r * k..][..k].chunks_exact(BLOCK).enumerate() {
                    let (d, q) = quantize_block_scalar(xs);
                    want_s[(gi * (k / BLOCK) + b) * mr + rr] = d;
                    for (u, vals) in q.chunks_exact(g).enumerate() {
                        let at = ((gi * (k / BLOCK) + b) * units + u) * mr + rr;
                        want_a[at] = pack_unit(vals, isa);
                    }
                }
            }
            assert_eq!(a, want_a, "{} m {m}", isa.name());
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&s), bits(&want_s), "{} m {m}", isa.name());
        }
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
        assert_eq!(stacked.q, whole.q);
        assert_eq!(stacked.d, whole.d);
        assert_eq!(stacked.offset, whole.offset);
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
