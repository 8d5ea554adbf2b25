//! Attention on the CPU in f32 without the candle ops' intermediate tensors: the same function
//! as the backends' candle path of attention (`forkscore_backends::candle::layers::attention`,
//! its reference: the equivalence tests of the backends' shell, `candle::cpu::attention`, hold
//! it there), computed tile by tile on the rayon threads, on the call's operands as slices
//! ([`attend`]).
//!
//! Work is split into tiles `(KV head j, rows b0..b1, queries i0..i1)`; a tile's query rows are
//! its rows' `G` query heads of KV head `j` at those positions, `M = rows · G · queries` in all,
//! copied once into a scratch `(M, hd)` matrix pre-scaled by `hd^-1/2`. Per tile:
//! - scores against the slot's past keys in one product `(M, hd) x (hd, P)` (the past is read in
//!   place, never copied per row), then against each row's own new keys `(G·n, hd) x (hd, N)`,
//!   where `N` stops at the tile's last query under a causal or tree mask (later keys are hidden
//!   from every query of the tile);
//! - one softmax per query row over `past[start..P] ++ visible new keys`, with a vectorised
//!   maximum and `exp` ([`super::math`]); hidden keys get exactly 0; the row is left
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
//! - **key-major** ([`key_major`]), where the CPU has AVX-512 and the head dim is a
//!   multiple of 16 (16-lane registers), or for prefills where it has AVX2 + FMA and the head
//!   dim is a multiple of 8 (8-lane ones): scores held keys × queries in full registers, a softmax taken
//!   online over blocks of keys, keys packed once per call. At 16 lanes 1.4–2.0× the products
//!   form's speed in the `cpu_attention` bench on AVX-512 CPUs (e.g. a 964-token prefill's
//!   layer 5.3 ms against 9.6, 28 scoring rows over it 1.6 against 2.7), the gain varying with
//!   the CPU;
//! - **products**, on every CPU, and the reference the key-major form is tested against: the
//!   products through the `gemm` crate (the kernel candle's own CPU matmul uses). (Products
//!   through the packed kernel of [`super::gemm`], with keys and values packed per tile,
//!   measured no faster in the `cpu_attention` bench; the row maximum, a scalar fold, and the
//!   normalisation pass over every score were what took the time: vectorising the one and
//!   moving the other to the output rows made the form 1.1–2× faster there.)
//!
//! Before this kernel, attention was 3.2 s of a 28-field, 964-token CPU decision's 10.7 s
//! (candle ops: scale, transposes, score matrices, mask adds, a softmax pass, concatenations).

use rayon::prelude::*;

/// Which form computes a tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TileForm {
    /// The key-major form ([`key_major`]) at the widest registers that fit: 16
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

/// How calls are cut into tiles and which form computes them. [`TileSizes::default`], or a
/// spec over it ([`TileSizes::parse`]: the backends read `FORKSCORE_CPU_ATTENTION`,
/// `query_block=…,tile_rows=…,form=auto|products|avx2`, any key, once), to compare on one
/// machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TileSizes {
    /// Queries per tile of a long call (more than this many new tokens: a prefill).
    pub query_block: usize,
    /// Query rows (rows · heads · queries) a tile of a short call aims at.
    pub tile_rows: usize,
    /// Keys per block of the key-major form's online softmax (rounded up to whole groups of
    /// [`key_major`]'s packed keys).
    pub key_block: usize,
    /// The form that computes a tile.
    pub form: TileForm,
    /// Products on the AMX bf16 tiles where AMX runs and the form is [`TileForm::Auto`]
    /// (queries, keys, values and softmax weights rounded to bf16, sums in f32: [`amx`]), for
    /// models whose linear layers compute in bf16 or int8; elsewhere the f32 forms.
    pub bf16: bool,
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
            bf16: false,
        }
    }
}

impl TileSizes {
    /// `spec` (`key=count` pairs, keys `query_block`, `tile_rows`, `key_block`, `bf16` (0 or
    /// 1), and `form=auto|products|avx2`)
    /// over the default; an error names a wrong key, form or a zero.
    pub fn parse(spec: &str) -> Result<Self, String> {
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
        for (part, key, v) in super::host::spec_counts(&counts.join(","))? {
            let slot = match key {
                "query_block" => &mut t.query_block,
                "tile_rows" => &mut t.tile_rows,
                "key_block" => &mut t.key_block,
                "bf16" if v <= 1 => {
                    t.bf16 = v == 1;
                    continue;
                }
                "bf16" => return Err(format!("`{part}`: bf16 is 0 or 1")),
                other => {
                    return Err(format!(
                        "unknown key `{other}` (query_block, tile_rows, key_block, bf16, form)"
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
}

/// Which of the call's new keys each query sees.
#[derive(Debug, Clone, Copy)]
pub enum NewKeys<'a> {
    /// Every new key (no mask: a one-token call).
    All,
    /// Query `i` sees new keys `0..=i`.
    Causal,
    /// `(L, L)` row-major, 1 where query `i` sees key `j` (a packed token tree).
    Tree(&'a [u8]),
}

/// The extents of one call: `b` rows of `h` query heads over `hkv` KV heads (`hkv` divides
/// `h`), `l` new tokens a row, head dim `hd`, and a past of `p` keys in each of `slots` slots
/// (`slots` divides `b`, rows slot-major; `p` 0 and `slots` 1 without a past).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub b: usize,
    pub h: usize,
    pub hkv: usize,
    pub l: usize,
    pub hd: usize,
    pub p: usize,
    pub slots: usize,
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
#[derive(Clone, Copy)]
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

impl Tile {
    /// `f(column, query)` for each of the tile's query columns, ordered (row, head in group,
    /// query) — the order of every form's output rows — with its query `(hd,)` from `qd`.
    fn queries<'a>(
        &self,
        d: &Dims,
        e: &Extent,
        qd: &'a [f32],
        mut f: impl FnMut(usize, &'a [f32]),
    ) {
        for bb in 0..e.nb {
            for gg in 0..d.g {
                let head = self.j * d.g + gg;
                let src =
                    &qd[(((self.b0 + bb) * d.h + head) * d.l + self.i0) * d.hd..][..e.ni * d.hd];
                for ii in 0..e.ni {
                    f((bb * d.g + gg) * e.ni + ii, &src[ii * d.hd..][..d.hd]);
                }
            }
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

/// Attention output `(B, L, H·hd)` row-major of queries `q (B, H, L, hd)` over a past
/// `(past_k, past_v)`, each `(Hkv, S, P, hd)` (empty without one), each row's past visible from
/// `starts[b]` (`≤ P`), and the new keys / values `(B, Hkv, L, hd)` under `keys`, all
/// contiguous row-major f32; cut into tiles by `sizes`. An error where the slices' lengths do
/// not fit `shape` or the heads do not group evenly.
pub fn attend(
    shape: Shape,
    (qd, kd, vd): (&[f32], &[f32], &[f32]),
    (pkd, pvd): (&[f32], &[f32]),
    starts: &[usize],
    keys: NewKeys<'_>,
    sizes: TileSizes,
) -> super::Result<Vec<f32>> {
    let Shape {
        b,
        h,
        hkv,
        l,
        hd,
        p,
        slots,
    } = shape;
    let fits = hkv > 0
        && h.is_multiple_of(hkv)
        && slots > 0
        && b.is_multiple_of(slots)
        && qd.len() == b * h * l * hd
        && kd.len() == b * hkv * l * hd
        && vd.len() == kd.len()
        && pkd.len() == hkv * slots * p * hd
        && pvd.len() == pkd.len()
        && starts.len() == b
        && starts.iter().all(|&s| s <= p)
        && match keys {
            NewKeys::Tree(v) => v.len() == l * l,
            _ => true,
        };
    if !fits {
        super::bail!("CPU attention: the operands do not fit {shape:?}");
    }
    let g = h / hkv;
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
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    if sizes.bf16 && sizes.form == TileForm::Auto && amx::runs(hd) {
        let packed = amx::Packed::pack(&dims, b, (kd, vd), (pkd, pvd));
        tiles.into_par_iter().for_each(|t| {
            // SAFETY: `amx::runs(hd)` holds
            unsafe {
                amx::tile(
                    t,
                    &dims,
                    scale,
                    qd,
                    &packed,
                    (starts, &keys),
                    sizes.key_block,
                    |o| scatter(t, o),
                )
            }
        });
        return Ok(out);
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(width) = key_major(sizes.form, hd, l > sizes.query_block) {
        use key_major::{Avx2, Avx512};
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
                        (starts, &keys),
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
        return Ok(out);
    }
    tiles.into_par_iter().for_each(|t| {
        let o = tile(t, &dims, scale, (qd, kd, vd), (pkd, pvd), starts, &keys);
        scatter(t, &o)
    });
    Ok(out)
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod amx;
#[cfg(target_arch = "x86_64")]
pub(crate) mod key_major;
mod tile;
use tile::*;
