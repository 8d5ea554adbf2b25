//! The x86 rounding of the activations, held to the scalar form of [`super::portable`].

use super::portable::quantize_block;
use super::*;
use crate::cpu::testing::Rng;

/// One broadcast unit of `isa`'s kernel from `G` rounded values.
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
#[test]
fn vector_rounding_equals_scalar_rounding() {
    let mut rng = Rng::new(1);
    let mut blocks: Vec<Vec<f32>> = Vec::new();
    for scale in [1e-6f32, 1.0, 3e4] {
        let x = rng.normal(200 * BLOCK, scale);
        blocks.extend(x.chunks_exact(BLOCK).map(<[f32]>::to_vec));
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
            let (d, q) = quantize_block(b);
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
}

/// The rows' rounding and packing in registers (`quantize_units`) equals rounding each
/// block with the scalar form and packing its units one by one, at every ISA level: random
/// rows of three scales, exact ties, zeros and a huge value, row counts not a multiple of
/// the tile's.
#[test]
fn packed_rounding_equals_scalar_rounding_and_packing() {
    let mut rng = Rng::new(2);
    let k = 4 * BLOCK;
    let mut rows: Vec<Vec<f32>> = Vec::new();
    for scale in [1e-6f32, 1.0, 3e4] {
        rows.extend(
            rng.normal(5 * k, scale)
                .chunks_exact(k)
                .map(<[f32]>::to_vec),
        );
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
                    let (d, q) = quantize_block(xs);
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
}
