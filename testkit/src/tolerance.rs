//! Named numeric tolerances. Tests compare through these presets instead of literals, so the
//! agreement each comparison promises is stated once and visible in one place.

/// An absolute tolerance with a name that says which comparison it is for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    pub name: &'static str,
    pub abs: f32,
}

impl Tolerance {
    /// Bit-for-bit: the fake backend and anything that must not move at all.
    pub const EXACT: Tolerance = Tolerance {
        name: "exact",
        abs: 0.0,
    };
    /// CPU f32 vs CPU f32 along different code paths (batched vs one row, chunked vs one-shot,
    /// slot-merged vs alone). Only summation order differs.
    pub const CPU_F32_STRICT: Tolerance = Tolerance {
        name: "cpu-f32-strict",
        abs: 1e-5,
    };
    /// CPU f32 vs CPU f32 on raw logits of the tiny models, whose logits spread to |x| ≈ 50 on
    /// purpose: one f32 ulp at 32–64 is 3.8e-6, and a different summation order (chunked vs
    /// one-shot prefill, batched vs single-row matmuls) moves a logit by a few ulps. Measured:
    /// 3.05e-5 on a chunked vs one-shot prefill's top log-probabilities (`vocab` test, Qwen2.5,
    /// CPU attention kernel; 2.29e-5 through the candle attention ops), so 4e-5.
    pub const CPU_F32_LOGITS: Tolerance = Tolerance {
        name: "cpu-f32-logits",
        abs: 4e-5,
    };
    /// CPU f32 vs CPU f32 on raw logits of the tiny models when rows are batched, right-padded
    /// or slot-merged in random mixes (the scoring proptests) vs each row alone: the matmul
    /// kernels tile and split differently with the row count, and a random mix can stack those
    /// differences. Measured: up to 3.58e-5 (~9 ulps at |50|, a `slot_merging_equals_each_row_alone`
    /// case, kept in its regression file), above [`Tolerance::CPU_F32_LOGITS`]; the preset
    /// leaves ~3x headroom.
    pub const CPU_F32_BATCHED_LOGITS: Tolerance = Tolerance {
        name: "cpu-f32-batched-logits",
        abs: 1e-4,
    };
    /// CPU f32 vs CPU f32 on a literal choice's summed log-likelihood (Σ logit − logsumexp along
    /// its path) on the tiny models: sums reach |x| ≈ 160, where one f32 ulp is 1.5e-5, and each
    /// of the path's terms moves by a few ulps of a logit with the summation order (a packed
    /// token tree vs full prompts measured 3.05e-5 on Qwen3, two ulps at 150).
    pub const CPU_F32_LOGLIK_SUM: Tolerance = Tolerance {
        name: "cpu-f32-loglik-sum",
        abs: 1e-4,
    };
    /// decide_many vs separate calls on CPU f32, probabilities.
    pub const CPU_F32_PROB: Tolerance = Tolerance {
        name: "cpu-f32-prob",
        abs: 1e-6,
    };
    /// forkscore CPU f32 vs Hugging Face transformers f32 (different kernels and op order;
    /// transformers' own cached continuation differs from its full forward by up to ~1.3e-4 on
    /// Qwen3.5 token-by-token).
    pub const VS_TRANSFORMERS_F32: Tolerance = Tolerance {
        name: "vs-transformers-f32",
        abs: 1e-4,
    };
    /// GPU f32 (CUDA, cuBLAS in full f32, no TF32) vs CPU f32, on the tiny models' raw logits
    /// (|x| up to ~50): different kernels and summation orders. Measured on a GPU (Qwen2.5,
    /// Qwen3, Qwen3.5 tiny; forward_full, prefill+score, chunked): at most 3.05e-5 (~8 ulps at
    /// 50); the preset leaves ~3x headroom. See docs/GPU.md.
    pub const GPU_F32_LOGITS: Tolerance = Tolerance {
        name: "gpu-f32-logits",
        abs: 1e-4,
    };
    /// GPU bf16 vs CPU f32, on logits.
    pub const GPU_BF16_LOGITS: Tolerance = Tolerance {
        name: "gpu-bf16-logits",
        abs: 0.25,
    };
    /// GPU bf16 vs CPU f32 (and GPU bf16 fork vs full) on the tiny models' raw logits, which
    /// spread to |x| ~ 50 on purpose: bf16 keeps 8 mantissa bits (one ulp at 32-64 is 0.25), so
    /// a logit near 50 is off by ~0.1-0.5 from rounding the weights, activations and K/V alone.
    /// Measured: at most 0.77 (Qwen3 forward_full), no argmax changed; the same as
    /// CPU bf16 vs CPU f32 (0.78). See docs/GPU.md.
    pub const GPU_BF16_TINY_LOGITS: Tolerance = Tolerance {
        name: "gpu-bf16-tiny-logits",
        abs: 1.5,
    };

    /// CUDA bf16 flash attention vs the candle attention path in bf16, on attention outputs of
    /// inputs in [-1, 1] (|out| < 1): the flash kernel keeps the scores in f32 where candle's
    /// bf16 matmul rounds them, and both round the probabilities to bf16 before P·V, so outputs
    /// differ by a few bf16 ulps (one ulp below 1 is 2^-8 ≈ 0.004).
    pub const GPU_BF16_ATTENTION: Tolerance = Tolerance {
        name: "gpu-bf16-flash-vs-candle-attention",
        abs: 0.03,
    };
    /// CPU attention on the AMX bf16 tiles (`bf16=1`: queries after their scale and softmax
    /// weights rounded to bf16, scores and sums in f32) vs the candle path on the same
    /// operands rounded to bf16, on attention outputs of inputs in (-2, 2) (|out| < 2): one bf16
    /// ulp below 2 is 2^-7. Measured (`backends`' `amx_bf16_form_tracks_the_candle_path_on_rounded_operands`):
    /// at most 8.3e-3. The preset leaves ~3.5x headroom; a wrong tile moves outputs by ~1.
    pub const CPU_BF16_ATTENTION: Tolerance = Tolerance {
        name: "cpu-bf16-amx-attention",
        abs: 0.03,
    };
    /// CUDA chunked delta rule on the tensor cores (`gdn_chunked.cu`: TF32 products, 10 mantissa
    /// bits, f32 accumulation and state) vs the f32 candle forms, layer by layer on the GPU
    /// test's random layers (outputs of |x| up to ~10). Measured: at most 1.07e-3
    /// (outputs; states 1.5e-4); the harness measured ≤ 4.8e-4 relative to float64. The preset
    /// leaves ~5x headroom.
    pub const GPU_TF32_DELTA_RULE: Tolerance = Tolerance {
        name: "gpu-tf32-chunked-delta-rule",
        abs: 5e-3,
    };
    /// CPU, linear weights quantized to Q8_0 at load vs the same checkpoint unquantized, on the
    /// tiny models' raw logits (|x| up to ~50); also CUDA q8_0 vs CPU q8_0 in f32. Measured on
    /// the CPU:
    /// - through candle's kernels and the dequantized GEMM (f32 activations, what CUDA runs for
    ///   many rows): at most 0.19 on `backends/tests/quantized.rs`'s 36-token prompt, 0.47 on a
    ///   57-token one (4,096 candidates);
    /// - through the integer kernel, which also rounds every activation row to 8-bit blocks:
    ///   at most 0.34 and 0.84 on those prompts (Qwen2.5 / Qwen3; Qwen3.5 ≤ 0.19);
    /// - the integer kernel vs the dequantized path (the CUDA-vs-CPU comparison): at most 0.79
    ///   on the 57-token prompt.
    ///
    /// The preset leaves ~2.4x headroom over the largest; a wrong kernel moves these logits by
    /// tens.
    pub const Q8_0_TINY_LOGITS: Tolerance = Tolerance {
        name: "q8_0-tiny-logits",
        abs: 2.0,
    };
    /// CPU `--quantize int8` (each weight row rounded to int8 with one scale, each activation
    /// row likewise per product, exact i32 sums) vs the same checkpoint in f32, on the tiny
    /// models' raw logits (|x| up to ~50). Measured (`backends/tests/quantized.rs`, 36-token
    /// prompt, AMX-INT8 tiles): at most 0.26 (Qwen2.5), 0.33 (Qwen3), 0.035 (Qwen3.5), about
    /// q8_0's figures. The preset leaves ~3x headroom; a wrong kernel moves these logits by tens.
    pub const INT8_TINY_LOGITS: Tolerance = Tolerance {
        name: "int8-tiny-logits",
        abs: 1.0,
    };
    /// As [`Tolerance::Q8_0_TINY_LOGITS`] for `q4k` (Q4_K, or its Q5_0 fallback on narrow
    /// inputs). Measured: at most 3.8 (hidden-256 Qwen3 in Q4_K; the hidden-32 models in the
    /// Q4_0 fallback 0.34–1.9); 4-bit weights move logits of |x| ≈ 50 by a few units.
    pub const Q4_TINY_LOGITS: Tolerance = Tolerance {
        name: "q4-tiny-logits",
        abs: 8.0,
    };
    /// CPU, linear weights rounded to bf16 at load (`bf16`: the products multiply bf16 weights
    /// by activations rounded to bf16, summed in f32; norms, attention and the head in f32) vs
    /// the same checkpoint in f32, on the tiny models' raw logits (|x| up to ~50): bf16 keeps 8
    /// significant bits, so each product moves by up to 2⁻⁸ of its size. Measured
    /// (`backends/tests/quantized.rs`, 36-token prompt): at most 0.11 through the AVX-512 BF16
    /// kernel and 0.17 through candle's bf16 matmul (`FORKSCORE_CPU_ISA=avx2`; it also rounds
    /// each product's output), on Qwen2.5 / Qwen3 / Qwen3.5 and a hidden-40 Qwen3. The preset
    /// leaves ~3x headroom; a wrong kernel moves these logits by tens.
    pub const BF16_WEIGHTS_TINY_LOGITS: Tolerance = Tolerance {
        name: "bf16-weights-tiny-logits",
        abs: 0.5,
    };

    /// Largest absolute difference between two equally long slices (NaN counts as infinite).
    pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len(), "compared slices differ in length");
        a.iter()
            .zip(b)
            .map(|(x, y)| {
                let d = (x - y).abs();
                if d.is_nan() {
                    f32::INFINITY
                } else {
                    d
                }
            })
            .fold(0.0, f32::max)
    }

    /// True when every pair is within the tolerance.
    pub fn accepts(&self, a: &[f32], b: &[f32]) -> bool {
        Self::max_abs_diff(a, b) <= self.abs
    }

    /// Panic with both slices and the measured difference when they disagree.
    #[track_caller]
    pub fn assert_close(&self, what: &str, a: &[f32], b: &[f32]) {
        let d = Self::max_abs_diff(a, b);
        assert!(
            d <= self.abs,
            "{what}: max |diff| = {d:e} exceeds tolerance {} ({:e})\n left: {a:?}\nright: {b:?}",
            self.name,
            self.abs
        );
    }
}

#[cfg(test)]
mod tests {
    use super::Tolerance;

    #[test]
    fn max_abs_diff_treats_nan_as_infinite() {
        assert_eq!(
            Tolerance::max_abs_diff(&[1.0, f32::NAN], &[1.0, 0.0]),
            f32::INFINITY
        );
        assert!(Tolerance::CPU_F32_STRICT.accepts(&[1.0, 2.0], &[1.000001, 2.0]));
        assert!(!Tolerance::EXACT.accepts(&[1.0], &[1.000001]));
    }
}
