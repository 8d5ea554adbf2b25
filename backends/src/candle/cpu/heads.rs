//! The heads of a stacked q | k | v projection on the CPU in f32, in one pass: the projection's
//! rows `(B, L, (H + 2·Hkv)·hd)` are split into head-major `q (B, H, L, hd)`, `k (B, Hkv, L, hd)`
//! and `v (B, Hkv, L, hd)`, with RoPE applied to `q` and `k` on the way.
//!
//! Why: the candle form (three narrows, transposes and `contiguous` copies, then a RoPE op over
//! `q` and one over `k`, each reading and writing the whole tensor) was about a third of the
//! `attention.project` region of a CPU decision, beside the projection's product itself. Here
//! each value is read once and written once, on the rayon threads (one token's heads per task).
//!
//! The rotation is candle's rotate-half RoPE, the same expression in the same order
//! (`x₁·cos − x₂·sin`, `x₁·sin + x₂·cos`), on the first `R = 2·cos.dim(2)` dims of each head;
//! dims `R..hd` pass through. So the result equals the candle form bit for bit (tested), and
//! that form stays the reference (and the path on other devices and dtypes).

use candle_core::{DType, Storage, Tensor};
use rayon::prelude::*;

use super::super::layers::rope::RopeTables;
use crate::error::CandleError;

fn op(name: &'static str) -> impl FnOnce(candle_core::Error) -> CandleError {
    CandleError::tensor(name)
}

/// `n` f32 values of CPU storage `s` from `offset` (an error, never a panic, if it holds fewer).
fn host_f32<'a>(
    s: &'a Storage,
    offset: usize,
    n: usize,
    what: &'static str,
) -> Result<&'a [f32], CandleError> {
    let Storage::Cpu(c) = s else {
        return Err(CandleError::InvalidRequest {
            reason: format!("CPU q|k|v heads: {what} is not on the CPU"),
        });
    };
    c.as_slice::<f32>()
        .map_err(op(what))?
        .get(offset..offset + n)
        .ok_or_else(|| CandleError::InvalidRequest {
            reason: format!("CPU q|k|v heads: {what} storage is shorter than its layout"),
        })
}

/// Whether [`split_rotate`] takes this call: f32 tensors on the CPU.
pub(crate) fn supports(qkv: &Tensor, tables: &RopeTables) -> bool {
    let f32_cpu = |t: &Tensor| t.device().is_cpu() && t.dtype() == DType::F32;
    f32_cpu(qkv) && f32_cpu(&tables.cos) && f32_cpu(&tables.sin)
}

/// `qkv (B, L, (H + 2·Hkv)·hd)` -> `(q (B, H, L, hd), k (B, Hkv, L, hd), v (B, Hkv, L, hd))`,
/// `q` and `k` rotated by `tables` (`cos`, `sin`: `(B, L, R/2)`, `R ≤ hd`, `R` even). Errors
/// (never panics) on shapes that do not fit or a call [`supports`] refuses.
pub(crate) fn split_rotate(
    qkv: &Tensor,
    tables: &RopeTables,
    heads: usize,
    kv_heads: usize,
    hd: usize,
) -> Result<(Tensor, Tensor, Tensor), CandleError> {
    let (b, l, width) = qkv.dims3().map_err(op("q|k|v dims"))?;
    let half = tables.cos.dims().last().copied().unwrap_or(0);
    let all = heads + 2 * kv_heads;
    let bad = |reason: String| CandleError::InvalidRequest {
        reason: format!("CPU q|k|v heads: {reason}"),
    };
    if !supports(qkv, tables) {
        return Err(bad("not f32 on the CPU".into()));
    }
    if width != all * hd {
        return Err(bad(format!(
            "width {width} is not ({heads} + 2·{kv_heads}) heads × {hd}"
        )));
    }
    if tables.cos.dims() != [b, l, half] || tables.sin.dims() != tables.cos.dims() || 2 * half > hd
    {
        return Err(bad(format!(
            "RoPE tables {:?} / {:?} do not fit {b} rows of {l} tokens × head {hd}",
            tables.cos.dims(),
            tables.sin.dims()
        )));
    }
    let qkv = qkv.contiguous().map_err(op("q|k|v contiguous"))?;
    let cos = tables.cos.contiguous().map_err(op("rope cos"))?;
    let sin = tables.sin.contiguous().map_err(op("rope sin"))?;
    // read in place (no host copy of the projection)
    let (qs, ql) = qkv.storage_and_layout();
    let (cs, cl) = cos.storage_and_layout();
    let (ss, sl) = sin.storage_and_layout();
    let src = host_f32(&qs, ql.start_offset(), b * l * width, "q|k|v")?;
    let cos = host_f32(&cs, cl.start_offset(), b * l * half, "rope cos")?;
    let sin = host_f32(&ss, sl.start_offset(), b * l * half, "rope sin")?;
    let mut q = vec![0f32; b * heads * l * hd];
    let mut k = vec![0f32; b * kv_heads * l * hd];
    let mut v = vec![0f32; b * kv_heads * l * hd];
    let (qa, ka, va) = (
        q.as_mut_ptr() as usize,
        k.as_mut_ptr() as usize,
        v.as_mut_ptr() as usize,
    );
    (0..b * l).into_par_iter().for_each(|row| {
        let (bi, li) = (row / l, row % l);
        let x = &src[row * width..][..width];
        let (c, s) = (&cos[row * half..][..half], &sin[row * half..][..half]);
        // head `h` of `n` per row, to (B, n, L, hd)
        let at = |n: usize, h: usize| ((bi * n + h) * l + li) * hd;
        for h in 0..heads + kv_heads {
            let (base, at) = match h < heads {
                true => (qa, at(heads, h)),
                false => (ka, at(kv_heads, h - heads)),
            };
            let from = &x[h * hd..][..hd];
            // SAFETY: `at + hd` lies within q (B·H·L·hd) or k (B·Hkv·L·hd); each (row, head)
            // writes its own run, so no two tasks write the same elements.
            let to = unsafe { std::slice::from_raw_parts_mut((base as *mut f32).add(at), hd) };
            for i in 0..half {
                let (x1, x2) = (from[i], from[i + half]);
                to[i] = x1 * c[i] - x2 * s[i];
                to[i + half] = x1 * s[i] + x2 * c[i];
            }
            to[2 * half..].copy_from_slice(&from[2 * half..]);
        }
        for h in 0..kv_heads {
            let from = &x[(heads + kv_heads + h) * hd..][..hd];
            // SAFETY: as above, within v.
            let to = unsafe {
                std::slice::from_raw_parts_mut((va as *mut f32).add(at(kv_heads, h)), hd)
            };
            to.copy_from_slice(from);
        }
    });
    drop((qs, cs, ss));
    let dev = qkv.device();
    let make = |data: Vec<f32>, n: usize, what| {
        Tensor::from_vec(data, (b, n, l, hd), dev).map_err(op(what))
    };
    Ok((
        make(q, heads, "q heads")?,
        make(k, kv_heads, "k heads")?,
        make(v, kv_heads, "v heads")?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::candle::layers::rope::Rope;
    use candle_core::Device;

    /// The candle form this replaces: narrow, transpose, contiguous per part; RoPE on q and k.
    fn candle_form(
        qkv: &Tensor,
        tables: &RopeTables,
        (h, hkv, hd): (usize, usize, usize),
    ) -> (Tensor, Tensor, Tensor) {
        let (b, l, _) = qkv.dims3().expect("dims");
        let t = qkv.reshape((b, l, h + 2 * hkv, hd)).expect("split");
        let part = |start: usize, n: usize| {
            t.narrow(2, start, n)
                .and_then(|t| t.transpose(1, 2))
                .and_then(|t| t.contiguous())
                .expect("part")
        };
        (
            tables.apply(&part(0, h)).expect("rope q"),
            tables.apply(&part(h, hkv)).expect("rope k"),
            part(h + hkv, hkv),
        )
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .expect("values")
            .into_iter()
            .map(f32::to_bits)
            .collect()
    }

    /// Equal bit for bit to the candle form: full and partial rotation, one token and many,
    /// several rows at their own positions, grouped and ungrouped heads.
    #[test]
    fn equals_the_candle_form_bit_for_bit() {
        let dev = Device::Cpu;
        for (b, l, h, hkv, hd, rotary, start) in [
            (1usize, 37usize, 14usize, 2usize, 64usize, 64usize, 0u32),
            (3, 1, 4, 2, 16, 16, 90),
            (2, 5, 6, 3, 32, 8, 7),
            (4, 3, 2, 2, 8, 8, 1000),
        ] {
            let rope = Rope::new(1_000_000.0, rotary);
            let positions: Vec<u32> = (0..b)
                .flat_map(|r| (0..l as u32).map(move |i| start + 11 * r as u32 + i))
                .collect();
            let tables = rope
                .tables(&positions, b, l, DType::F32, &dev)
                .expect("tables");
            let qkv = Tensor::randn(0f32, 1.0, (b, l, (h + 2 * hkv) * hd), &dev).expect("qkv");
            assert!(supports(&qkv, &tables));
            let (q, k, v) = split_rotate(&qkv, &tables, h, hkv, hd).expect("split");
            let (wq, wk, wv) = candle_form(&qkv, &tables, (h, hkv, hd));
            for (got, want, name) in [(&q, &wq, "q"), (&k, &wk, "k"), (&v, &wv, "v")] {
                assert_eq!(got.dims(), want.dims(), "{name} dims");
                assert_eq!(
                    bits(got),
                    bits(want),
                    "{name}: b {b} l {l} h {h}/{hkv} hd {hd} R {rotary}"
                );
            }
        }
    }

    /// Shapes that do not fit, and a dtype it does not take, are errors naming what is wrong.
    #[test]
    fn misfits_are_errors() {
        let dev = Device::Cpu;
        let rope = Rope::new(10_000.0, 8);
        let tables = rope
            .tables(&[0, 1, 2], 1, 3, DType::F32, &dev)
            .expect("tables");
        let qkv = Tensor::zeros((1, 3, 5 * 8), DType::F32, &dev).expect("qkv");
        let e = split_rotate(&qkv, &tables, 2, 2, 8).expect_err("width 40 is not 6 heads");
        assert!(e.to_string().contains("is not (2 + 2·2) heads × 8"), "{e}");
        let qkv = Tensor::zeros((1, 4, 4 * 8), DType::F32, &dev).expect("qkv");
        let e = split_rotate(&qkv, &tables, 2, 1, 8).expect_err("4 tokens, tables for 3");
        assert!(e.to_string().contains("do not fit"), "{e}");
        let qkv = Tensor::zeros((1, 3, 4 * 8), DType::BF16, &dev).expect("qkv");
        assert!(!supports(&qkv, &tables));
        let e = split_rotate(&qkv, &tables, 2, 1, 8).expect_err("bf16");
        assert!(e.to_string().contains("not f32 on the CPU"), "{e}");
    }
}
