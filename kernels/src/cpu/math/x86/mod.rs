//! The x86 forms of the vector math: eight lanes under AVX2 + FMA, sixteen under AVX-512.

use std::arch::x86_64::*;

use super::{HI, LN2_HI, LN2_LO, LO, LOG2E, P};

mod avx2;
mod avx512;

pub(crate) use avx2::exp8;
pub(super) use avx2::{exp_shifted_sum, max, silu_mul, silu_mul_rows16_256};
pub(crate) use avx512::exp16;
pub(super) use avx512::{silu_mul512, silu_mul_rows16_512};
