//! The x86 rounding of the activations into signed units, held to the scalar form.

use super::super::qgemm::portable::quantize_block;
use super::*;
use crate::cpu::testing::Rng;

/// The rows' rounding into signed units equals the scalar rounding, value for value, with
/// the sums of the rounded values.
#[test]
fn signed_units_equal_scalar_rounding() {
    if Isa::supported().is_empty() {
        return;
    }
    let mut rng = Rng::new(3);
    let mut rows: Vec<Vec<f32>> = Vec::new();
    for scale in [1e-6f32, 1.0, 3e4] {
        rows.extend(
            rng.normal(40 * BLOCK, scale)
                .chunks_exact(BLOCK)
                .map(<[f32]>::to_vec),
        );
    }
    rows.push((1..=BLOCK).map(|i| i as f32 + 0.5).collect());
    rows.push(vec![0.0; BLOCK]);
    let mut big = vec![-1e-3f32; BLOCK];
    big[5] = 9e9;
    rows.push(big);
    for xs in &rows {
        let (d, q) = quantize_block(xs);
        let want: Vec<u32> = q
            .chunks_exact(4)
            .map(|v| u32::from_le_bytes([v[0] as u8, v[1] as u8, v[2] as u8, v[3] as u8]))
            .collect();
        let mut units = vec![0u32; BLOCK / 4];
        // SAFETY: the CPU has AVX2 + FMA; `xs` holds 32 floats, `units` the block's units.
        let (dv, s) = unsafe { x86::signed_units(xs, units.as_mut_ptr(), 1) };
        let sum: i32 = q.iter().map(|&v| v as i32).sum();
        assert_eq!((d.to_bits(), want, sum), (dv.to_bits(), units, s), "{xs:?}");
    }
}
