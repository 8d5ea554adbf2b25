use super::*;
use crate::candle::cpu;

/// The quantized kernel (activations rounded to 8-bit blocks) vs the dequantize + GEMM path
/// (f32 activations) on the same blocks, for every ggml type a scheme can pick, with a bias:
/// they differ only by the activation rounding, bounded here relative to the output scale.
#[test]
fn kernel_path_equals_dequantized_path() -> candle_core::Result<()> {
    let dev = Device::Cpu;
    // Activation rounding to 8 bits (|error| <= max|x| / 254 per element), summed over
    // `in` products: measured at most ~0.4% of max|y| here; 2% leaves headroom.
    const RELATIVE: f32 = 0.02;
    for (q, in_dim) in [
        (Quantization::Q8_0, 96),
        (Quantization::Q4K, 256),
        (Quantization::Q4K, 96),
    ] {
        let w = Tensor::rand(-0.2f32, 0.2, (24, in_dim), &dev)?;
        let b = Tensor::rand(-1f32, 1.0, 24, &dev)?;
        let layer = Linear::quantized("w", &w, Some(b), q, DType::F32, &dev)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        assert_eq!(layer.ggml(), ggml_type(q, in_dim));
        let x = Tensor::rand(-1f32, 1.0, (2, 7, in_dim), &dev)?;
        let a = layer.forward_kernel(&x)?;
        let d = layer.forward_dequantized(&x)?;
        assert_eq!(a.dims(), &[2, 7, 24]);
        let scale = d.abs()?.max_all()?.to_scalar::<f32>()?;
        let diff = (&a - &d)?.abs()?.max_all()?.to_scalar::<f32>()?;
        eprintln!("{q} in {in_dim}: relative difference {}", diff / scale);
        assert!(
            diff <= RELATIVE * scale,
            "{q} in {in_dim}: |kernel - dequantized| {diff} > {RELATIVE} * {scale}"
        );
        // forward() picks one of the two (14 rows > the Q8_0 / Q4_0 kernel limit of
        // candle's kernels; the integer kernel of cpu_qgemm takes every row count)
        let f = layer.forward(&x)?;
        let integer = matches!(layer, Linear::PackedQ8 { .. } | Linear::PackedQ4 { .. });
        let ggml = layer.ggml().unwrap_or(GgmlDType::F32);
        let pick = if integer || kernel_max_rows(&dev, ggml) >= 14 {
            a
        } else {
            d
        };
        let same = (f - pick)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert_eq!(same, 0.0, "{q} in {in_dim}: forward took neither path");
    }
    Ok(())
}

/// Quantizing runs of rows in parallel gives exactly the blocks of quantizing the whole
/// matrix at once, for every ggml type a scheme can pick and a row count that does not
/// divide into the tasks evenly.
#[test]
fn parallel_quantization_equals_whole_matrix_quantization() -> candle_core::Result<()> {
    let dev = Device::Cpu;
    for (ggml, in_dim) in [
        (GgmlDType::Q8_0, 96),
        (GgmlDType::Q4_0, 64),
        (GgmlDType::Q4K, 512),
    ] {
        for out in [1usize, 37, 301] {
            let w = Tensor::randn(0f32, 0.3, (out, in_dim), &dev)?;
            let whole = QTensor::quantize(&w, ggml)?;
            let parallel = quantize_rows_parallel(&w, ggml, &dev)?;
            assert_eq!(parallel.shape().dims(), &[out, in_dim]);
            assert_eq!(parallel.dtype(), ggml);
            assert!(
                whole.data()? == parallel.data()?,
                "{ggml:?} ({out}, {in_dim}): blocks differ"
            );
        }
    }
    Ok(())
}

/// Where the integer kernels run, an f32 model's Q8_0 / Q4_0 / Q4_K layers take them (not
/// candle's blocks), count as their ggml type, and stack: the stacked layer's output is the
/// parts' outputs side by side, bit for bit.
#[test]
fn quantized_layers_take_the_integer_kernels_and_stack() -> candle_core::Result<()> {
    let dev = Device::Cpu;
    for (q, in_dim, want) in [
        (Quantization::Q8_0, 64, GgmlDType::Q8_0),
        (Quantization::Q4K, 96, GgmlDType::Q4_0),
        (Quantization::Q4K, 256, GgmlDType::Q4K),
    ] {
        let layer = |rows: usize| -> candle_core::Result<Linear> {
            let w = Tensor::randn(0f32, 0.2, (rows, in_dim), &dev)?;
            let b = Tensor::randn(0f32, 1.0, rows, &dev)?;
            Linear::quantized("w", &w, Some(b), q, DType::F32, &dev)
                .map_err(|e| candle_core::Error::Msg(e.to_string()))
        };
        let (a, b) = (layer(32)?, layer(20)?);
        assert_eq!(a.ggml(), Some(want));
        if integer_kernel(want, DType::F32, &dev).is_none() {
            assert!(
                matches!(a, Linear::Quantized { .. }),
                "no integer kernel here"
            );
            continue;
        }
        match want {
            GgmlDType::Q8_0 => assert!(matches!(a, Linear::PackedQ8 { .. })),
            _ => assert!(matches!(a, Linear::PackedQ4 { .. })),
        }
        let stacked = Linear::stack(&[&a, &b])
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?
            .expect("32 rows first: aligned");
        assert_eq!(stacked.ggml(), Some(want));
        let x = Tensor::randn(0f32, 1.0, (5, in_dim), &dev)?;
        let want_y = Tensor::cat(&[a.forward(&x)?, b.forward(&x)?], 1)?;
        let got = stacked.forward(&x)?;
        assert_eq!(got.to_vec2::<f32>()?, want_y.to_vec2::<f32>()?, "{want:?}");
        // 20 rows first: the padded panel would sit inside the stack
        assert!(Linear::stack(&[&b, &a])
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?
            .is_none());
    }
    Ok(())
}

/// `bf16` rounds every weight, whatever `in` (no block): an f32 model on a CPU with AVX-512
/// BF16 takes the packed kernel, elsewhere the bf16 tensor. Both equal the f32 product of
/// the bf16-rounded operands plus the bias (the kernel within f32 rounding, candle's bf16
/// matmul within its output's bf16 rounding), count as `bf16`, and stack bit for bit.
#[test]
fn bf16_layers_round_the_weights_and_stack() -> candle_core::Result<()> {
    let dev = Device::Cpu;
    let in_dim = 45;
    let make = |rows: usize| -> candle_core::Result<(Tensor, Tensor, Linear)> {
        let w = Tensor::randn(0f32, 0.2, (rows, in_dim), &dev)?;
        let b = Tensor::randn(0f32, 1.0, rows, &dev)?;
        let l = Linear::quantized(
            "w",
            &w,
            Some(b.clone()),
            Quantization::Bf16,
            DType::F32,
            &dev,
        )
        .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        Ok((w, b, l))
    };
    let (w, b, layer) = make(32)?;
    assert_eq!(layer.ggml(), Some(GgmlDType::BF16));
    let kernel = cpu::bf16gemm::kernel()?;
    let took = match &layer {
        Linear::PackedAmx { weight, .. } if weight.parts() == Parts::One => Bf16Kernel::Amx,
        Linear::PackedBf16 { .. } => Bf16Kernel::Dot,
        Linear::Bf16 { .. } => Bf16Kernel::Candle,
        other => panic!("a bf16 layer became {other:?}"),
    };
    assert_eq!(took, kernel);
    let generic = Linear::Bf16 {
        weight: w.to_dtype(DType::BF16)?,
        bias: Some(b.clone()),
    };
    let x = Tensor::randn(0f32, 1.0, (2, 7, in_dim), &dev)?;
    let round = |t: &Tensor| t.to_dtype(DType::BF16)?.to_dtype(DType::F32);
    let want = round(&x)?
        .broadcast_matmul(&round(&w)?.t()?)?
        .broadcast_add(&b)?;
    let scale = want.abs()?.max_all()?.to_scalar::<f32>()?;
    for (name, l, relative) in [
        ("layer", &layer, 1e-5f32),
        ("bf16 tensor", &generic, 1.0 / 256.0),
    ] {
        let got = l.forward(&x)?;
        assert_eq!(got.dims(), &[2, 7, 32]);
        assert_eq!(got.dtype(), DType::F32);
        let diff = (&got - &want)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(
            diff <= relative * scale,
            "{name}: {diff} > {relative} * {scale}"
        );
        // the packed weight's dequantized path keeps the f32 activations (the tests' other
        // reference); the bf16 tensor's is its forward
        let dq = l.forward_dequantized(&x)?;
        let want_dq = match l {
            Linear::PackedBf16 { .. } | Linear::PackedAmx { .. } => {
                x.broadcast_matmul(&round(&w)?.t()?)?.broadcast_add(&b)?
            }
            _ => want.clone(),
        };
        let diff = (&dq - &want_dq)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(diff <= relative * scale, "{name} dequantized: {diff}");
    }
    let (_, _, other) = make(20)?;
    let stacked = Linear::stack(&[&layer, &other])
        .map_err(|e| candle_core::Error::Msg(e.to_string()))?
        .expect("bf16 layers stack");
    assert_eq!(stacked.ggml(), Some(GgmlDType::BF16));
    let x = Tensor::randn(0f32, 1.0, (5, in_dim), &dev)?;
    let parts = Tensor::cat(&[layer.forward(&x)?, other.forward(&x)?], 1)?;
    assert_eq!(
        stacked.forward(&x)?.to_vec2::<f32>()?,
        parts.to_vec2::<f32>()?
    );
    Ok(())
}

/// A weight stored in a block format (a GGUF tensor) keeps that format: Q8_0 / Q4_0 /
/// Q4_K take the integer kernels where they run, the others candle's blocks; its output is
/// the dequantized weight's product within the activation rounding. A pair format with an
/// odd block count per row is dequantized (dense); bytes that do not match the shape are a
/// typed error.
#[test]
fn stored_blocks_keep_their_format() -> candle_core::Result<()> {
    let dev = Device::Cpu;
    let err = |e: CandleError| candle_core::Error::Msg(e.to_string());
    let five_bit_kernel =
        super::quantize::integer_kernel(GgmlDType::Q5_0, DType::F32, &dev).is_some();
    for (ggml, in_dim, kept) in [
        (GgmlDType::Q8_0, 64, true),
        (GgmlDType::Q4_0, 64, true),
        (GgmlDType::Q4K, 256, true),
        (GgmlDType::Q6K, 256, true),
        (GgmlDType::Q5_0, 64, true),
        // an odd block count: packed for the 5-bit kernel where it runs, dequantized otherwise
        (GgmlDType::Q5_0, 96, five_bit_kernel),
    ] {
        let w = Tensor::randn(0f32, 0.2, (24, in_dim), &dev)?;
        let q = QTensor::quantize(&w, ggml)?;
        let dense = q.dequantize(&dev)?;
        let bytes = q.data()?.into_owned();
        let b = Tensor::randn(0f32, 1.0, 24, &dev)?;
        let layer = Linear::from_blocks(
            "w",
            ggml,
            &bytes,
            (24, in_dim),
            Some(b.clone()),
            DType::F32,
            &dev,
        )
        .map_err(err)?;
        assert_eq!(layer.ggml(), kept.then_some(ggml), "{ggml:?} in {in_dim}");
        for rows in [2usize, 9] {
            let x = Tensor::randn(0f32, 1.0, (rows, in_dim), &dev)?;
            let want = x.matmul(&dense.t()?)?.broadcast_add(&b)?;
            let got = layer.forward(&x)?;
            let scale = want.abs()?.max_all()?.to_scalar::<f32>()?;
            let diff = (got - &want)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(
                diff <= 0.02 * scale,
                "{ggml:?} in {in_dim}, {rows} rows: {diff} vs scale {scale}"
            );
        }
        let short = Linear::from_blocks(
            "w",
            ggml,
            &bytes[..bytes.len() - 2],
            (24, in_dim),
            None,
            DType::F32,
            &dev,
        );
        assert!(
            matches!(short, Err(CandleError::Quantize { .. })),
            "{ggml:?}: short bytes accepted"
        );
    }
    Ok(())
}

#[test]
fn ggml_types_follow_the_input_width() {
    assert_eq!(ggml_type(Quantization::Q8_0, 896), Some(GgmlDType::Q8_0));
    assert_eq!(ggml_type(Quantization::Q8_0, 40), None);
    assert_eq!(ggml_type(Quantization::Q4K, 4864), Some(GgmlDType::Q4K));
    assert_eq!(ggml_type(Quantization::Q4K, 896), Some(GgmlDType::Q4_0));
    assert_eq!(ggml_type(Quantization::Q4K, 40), None);
    assert_eq!(ggml_type(Quantization::Q4K, 0), None);
    assert_eq!(ggml_type(Quantization::Bf16, 45), Some(GgmlDType::BF16));
}
