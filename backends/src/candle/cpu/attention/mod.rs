//! The tensor-facing shell of the CPU attention kernel (`forkscore_kernels::cpu::attention`):
//! checks a call's tensors (f32 on the CPU, grouped heads, a past that fits its rows, a tree
//! mask's visibility), reads their storage as contiguous slices and shapes the kernel's
//! `(B, L, H·hd)` output back into a tensor. The kernel computes the same function as
//! [`super::super::layers::attention`]'s candle path, its reference: the equivalence tests below
//! hold it there.

use candle_core::{DType, Layout, Storage, Tensor};
use forkscore_kernels::cpu::attention::{self as kernel, NewKeys, Shape};

use super::super::layers::mask::NewKeysMask;
use super::super::layers::past_kv::PastKv;
use crate::error::CandleError;

#[cfg(test)]
use kernel::TileForm;
pub(crate) use kernel::TileSizes;

/// The sizes this process runs with (`FORKSCORE_CPU_ATTENTION` over the default, read and
/// parsed once; an invalid value is an error naming it), and whether that value sets `bf16`
/// itself (then it holds over the layers' precision).
fn chosen_sizes() -> Result<(TileSizes, bool), CandleError> {
    use std::sync::OnceLock;
    static CHOSEN: OnceLock<Result<(TileSizes, bool), String>> = OnceLock::new();
    let chosen = CHOSEN.get_or_init(|| match crate::switches::value("FORKSCORE_CPU_ATTENTION") {
        None => Ok((TileSizes::default(), false)),
        Some(s) => {
            let names_bf16 = s.split(',').any(|part| {
                part.split_once('=')
                    .is_some_and(|(k, _)| k.trim() == "bf16")
            });
            TileSizes::parse(s)
                .map(|t| (t, names_bf16))
                .map_err(|e| format!("FORKSCORE_CPU_ATTENTION={s:?}: {e}"))
        }
    });
    chosen
        .clone()
        .map_err(|reason| CandleError::InvalidRequest { reason })
}

/// Whether [`attend`] computes this call: f32 on the CPU, grouped heads that divide evenly.
pub(crate) fn supports(
    q: &Tensor,
    k_new: &Tensor,
    v_new: &Tensor,
    past: Option<&PastKv<'_>>,
) -> bool {
    let (Ok((_, h, _, hd)), Ok((_, hkv, _, _))) = (q.dims4(), k_new.dims4()) else {
        return false;
    };
    let f32_cpu = |t: &Tensor| t.device().is_cpu() && t.dtype() == DType::F32;
    f32_cpu(q)
        && f32_cpu(k_new)
        && f32_cpu(v_new)
        && past.is_none_or(|p| f32_cpu(p.k) && f32_cpu(p.v))
        && hd > 0
        && hkv > 0
        && h % hkv == 0
}

fn op(name: &'static str) -> impl FnOnce(candle_core::Error) -> CandleError {
    CandleError::tensor(name)
}

/// The f32 elements of a contiguous CPU tensor's storage.
fn cpu_f32<'a>(s: &'a Storage, l: &Layout, what: &'static str) -> Result<&'a [f32], CandleError> {
    let Storage::Cpu(c) = s else {
        return Err(CandleError::InvalidRequest {
            reason: format!("CPU attention: {what} is not on the CPU"),
        });
    };
    let all = c.as_slice::<f32>().map_err(op(what))?;
    let n = l.shape().elem_count();
    all.get(l.start_offset()..l.start_offset() + n)
        .ok_or_else(|| CandleError::InvalidRequest {
            reason: format!("CPU attention: {what} storage is shorter than its layout"),
        })
}

/// Attention output `(B, L, H·hd)` of queries `(B, H, L, hd)` over an optional past
/// `(Hkv, S, P, hd)` of `S` slots (rows slot-major, `S` divides `B`), each row's past visible
/// from `past_start[b]` (`(B,)` u32; all of it when `None`), and the new keys/values
/// `(B, Hkv, L, hd)` under `new_keys` (`None`: all visible); with `bf16`, the products on the
/// AMX bf16 tiles where AMX runs (the kernel's `TileSizes::bf16`). The caller checked
/// [`supports`].
pub(crate) fn attend(
    q: &Tensor,
    k_new: &Tensor,
    v_new: &Tensor,
    past: Option<&PastKv<'_>>,
    past_start: Option<&Tensor>,
    new_keys: Option<&NewKeysMask>,
    bf16: bool,
) -> Result<Tensor, CandleError> {
    let (mut sizes, names_bf16) = chosen_sizes()?;
    // the layer's precision, unless `FORKSCORE_CPU_ATTENTION` sets `bf16` itself
    if !names_bf16 {
        sizes.bf16 = bf16;
    }
    attend_with(q, k_new, v_new, past, past_start, new_keys, sizes)
}

/// [`attend`] cut into tiles by `sizes`.
pub(crate) fn attend_with(
    q: &Tensor,
    k_new: &Tensor,
    v_new: &Tensor,
    past: Option<&PastKv<'_>>,
    past_start: Option<&Tensor>,
    new_keys: Option<&NewKeysMask>,
    sizes: TileSizes,
) -> Result<Tensor, CandleError> {
    let (b, h, l, hd) = q.dims4().map_err(op("attention q dims"))?;
    let (kb, hkv, kl, khd) = k_new.dims4().map_err(op("attention k dims"))?;
    if (kb, kl, khd) != (b, l, hd) || v_new.dims() != k_new.dims() || hkv == 0 || h % hkv != 0 {
        return Err(CandleError::InvalidRequest {
            reason: format!(
                "CPU attention: queries {:?} do not match keys {:?} / values {:?}",
                q.dims(),
                k_new.dims(),
                v_new.dims()
            ),
        });
    }
    let (slots, p) = match past {
        Some(pk) => {
            let (phkv, slots, p, phd) = pk.k.dims4().map_err(op("past k dims"))?;
            if phkv != hkv
                || phd != hd
                || pk.v.dims() != pk.k.dims()
                || slots == 0
                || b % slots != 0
            {
                return Err(CandleError::InvalidRequest {
                    reason: format!(
                        "CPU attention: past {:?} / {:?} does not fit {b} rows of {hkv} KV heads × {hd}",
                        pk.k.dims(),
                        pk.v.dims()
                    ),
                });
            }
            (slots, p)
        }
        None => (1, 0),
    };
    let starts: Vec<usize> = match past_start {
        Some(t) => {
            let v = t.to_vec1::<u32>().map_err(op("past starts"))?;
            if v.len() != b {
                return Err(CandleError::InvalidRequest {
                    reason: format!("CPU attention: {} past starts for {b} rows", v.len()),
                });
            }
            v.into_iter().map(|s| (s as usize).min(p)).collect()
        }
        None => vec![0; b],
    };
    let visibility: Option<Vec<u8>> = match new_keys {
        Some(m) if m.is_tree() => {
            let v = m.visibility()?.ok_or_else(|| CandleError::InvalidRequest {
                reason: "CPU attention: a tree mask without its visibility".into(),
            })?;
            let v = v
                .flatten_all()
                .and_then(|v| v.to_vec1::<u8>())
                .map_err(op("tree visibility"))?;
            if v.len() != l * l {
                return Err(CandleError::InvalidRequest {
                    reason: format!(
                        "CPU attention: a {}-entry tree mask for {l} new tokens",
                        v.len()
                    ),
                });
            }
            Some(v)
        }
        _ => None,
    };
    let keys = match (new_keys, &visibility) {
        (None, _) => NewKeys::All,
        (Some(_), Some(v)) => NewKeys::Tree(v),
        (Some(_), None) => NewKeys::Causal,
    };

    let q = q.contiguous().map_err(op("attention q"))?;
    let k_new = k_new.contiguous().map_err(op("attention k"))?;
    let v_new = v_new.contiguous().map_err(op("attention v"))?;
    let past = past
        .map(|pk| Ok::<_, candle_core::Error>((pk.k.contiguous()?, pk.v.contiguous()?)))
        .transpose()
        .map_err(op("attention past"))?;
    let (qs, ql) = q.storage_and_layout();
    let (ks, kl_) = k_new.storage_and_layout();
    let (vs, vl) = v_new.storage_and_layout();
    let qd = cpu_f32(&qs, ql, "queries")?;
    let kd = cpu_f32(&ks, kl_, "keys")?;
    let vd = cpu_f32(&vs, vl, "values")?;
    let past_guards = past
        .as_ref()
        .map(|(k, v)| (k.storage_and_layout(), v.storage_and_layout()));
    let (pkd, pvd): (&[f32], &[f32]) = match &past_guards {
        Some(((pks, pkl), (pvs, pvl))) => (
            cpu_f32(pks, pkl, "past keys")?,
            cpu_f32(pvs, pvl, "past values")?,
        ),
        None => (&[], &[]),
    };

    let shape = Shape {
        b,
        h,
        hkv,
        l,
        hd,
        p,
        slots,
    };
    let out =
        kernel::attend(shape, (qd, kd, vd), (pkd, pvd), &starts, keys, sizes).map_err(|e| {
            CandleError::InvalidRequest {
                reason: e.to_string(),
            }
        })?;
    drop((qs, ks, vs, past_guards));
    Tensor::from_vec(out, (b, l, h * hd), q.device()).map_err(op("attention out"))
}

#[cfg(test)]
mod tests;
