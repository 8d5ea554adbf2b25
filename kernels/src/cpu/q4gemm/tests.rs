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
        let (dv, s, low) = unsafe { x86::signed_units(xs, units.as_mut_ptr(), 1) };
        let sum: i32 = q.iter().map(|&v| v as i32).sum();
        let first: i32 = q[..16].iter().map(|&v| v as i32).sum();
        assert_eq!(
            (d.to_bits(), want, sum, first),
            (dv.to_bits(), units, s, low),
            "{xs:?}"
        );
    }
}

/// The packed weight's size: 4 bits a value (plus the high bits of `Q5_0` / `Q6_K`), two 8-bit
/// multipliers per 32 values, and two f32 factors per 256 values (`Q4_K`) or one per 32
/// (`Q4_0`, `Q5_0`) or 256 (`Q6_K`), whatever the blocks hold.
#[test]
fn packed_sizes_stay_near_the_file_form() {
    let (n, k) = (48, 512);
    let mut rng = Rng::new(5);
    let mut raw = |len: usize| -> Vec<u8> {
        rng.normal(len, 100.0)
            .iter()
            .map(|v| v.to_bits() as u8)
            .collect()
    };
    let q4k = PackedQ4::from_blocks(Q4Format::Q4K, &raw(n * (k / 256) * 144), n, k, Isa::Avx2)
        .expect("fits");
    assert_eq!(
        q4k.bytes(),
        n * k / 2 + 2 * n * k / 32 + 2 * 4 * n * k / 256
    );
    assert!((q4k.bytes() as f64 / (n * k) as f64) < 0.6);
    let q40 = PackedQ4::from_blocks(Q4Format::Q4_0, &raw(n * (k / 32) * 18), n, k, Isa::Avx2)
        .expect("fits");
    assert_eq!(q40.bytes(), n * k / 2 + 2 * n * k / 32 + 4 * n * k / 32);
    // Q5_0: the fifth bits add one bit a value; Q6_K: two bits a value, its two signed scales
    // per 32 values as bytes and one f32 `d` per 256
    let q50 = PackedQ4::from_blocks(Q4Format::Q5_0, &raw(n * (k / 32) * 22), n, k, Isa::Avx2)
        .expect("fits");
    assert_eq!(
        q50.bytes(),
        n * k / 2 + n * k / 8 + 2 * n * k / 32 + 4 * n * k / 32
    );
    assert!((q50.bytes() as f64 / (n * k) as f64) < 0.82);
    let q6k = PackedQ4::from_blocks(Q4Format::Q6K, &raw(n * (k / 256) * 210), n, k, Isa::Avx2)
        .expect("fits");
    assert_eq!(
        q6k.bytes(),
        n * k / 2 + n * k / 4 + 2 * n * k / 32 + 4 * n * k / 256
    );
    assert!((q6k.bytes() as f64 / (n * k) as f64) < 0.83);
    // a partial last panel is padded to 16 columns
    let odd = PackedQ4::from_blocks(Q4Format::Q4K, &raw(20 * (k / 256) * 144), 20, k, Isa::Avx2)
        .expect("fits");
    assert_eq!(
        odd.bytes(),
        32 * k / 2 + 2 * 32 * k / 32 + 2 * 4 * 32 * k / 256
    );
}
