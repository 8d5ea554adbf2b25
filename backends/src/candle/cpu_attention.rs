//! Attention on the CPU in f32 without the candle ops' intermediate tensors: the same function
//! as [`super::attention`]'s candle path (its reference, held to it by the equivalence tests
//! below), computed tile by tile on the rayon threads.
//!
//! Work is split into tiles `(KV head j, rows b0..b1, queries i0..i1)`; a tile's query rows are
//! its rows' `G` query heads of KV head `j` at those positions, `M = rows · G · queries` in all,
//! copied once into a scratch `(M, hd)` matrix pre-scaled by `hd^-1/2`. Per tile:
//! - scores against the slot's past keys in one product `(M, hd) x (hd, P)` (the past is read in
//!   place, never copied per row), then against each row's own new keys `(G·n, hd) x (hd, N)`,
//!   where `N` stops at the tile's last query under a causal or tree mask (later keys are hidden
//!   from every query of the tile);
//! - one softmax per query row over `past[start..P] ++ visible new keys`, with a vectorised
//!   maximum and `exp` ([`super::cpu_math`]); hidden keys get exactly 0; the row is left
//!   unnormalised;
//! - the values `(M, P) x (P, hd)` plus each row's `(G·n, N) x (N, hd)`, each output row then
//!   divided by its row's sum, written straight into the `(B, L, H·hd)` output, heads merged.
//!
//! A long call (a prefill) gets one tile per row and block of [`TileSizes::query_block`]
//! queries, so no `L × L` matrix is held and the keys after each block are never scored; a short
//! call (the scoring pass: many rows of a few tokens) gets tiles of several rows, about
//! [`TileSizes::tile_rows`] query rows each, one thread per tile.
//!
//! A tile is computed in one of two forms ([`TileForm`]):
//! - **key-major** ([`super::cpu_key_major`]), where the CPU has AVX-512 and the head dim is a
//!   multiple of 16 (16-lane registers), or for prefills where it has AVX2 + FMA and the head
//!   dim is a multiple of 8 (8-lane ones): scores held keys × queries in full registers, a softmax taken
//!   online over blocks of keys, keys packed once per call. At 16 lanes 1.4–2.0× the products
//!   form's speed in the `cpu_attention` bench on AVX-512 CPUs (e.g. a 964-token prefill's
//!   layer 5.3 ms against 9.6, 28 scoring rows over it 1.6 against 2.7), the gain varying with
//!   the CPU;
//! - **products**, on every CPU, and the reference the key-major form is tested against: the
//!   products through the `gemm` crate (the kernel candle's own CPU matmul uses). (Products
//!   through the packed kernel of [`super::cpu_gemm`], with keys and values packed per tile,
//!   measured no faster in the `cpu_attention` bench; the row maximum, a scalar fold, and the
//!   normalisation pass over every score were what took the time: vectorising the one and
//!   moving the other to the output rows made the form 1.1–2× faster there.)
//!
//! Before this kernel, attention was 3.2 s of a 28-field, 964-token CPU decision's 10.7 s
//! (candle ops: scale, transposes, score matrices, mask adds, a softmax pass, concatenations).

use candle_core::{DType, Layout, Storage, Tensor};
use rayon::prelude::*;

use super::cpu_math;
use super::mask::NewKeysMask;
use super::past_kv::PastKv;
use crate::error::CandleError;

/// Which form computes a tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TileForm {
    /// The key-major form ([`super::cpu_key_major`]) at the widest registers that fit: 16
    /// lanes where the CPU has AVX-512 and the head dim is a multiple of 16, else 8 for long
    /// calls (prefills) where it has AVX2 + FMA and the head dim is a multiple of 8; the
    /// products form elsewhere.
    Auto,
    /// The key-major form at 8 lanes (AVX2) even where AVX-512 runs, for A/B runs and tests;
    /// the products form where the CPU or head dim does not allow it.
    KeyMajorAvx2,
    /// The products form below on every CPU: the reference the other form is tested against.
    Products,
}

/// How calls are cut into tiles and which form computes them. [`TileSizes::default`], or
/// `FORKSCORE_CPU_ATTENTION` (`query_block=…,tile_rows=…,form=auto|products|avx2`, any key; read
/// once) over it, to compare on one machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TileSizes {
    /// Queries per tile of a long call (more than this many new tokens: a prefill).
    pub query_block: usize,
    /// Query rows (rows · heads · queries) a tile of a short call aims at.
    pub tile_rows: usize,
    /// Keys per block of the key-major form's online softmax (rounded up to whole groups of
    /// [`super::cpu_key_major`]'s packed keys).
    pub key_block: usize,
    /// The form that computes a tile.
    pub form: TileForm,
}

/// 32-query blocks and 168-key softmax blocks: the fastest of the `cpu_attention` bench's
/// sweep (round-robin against 64 / 84 and 16–336: 3–10 % less time
/// for the prefill and scoring cases; the products form was no slower at 32 than at 64).
impl Default for TileSizes {
    fn default() -> Self {
        TileSizes {
            query_block: 32,
            tile_rows: 256,
            key_block: 168,
            form: TileForm::Auto,
        }
    }
}

impl TileSizes {
    /// `spec` (`key=count` pairs, keys `query_block`, `tile_rows`, `key_block`, and
    /// `form=auto|products|avx2`)
    /// over the default; an error names a wrong key, form or a zero.
    pub(crate) fn parse(spec: &str) -> Result<Self, String> {
        let mut t = TileSizes::default();
        let mut counts = Vec::new();
        for part in spec.split(',') {
            match part.split_once('=') {
                Some((key, form)) if key.trim() == "form" => {
                    t.form = match form.trim() {
                        "auto" => TileForm::Auto,
                        "products" => TileForm::Products,
                        "avx2" => TileForm::KeyMajorAvx2,
                        other => {
                            return Err(format!(
                                "`{}`: unknown form `{other}` (auto, products, avx2)",
                                part.trim()
                            ))
                        }
                    }
                }
                _ => counts.push(part),
            }
        }
        for (part, key, v) in super::cpu_host::spec_counts(&counts.join(","))? {
            let slot = match key {
                "query_block" => &mut t.query_block,
                "tile_rows" => &mut t.tile_rows,
                "key_block" => &mut t.key_block,
                other => {
                    return Err(format!(
                        "unknown key `{other}` (query_block, tile_rows, key_block, form)"
                    ))
                }
            };
            if v == 0 {
                return Err(format!("`{part}`: must be at least 1"));
            }
            *slot = v;
        }
        Ok(t)
    }

    /// The sizes this process runs with (`FORKSCORE_CPU_ATTENTION` over the default, read
    /// once; an invalid value is an error naming it).
    pub(crate) fn chosen() -> Result<Self, CandleError> {
        use std::sync::OnceLock;
        static SPEC: OnceLock<Option<&str>> = OnceLock::new();
        match SPEC.get_or_init(|| crate::switches::value("FORKSCORE_CPU_ATTENTION")) {
            None => Ok(TileSizes::default()),
            Some(s) => TileSizes::parse(s).map_err(|e| CandleError::InvalidRequest {
                reason: format!("FORKSCORE_CPU_ATTENTION={s:?}: {e}"),
            }),
        }
    }
}

/// Which of the call's new keys each query sees.
enum NewKeys<'a> {
    /// Every new key (no mask: a one-token call).
    All,
    /// Query `i` sees new keys `0..=i`.
    Causal,
    /// `(L, L)` row-major, 1 where query `i` sees key `j` (a packed token tree).
    Tree(&'a [u8]),
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

/// One tile: KV head `j`, rows `b0..b1` (all in one past slot), queries `i0..i1`.
#[derive(Debug, Clone, Copy)]
struct Tile {
    j: usize,
    b0: usize,
    b1: usize,
    i0: usize,
    i1: usize,
}

/// A tile's extents, for `G` query heads per KV head and `L` new tokens a row.
struct Extent {
    /// Rows and queries of the tile.
    nb: usize,
    ni: usize,
    /// Query rows of one row of the tile (`G · queries`), and of the whole tile.
    per_row: usize,
    m: usize,
    /// New keys any query of the tile may see.
    n_new: usize,
}

impl Tile {
    fn extent(&self, g: usize, l: usize, keys: &NewKeys<'_>) -> Extent {
        let (nb, ni) = (self.b1 - self.b0, self.i1 - self.i0);
        Extent {
            nb,
            ni,
            per_row: g * ni,
            m: nb * g * ni,
            n_new: match keys {
                NewKeys::All => l,
                NewKeys::Causal | NewKeys::Tree(_) => self.i1,
            },
        }
    }
}

/// The tiles of a call of `b` rows over `slots` past slots (1 without a past), `l` new tokens.
fn tiles(hkv: usize, g: usize, b: usize, slots: usize, l: usize, sizes: TileSizes) -> Vec<Tile> {
    let mut out = Vec::new();
    let per_slot = b / slots;
    let qb = sizes.query_block;
    for j in 0..hkv {
        if l > qb {
            for row in 0..b {
                for i0 in (0..l).step_by(qb) {
                    let i1 = (i0 + qb).min(l);
                    out.push(Tile {
                        j,
                        b0: row,
                        b1: row + 1,
                        i0,
                        i1,
                    });
                }
            }
        } else {
            let rows = (sizes.tile_rows / (g * l).max(1)).max(1);
            for slot in 0..slots {
                let (start, end) = (slot * per_slot, (slot + 1) * per_slot);
                for b0 in (start..end).step_by(rows) {
                    out.push(Tile {
                        j,
                        b0,
                        b1: (b0 + rows).min(end),
                        i0: 0,
                        i1: l,
                    });
                }
            }
        }
    }
    out
}

/// `C (m, n) = A (m, k) · B (k, n)` (or `C += …` when `accumulate`), one thread, strides in
/// elements: `A[r][c] = a[r·a_rs + c·a_cs]`, likewise `B`, and `C` row-major with row stride
/// `c_rs`.
///
/// # Safety
/// Every addressed element of `a`, `b` and `c` must be in bounds of its allocation, and `c`
/// must not overlap `a` or `b`.
#[allow(clippy::too_many_arguments)]
unsafe fn product(
    (m, n, k): (usize, usize, usize),
    c: *mut f32,
    c_rs: usize,
    accumulate: bool,
    (a, a_rs, a_cs): (*const f32, usize, usize),
    (b, b_rs, b_cs): (*const f32, usize, usize),
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                std::ptr::write_bytes(c.add(r * c_rs), 0, n);
            }
        }
        return;
    }
    gemm::gemm(
        m,
        n,
        k,
        c,
        1,
        c_rs as isize,
        accumulate,
        a,
        a_cs as isize,
        a_rs as isize,
        b,
        b_cs as isize,
        b_rs as isize,
        1.0,
        1.0,
        false,
        false,
        false,
        gemm::Parallelism::None,
    );
}

/// Attention output `(B, L, H·hd)` of queries `(B, H, L, hd)` over an optional past
/// `(Hkv, S, P, hd)` of `S` slots (rows slot-major, `S` divides `B`), each row's past visible
/// from `past_start[b]` (`(B,)` u32; all of it when `None`), and the new keys/values
/// `(B, Hkv, L, hd)` under `new_keys` (`None`: all visible). The caller checked [`supports`].
pub(crate) fn attend(
    q: &Tensor,
    k_new: &Tensor,
    v_new: &Tensor,
    past: Option<&PastKv<'_>>,
    past_start: Option<&Tensor>,
    new_keys: Option<&NewKeysMask>,
) -> Result<Tensor, CandleError> {
    let sizes = TileSizes::chosen()?;
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
    let g = h / hkv;
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

    let scale = (1.0 / (hd as f64).sqrt()) as f32;
    let dims = Dims {
        h,
        hkv,
        g,
        l,
        hd,
        p,
        slots,
        per_slot: b / slots,
    };
    let mut out = vec![0f32; b * l * h * hd];
    let out_addr = out.as_mut_ptr() as usize;
    // scatter a tile's (M, hd) rows into (B, L, H·hd): row b, position i, head j·G + gg
    let scatter = |t: Tile, o: &[f32]| {
        let (ni, out) = (t.i1 - t.i0, out_addr as *mut f32);
        for bb in 0..t.b1 - t.b0 {
            for gg in 0..g {
                for ii in 0..ni {
                    let src = &o[((bb * g + gg) * ni + ii) * hd..][..hd];
                    let at = (((t.b0 + bb) * l + t.i0 + ii) * h + t.j * g + gg) * hd;
                    // SAFETY: `out` holds B·L·H·hd elements and outlives the tiles; `at + hd` is
                    // within it, and tiles cover disjoint (row, query, KV head) triples, so no
                    // two tiles write the same run.
                    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), out.add(at), hd) };
                }
            }
        }
    };
    let tiles = tiles(hkv, g, b, slots, l, sizes);
    #[cfg(target_arch = "x86_64")]
    if let Some(width) = key_major(sizes.form, hd, l > sizes.query_block) {
        use super::cpu_key_major::{Avx2, Avx512};
        // every tile in the key-major form of width `$l` (the CPU has its instructions and `hd`
        // is a multiple of its lanes: `key_major`)
        macro_rules! key_major_tiles {
            ($l:ty) => {{
                let packed = KeyMajorKeys::pack::<$l>(&dims, b, kd, pkd);
                tiles.into_par_iter().for_each(|t| {
                    tile_key_major::<$l>(
                        t,
                        &dims,
                        scale,
                        (qd, vd),
                        pvd,
                        &packed,
                        (&starts, &keys),
                        sizes.key_block,
                        |o| scatter(t, o),
                    )
                })
            }};
        }
        match width {
            KeyMajor::Avx512 => key_major_tiles!(Avx512),
            KeyMajor::Avx2 => key_major_tiles!(Avx2),
        }
        drop((qs, ks, vs, past_guards));
        return Tensor::from_vec(out, (b, l, h * hd), q.device()).map_err(op("attention out"));
    }
    tiles.into_par_iter().for_each(|t| {
        let o = tile(t, &dims, scale, (qd, kd, vd), (pkd, pvd), &starts, &keys);
        scatter(t, &o)
    });
    drop((qs, ks, vs, past_guards));
    Tensor::from_vec(out, (b, l, h * hd), q.device()).map_err(op("attention out"))
}

/// The widths of the key-major form.
#[cfg(target_arch = "x86_64")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyMajor {
    Avx512,
    Avx2,
}

/// Which key-major width tiles take, if any: asked for (`form`), the CPU's level, a head dim
/// that is a multiple of the width's lanes (its registers of output columns) and, for the
/// 8-lane width under `Auto`, a long call (`long`: a prefill's query blocks). The 8-lane form
/// measured 0–7 % faster than the products form on a prefill layer on CPUs capped at AVX2,
/// but 5–11 % slower on the scoring shapes there (the `cpu_attention`
/// bench), so short calls keep the products form.
#[cfg(target_arch = "x86_64")]
fn key_major(form: TileForm, hd: usize, long: bool) -> Option<KeyMajor> {
    use super::cpu_isa::Isa;
    let level = Isa::chosen()?;
    match form {
        TileForm::Products => None,
        TileForm::Auto if level == Isa::Avx512 && hd.is_multiple_of(16) => Some(KeyMajor::Avx512),
        TileForm::Auto if !long => None,
        TileForm::Auto | TileForm::KeyMajorAvx2 => hd.is_multiple_of(8).then_some(KeyMajor::Avx2),
    }
}

/// A call's keys packed for the key-major form once, before its tiles: each past slot's and
/// each row's new keys, per KV head.
#[cfg(target_arch = "x86_64")]
struct KeyMajorKeys {
    /// `[j · slots + slot]`: KV head `j`'s keys of a past slot.
    past: Vec<Vec<f32>>,
    /// `[row · Hkv + j]`: a row's new keys of KV head `j`.
    new: Vec<Vec<f32>>,
}

#[cfg(target_arch = "x86_64")]
impl KeyMajorKeys {
    fn pack<L: super::cpu_key_major::Lanes>(d: &Dims, b: usize, kd: &[f32], pkd: &[f32]) -> Self {
        use super::cpu_key_major::pack_keys;
        let (p, l, hd) = (d.p, d.l, d.hd);
        KeyMajorKeys {
            past: (0..d.hkv * d.slots)
                .into_par_iter()
                .map(|js| pack_keys::<L>(&pkd[js * p * hd..][..p * hd], p, hd))
                .collect(),
            new: (0..b * d.hkv)
                .into_par_iter()
                .map(|bj| pack_keys::<L>(&kd[bj * l * hd..][..l * hd], l, hd))
                .collect(),
        }
    }
}

/// One tile in the key-major form of width `L` ([`super::cpu_key_major`]): the same function
/// as [`tile`], its `(M, hd)` output rows (same order) handed to `done`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn tile_key_major<L: super::cpu_key_major::Lanes>(
    t: Tile,
    d: &Dims,
    scale: f32,
    (qd, vd): (&[f32], &[f32]),
    pvd: &[f32],
    packed: &KeyMajorKeys,
    (starts, keys): (&[usize], &NewKeys<'_>),
    key_block: usize,
    done: impl FnOnce(&[f32]),
) {
    use super::cpu_key_major::{with_state, Sees};
    let Dims {
        h,
        hkv,
        g,
        l,
        hd,
        p,
        slots,
        per_slot,
    } = *d;
    let Extent {
        nb,
        ni,
        per_row,
        m,
        n_new,
    } = t.extent(g, l, keys);
    with_state::<L, _>(m, hd, key_block, |st| {
        // columns ordered (row, head in group, query), as the other form's rows
        for bb in 0..nb {
            for gg in 0..g {
                let head = t.j * g + gg;
                let src = &qd[(((t.b0 + bb) * h + head) * l + t.i0) * hd..][..ni * hd];
                for ii in 0..ni {
                    st.query((bb * g + gg) * ni + ii, &src[ii * hd..][..hd], scale);
                }
            }
        }
        if p > 0 {
            let js = t.j * slots + t.b0 / per_slot;
            let lo: Vec<usize> = (0..m).map(|c| starts[t.b0 + c / per_row]).collect();
            let hi = vec![p; m];
            let sees = Sees {
                lo: &lo,
                hi: &hi,
                tree: None,
            };
            // SAFETY: the caller checked L's instructions and that hd is a multiple of its lanes
            // (`key_major`); the slot's packed keys and values hold P keys of hd; columns 0..M,
            // every `hi` is P.
            unsafe {
                st.segment::<L>(
                    &packed.past[js],
                    &pvd[js * p * hd..][..p * hd],
                    p,
                    0..m,
                    &sees,
                )
            };
        }
        let query: Vec<usize> = (0..per_row).map(|c| t.i0 + c % ni).collect();
        let lo = vec![0; per_row];
        let hi: Vec<usize> = match keys {
            NewKeys::Causal => query.iter().map(|&i| i + 1).collect(),
            NewKeys::All | NewKeys::Tree(_) => vec![n_new; per_row],
        };
        let tree = match keys {
            NewKeys::Tree(vis) => Some((*vis, &query[..], l)),
            _ => None,
        };
        let sees = Sees {
            lo: &lo,
            hi: &hi,
            tree,
        };
        for bb in 0..nb {
            let bj = (t.b0 + bb) * hkv + t.j;
            let values = &vd[bj * l * hd..][..n_new * hd];
            // SAFETY: as above; the row's packed new keys hold L ≥ N keys, its values N; the
            // columns are the row's, every `hi` is at most N (a query sees keys up to itself,
            // and N reaches the tile's last query), and the tree's rows have L entries.
            unsafe {
                st.segment::<L>(
                    &packed.new[bj],
                    values,
                    n_new,
                    bb * per_row..(bb + 1) * per_row,
                    &sees,
                )
            };
        }
        done(st.finish())
    })
}

/// The extents every tile reads.
struct Dims {
    h: usize,
    hkv: usize,
    g: usize,
    l: usize,
    hd: usize,
    /// Past keys per slot (0 without a past).
    p: usize,
    /// Past slots (1 without a past).
    slots: usize,
    /// Rows per past slot.
    per_slot: usize,
}

/// One tile of [`attend`]: its `(M, hd)` output rows, ordered (row, head in group, query).
fn tile(
    t: Tile,
    d: &Dims,
    scale: f32,
    (qd, kd, vd): (&[f32], &[f32], &[f32]),
    (pkd, pvd): (&[f32], &[f32]),
    starts: &[usize],
    keys: &NewKeys<'_>,
) -> Vec<f32> {
    let Dims {
        h,
        hkv,
        g,
        l,
        hd,
        p,
        slots,
        per_slot,
    } = *d;
    let Extent {
        nb,
        ni,
        per_row,
        m,
        n_new,
    } = t.extent(g, l, keys);
    let width = p + n_new;

    // (M, hd) queries, rows (row, head in group, query), pre-scaled
    let mut qt = vec![0f32; m * hd];
    for bb in 0..nb {
        for gg in 0..g {
            let head = t.j * g + gg;
            let src = &qd[(((t.b0 + bb) * h + head) * l + t.i0) * hd..][..ni * hd];
            let dst = &mut qt[(bb * g + gg) * ni * hd..][..ni * hd];
            for (o, &x) in dst.iter_mut().zip(src) {
                *o = x * scale;
            }
        }
    }

    // (M, P + N) scores: past part in one product, then each row's new keys
    let mut sc = vec![0f32; m * width];
    let slot = t.b0 / per_slot;
    let past_off = (t.j * slots + slot) * p * hd;
    if p > 0 {
        let kp = &pkd[past_off..][..p * hd];
        // SAFETY: qt is M × hd, kp is P × hd (read as its transpose), sc is M × width.
        unsafe {
            product(
                (m, p, hd),
                sc.as_mut_ptr(),
                width,
                false,
                (qt.as_ptr(), hd, 1),
                (kp.as_ptr(), 1, hd),
            )
        };
    }
    for bb in 0..nb {
        let kn = &kd[(((t.b0 + bb) * hkv + t.j) * l) * hd..][..n_new * hd];
        let r0 = bb * per_row;
        // SAFETY: rows r0..r0+per_row of qt and sc; kn is N × hd read as its transpose; the
        // destination columns p..p+N of those sc rows are in bounds.
        unsafe {
            product(
                (per_row, n_new, hd),
                sc.as_mut_ptr().add(r0 * width + p),
                width,
                false,
                (qt.as_ptr().add(r0 * hd), hd, 1),
                (kn.as_ptr(), 1, hd),
            )
        };
    }

    // softmax per query row over past[start..P] ++ its visible new keys; hidden keys get 0
    let mut inv_sum = vec![0f32; m];
    for bb in 0..nb {
        let start = starts[t.b0 + bb];
        for gg in 0..g {
            for ii in 0..ni {
                let i = t.i0 + ii;
                let row = &mut sc[((bb * g + gg) * ni + ii) * width..][..width];
                let (past_part, new_part) = row.split_at_mut(p);
                past_part[..start].fill(0.0);
                let visible_new = match keys {
                    NewKeys::All => n_new,
                    NewKeys::Causal => {
                        new_part[i + 1..].fill(0.0);
                        i + 1
                    }
                    NewKeys::Tree(vis) => {
                        for (s, &v) in new_part.iter_mut().zip(&vis[i * l..][..n_new]) {
                            if v == 0 {
                                *s = f32::NEG_INFINITY;
                            }
                        }
                        n_new
                    }
                };
                let past_vis = &mut past_part[start..];
                let new_vis = &mut new_part[..visible_new];
                let max = cpu_math::max(past_vis).max(cpu_math::max(new_vis));
                let sum = cpu_math::exp_shifted_sum(past_vis, max)
                    + cpu_math::exp_shifted_sum(new_vis, max);
                // the row is left unnormalised; its output row is divided by `sum` instead
                // (hd values rather than P + N)
                inv_sum[(bb * g + gg) * ni + ii] = 1.0 / sum;
            }
        }
    }

    // (M, hd) = probs_past (M, P) · V_past (P, hd) + per row probs_new (G·n, N) · V_new (N, hd)
    let mut ot = vec![0f32; m * hd];
    if p > 0 {
        let vp = &pvd[past_off..][..p * hd];
        // SAFETY: sc columns 0..P of M rows, vp P × hd, ot M × hd.
        unsafe {
            product(
                (m, hd, p),
                ot.as_mut_ptr(),
                hd,
                false,
                (sc.as_ptr(), width, 1),
                (vp.as_ptr(), hd, 1),
            )
        };
    }
    for bb in 0..nb {
        let vn = &vd[(((t.b0 + bb) * hkv + t.j) * l) * hd..][..n_new * hd];
        let r0 = bb * per_row;
        // SAFETY: rows r0..r0+per_row of sc (columns p..p+N) and ot; vn is N × hd.
        unsafe {
            product(
                (per_row, hd, n_new),
                ot.as_mut_ptr().add(r0 * hd),
                hd,
                p > 0,
                (sc.as_ptr().add(r0 * width + p), width, 1),
                (vn.as_ptr(), hd, 1),
            )
        };
    }

    for (row, &inv) in ot.chunks_exact_mut(hd).zip(&inv_sum) {
        row.iter_mut().for_each(|x| *x *= inv);
    }
    ot
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::candle::attention::tests::rand;
    use crate::candle::attention::{attend_candle, AttnMasks};
    use crate::candle::mask;
    use candle_core::Device;

    /// One call's shape: rows, query heads, KV heads, new tokens, head dim, past slots and
    /// length (0: no past), each row's own past length (left padding; `None`: all of it), and
    /// the tree's parents (`None`: causal).
    struct Case {
        b: usize,
        h: usize,
        hkv: usize,
        l: usize,
        hd: usize,
        slots: usize,
        p: usize,
        past_lens: Option<Vec<usize>>,
        tree: Option<Vec<Option<usize>>>,
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .and_then(|d| d.abs())
            .and_then(|d| d.flatten_all())
            .and_then(|d| d.max(0))
            .and_then(|d| d.to_scalar::<f32>())
            .expect("diff")
    }

    fn check(c: &Case, sizes: TileSizes, seed: &mut u64) -> f32 {
        let dev = Device::Cpu;
        let q = rand(&[c.b, c.h, c.l, c.hd], seed);
        let k = rand(&[c.b, c.hkv, c.l, c.hd], seed);
        let v = rand(&[c.b, c.hkv, c.l, c.hd], seed);
        let pk = rand(&[c.hkv, c.slots, c.p, c.hd], seed);
        let pv = rand(&[c.hkv, c.slots, c.p, c.hd], seed);
        let past = (c.p > 0).then_some(PastKv { k: &pk, v: &pv });
        let new_keys = match (&c.tree, c.l) {
            (Some(parents), _) => Some(NewKeysMask::tree(parents, &dev).expect("tree")),
            (None, 1) => None,
            (None, l) => Some(NewKeysMask::causal(l, &dev)),
        };
        let (padding, starts) = match &c.past_lens {
            Some(lens) => (
                Some(mask::left_padding(lens, c.p, &dev).expect("padding")),
                Some(mask::past_starts(lens, c.p, &dev).expect("starts")),
            ),
            None => (None, None),
        };
        let masks = AttnMasks {
            new_keys: new_keys.as_ref(),
            past: padding.as_ref(),
            past_start: starts.as_ref(),
        };
        assert!(supports(&q, &k, &v, past.as_ref()));
        let got = attend_with(
            &q,
            &k,
            &v,
            past.as_ref(),
            starts.as_ref(),
            new_keys.as_ref(),
            sizes,
        )
        .expect("cpu kernel");
        let want = attend_candle(&q, &k, &v, past, &masks).expect("candle");
        assert_eq!(got.dims(), want.dims());
        max_diff(&got, &want)
    }

    /// The kernel equals the candle path on a long causal prefill (several query blocks and a
    /// ragged one), short calls over one shared past, over several slots with left padding, a
    /// packed tree, one-token rows, and a long chunk continuing a past.
    #[test]
    fn cpu_kernel_equals_the_candle_path() {
        let mut seed = 11u64;
        let cases = [
            Case {
                b: 1,
                h: 14,
                hkv: 2,
                l: 2 * 64 + 21,
                hd: 64,
                slots: 1,
                p: 0,
                past_lens: None,
                tree: None,
            },
            Case {
                b: 2,
                h: 4,
                hkv: 2,
                l: 7,
                hd: 8,
                slots: 1,
                p: 0,
                past_lens: None,
                tree: None,
            },
            Case {
                b: 5,
                h: 6,
                hkv: 2,
                l: 3,
                hd: 16,
                slots: 1,
                p: 40,
                past_lens: None,
                tree: None,
            },
            Case {
                b: 30,
                h: 7,
                hkv: 1,
                l: 5,
                hd: 8,
                slots: 1,
                p: 33,
                past_lens: None,
                tree: None,
            },
            Case {
                b: 4,
                h: 4,
                hkv: 2,
                l: 4,
                hd: 8,
                slots: 2,
                p: 9,
                past_lens: Some(vec![9, 7, 2, 9]),
                tree: None,
            },
            Case {
                b: 2,
                h: 4,
                hkv: 1,
                l: 5,
                hd: 16,
                slots: 2,
                p: 6,
                past_lens: Some(vec![6, 3]),
                tree: Some(vec![None, Some(0), Some(1), Some(1), None]),
            },
            Case {
                b: 6,
                h: 2,
                hkv: 2,
                l: 1,
                hd: 8,
                slots: 3,
                p: 5,
                past_lens: Some(vec![5, 5, 1, 4, 0, 2]),
                tree: None,
            },
            Case {
                b: 1,
                h: 4,
                hkv: 2,
                l: 64 + 36,
                hd: 32,
                slots: 1,
                p: 70,
                past_lens: None,
                tree: None,
            },
            // a past of several softmax blocks, left-padded rows, head dim 128
            Case {
                b: 6,
                h: 4,
                hkv: 2,
                l: 3,
                hd: 128,
                slots: 2,
                p: 3 * 84 + 5,
                past_lens: Some(vec![257, 100, 3, 257, 1, 200]),
                tree: None,
            },
            // head dim 256 (the hybrid's gated attention), a causal chunk over a past
            Case {
                b: 1,
                h: 4,
                hkv: 1,
                l: 40,
                hd: 256,
                slots: 1,
                p: 30,
                past_lens: None,
                tree: None,
            },
            // head dim 40 (a multiple of 8, not of 16: the 8-lane key-major form under Auto
            // even with AVX-512; a ragged 8-column value tile), a causal chunk over a past
            Case {
                b: 3,
                h: 6,
                hkv: 2,
                l: 11,
                hd: 40,
                slots: 1,
                p: 23,
                past_lens: None,
                tree: None,
            },
            // a tree over a long past, scores far apart (the running maximum moves)
            Case {
                b: 2,
                h: 6,
                hkv: 3,
                l: 6,
                hd: 16,
                slots: 1,
                p: 190,
                past_lens: None,
                tree: Some(vec![None, Some(0), Some(0), Some(2), None, Some(4)]),
            },
        ];
        // the default tiles, small ones (many query blocks, one-row tiles, one key group per
        // softmax block) and one block for all, in the form this CPU takes by default, in the
        // 8-lane key-major form (where the CPU has AVX2), and in the products form
        for spec in [
            "",
            "query_block=5,tile_rows=7,key_block=1",
            "query_block=1000,tile_rows=100000,key_block=15",
            "key_block=100000",
            "form=avx2",
            "query_block=5,tile_rows=7,key_block=1,form=avx2",
            "query_block=1000,tile_rows=100000,key_block=7,form=avx2",
            "form=products",
            "query_block=5,tile_rows=7,form=products",
        ] {
            let sizes = TileSizes::parse(spec).expect("valid sizes");
            for (n, c) in cases.iter().enumerate() {
                let d = check(c, sizes, &mut seed);
                assert!(
                    d <= 2e-6,
                    "case {n}, tiles {sizes:?}: cpu kernel vs candle {d:e}"
                );
            }
        }
    }

    /// Tile sizes parse over the default; a wrong key, a zero or a non-count is an error that
    /// names it.
    #[test]
    fn tile_sizes_parse_and_name_errors() {
        let d = TileSizes::default();
        assert_eq!(TileSizes::parse("").expect("empty"), d);
        let t = TileSizes::parse(" query_block = 16 ").expect("one key");
        assert_eq!((t.query_block, t.tile_rows), (16, d.tile_rows));
        assert_eq!(d.form, TileForm::Auto);
        let t = TileSizes::parse("form=products, tile_rows=9").expect("a form");
        assert_eq!((t.form, t.tile_rows), (TileForm::Products, 9));
        let t = TileSizes::parse("form=avx2").expect("a form");
        assert_eq!(t.form, TileForm::KeyMajorAvx2);
        for (spec, names) in [
            ("rows=4", "unknown key `rows`"),
            ("tile_rows=0", "`tile_rows=0`: must be at least 1"),
            ("query_block=x", "`x` is not a count"),
            ("query_block", "not key=value"),
            ("form=fast", "unknown form `fast`"),
        ] {
            let e = TileSizes::parse(spec).expect_err(spec);
            assert!(e.contains(names), "{spec}: {e}");
        }
    }

    /// Mismatched shapes are refused with an error naming the shapes, never a panic.
    #[test]
    fn mismatched_shapes_are_an_error() {
        let mut seed = 3u64;
        let q = rand(&[2, 4, 3, 8], &mut seed);
        let k = rand(&[2, 2, 4, 8], &mut seed);
        let e = attend(&q, &k, &k, None, None, None).expect_err("mismatch");
        assert!(e.to_string().contains("do not match"), "{e}");
        let k = rand(&[2, 2, 3, 8], &mut seed);
        let pk = rand(&[2, 3, 5, 8], &mut seed);
        let past = PastKv { k: &pk, v: &pk };
        let e = attend(&q, &k, &k, Some(&past), None, None).expect_err("3 slots for 2 rows");
        assert!(e.to_string().contains("does not fit"), "{e}");
    }
}
