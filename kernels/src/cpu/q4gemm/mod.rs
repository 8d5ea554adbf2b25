//! 4- and 5-bit linear layers (`Q4_0`, `Q4_K`, `Q5_0`) on x86 CPUs as integer products:
//! `y = x Wᵀ` with `W` kept as its 4-bit values (two per byte; `Q5_0`'s fifth bits in a plane of
//! their own) and, per block of 32 `k`, one scale and one offset, packed once at load; `x` rounded on each call to 8-bit blocks of 32 exactly as the `Q8_0`
//! kernel rounds ([`super::qgemm`]: `d = max|x| / 127`, `q = round(x / d)`).
//!
//! The formats dequantize, per block `b` of 32 `k` and column `c`, as `w = A·q − B` with
//! `q ∈ [0, 15]` (`Q5_0`: `[0, 31]`):
//! - `Q4_0`: `A = d`, `B = 8·d` (`w = (q − 8)·d`);
//! - `Q5_0`: `A = d`, `B = 16·d` (`w = (q − 16)·d`);
//! - `Q4_K`: per sub-block of 32 of a 256-block, `A = d·scale`, `B = dmin·min` (6-bit `scale` and
//!   `min`, as ggml dequantizes).
//!
//! So with the activations `x ≈ dx·qx` per block, and `S = Σ_j q·qx`, `s = Σ_j qx` exact in
//! integers,
//!
//! `y[r][c] = Σ_b dx[r][b] · (A[c][b]·S[r][c][b] − B[c][b]·s[r][b])`
//!
//! one f32 `fmsub` and one `fma` per block after the integer sum. This is the product of the
//! dequantized weight and the rounded activations up to f32 rounding (tested), the "W4A8"
//! product llama.cpp's CPU kernels compute; for `Q4_K` the activations are rounded per 32
//! values rather than ggml's 256, which is finer.
//!
//! Why: candle's x86 `Q4_0` kernel takes one dot product per (row, column) and its `Q4_K`
//! kernel kept up with the f32 GEMM at best, so a `q4k` model ran slower than f32 (0.72–0.73× in
//! the CPU bench). Here the 4-bit values are unpacked in registers (`and` / shift) and
//! multiplied as unsigned bytes by the signed activations:
//! - AVX-512 VNNI: `vpdpbusd` (16 lanes × 4 products), tiles of 6 rows × 32 columns.
//! - AVX2: `vpmaddubsw` (pairs of products in 16 bits) summed over the block in 16 bits (at most
//!   16 · 15 · 127 = 30,480: exact), then `vpmaddwd` by ones once per block; tiles of 4 rows ×
//!   16 columns. 5-bit values would overflow that sum (16 · 31 · 127), so for `Q5_0` each
//!   group's four products (at most 15,748) are widened to 32 bits at once.
//! - AVX-VNNI (AVX2 CPUs with the 256-bit `vpdpbusd`): the VNNI sums on 8 lanes, tiles of 4 rows
//!   × 16 columns (one `vpdpbusd` where AVX2 takes a `vpmaddubsw` and an addition).
//!
//! Weight layout (one for both kernels): per panel of [`NR`] columns and block, four groups
//! `u` of 64 bytes, each 16 columns × 4 bytes, byte `j` of column `c` holding `q[4u + j]` in its
//! low half and `q[16 + 4u + j]` in its high half. `A` and `B` are not stored as such: per
//! (panel, block, column) two 8-bit multipliers `ma`, `mb`, and per (panel, group of blocks,
//! column) the f32 factors `da`, `db`, with `A = da·ma`, `B = db·mb` (`Q4_K`: `d`, `dmin` per
//! 256 values and the 6-bit scale and min per 32; `Q4_0`: `d` per 32, `ma = 1`, `mb = 8`, `db`
//! the same array as `da`; `Q5_0` as `Q4_0` with `mb = 16`). Both products are exact in f32 (an f16 value times an integer
//! below 64), so the kernels see the very `A` and `B` that ggml's dequantization computes, at
//! 0.59 byte a weight for `Q4_K` (its file form: 0.5625) and 0.69 for `Q4_0` (0.5625), where
//! an f32 `A` and `B` per block took 0.75.
//! `Q5_0`'s fifth bits: per (panel, block) 64 bytes, column `c`'s 32 bits at bytes `4c..4c + 4`,
//! value `i`'s bit at bit `(i % 16) / 4 + 4·[i ≥ 16]` of byte `i % 4`, so that group `u`'s bits
//! reach bit 4 of each byte of its low halves by one left shift (`4 − u`) and of its high
//! halves by one right shift (`u`); 0.81 byte a weight (its file form: 0.69).
//! Activations, per group of `MR` rows and block: eight broadcast units of four `i8` (values
//! `4g..4g+4`), the scale `dx` and the sum `s` per row.
//!
//! [`portable::product`] computes the same sums in plain Rust; the tests hold the kernels to
//! it bit for bit, and it to the dequantized product.

use super::aligned::Aligned;
use super::isa::Isa;
use super::panel::NR;
use super::Result;

/// `k` per block (of the activations, of `Q4_0`, of a `Q4_K` sub-block).
pub const BLOCK: usize = 32;
/// Bytes of one (panel, block): 16 columns × 32 values × 4 bits.
const PANEL_BLOCK: usize = NR * BLOCK / 2;
/// Bytes of one (panel, block)'s fifth bits (`Q5_0`): 16 columns × 32 bits.
const PANEL_BITS: usize = NR * BLOCK / 8;
/// Bytes of one serialized `Q4_0` block: an f16 scale and 16 bytes of 4-bit values.
const Q4_0_BYTES: usize = 18;
/// Bytes of one serialized `Q5_0` block: an f16 scale, 32 fifth bits, 16 bytes of low nibbles.
const Q5_0_BYTES: usize = 22;
/// Values per `Q4_K` block and bytes of one: f16 `d` and `dmin`, 12 bytes of 6-bit scales and
/// mins, 128 bytes of 4-bit values.
const Q4K_VALUES: usize = 256;
const Q4K_BYTES: usize = 144;
/// Rows per tile (AVX2 and AVX-VNNI; AVX-512).
#[cfg(target_arch = "x86_64")]
const MR_AVX2: usize = 4;
#[cfg(target_arch = "x86_64")]
const MR_AVX512: usize = 6;
/// Rows per block of the row loop (as the `Q8_0` kernel's; public for the tests' shapes
/// across row blocks).
pub const MC: usize = 48;

/// Rows per tile.
#[cfg(target_arch = "x86_64")]
fn mr(isa: Isa) -> usize {
    match isa {
        Isa::Avx2 | Isa::AvxVnni => MR_AVX2,
        Isa::Avx512 => MR_AVX512,
    }
}

/// A `Q4_0` or `Q4_K` weight `W (n, k)` packed for the kernels (`k` a multiple of the format's
/// block; the last panel zero-padded, with zero `A` and `B`).
#[derive(Debug, Clone, PartialEq)]
pub struct PackedQ4 {
    n: usize,
    k: usize,
    isa: Isa,
    format: Q4Format,
    /// `[panel][block][u][column][4]`, two 4-bit values per byte (see the module doc).
    q: Aligned<u8>,
    /// `[panel][block][column][4]`: the fifth bits of `Q5_0` (empty for the 4-bit formats).
    qh: Aligned<u8>,
    /// `[panel][block][column]`: the multipliers of `A` and `B`.
    ma: Aligned<u8>,
    mb: Aligned<u8>,
    /// `[panel][group][column]`: the factors of `A` and `B` per group of `1 << shift` blocks
    /// (`db` empty for `Q4_0`, whose `B` factor is `da`).
    da: Aligned<f32>,
    db: Aligned<f32>,
    /// log2 of the blocks per group: 3 for `Q4_K` (256 values), 0 for `Q4_0` and `Q5_0`.
    shift: u32,
}

/// The formats [`PackedQ4`] packs: ggml's serialized blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Q4Format {
    /// 18 bytes per 32 values: an f16 scale `d` and 16 bytes of nibbles (`w = (q − 8)·d`).
    Q4_0,
    /// 144 bytes per 256 values: f16 `d` and `dmin`, 12 bytes of 6-bit scales and mins, 128
    /// bytes of nibbles (`w = d·scale·q − dmin·min` per sub-block of 32).
    Q4K,
    /// 22 bytes per 32 values: an f16 scale `d`, 32 fifth bits and 16 bytes of low nibbles
    /// (`w = (q − 16)·d`, `q ∈ [0, 31]`).
    Q5_0,
}

impl Q4Format {
    /// Whether the values carry a fifth bit.
    pub fn five_bits(self) -> bool {
        self == Q4Format::Q5_0
    }

    /// The offset `q` is taken from when the block's `B` is `A` times it (`Q4_0`, `Q5_0`).
    fn zero_point(self) -> Option<i32> {
        match self {
            Q4Format::Q4_0 => Some(8),
            Q4Format::Q5_0 => Some(16),
            Q4Format::Q4K => None,
        }
    }
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a `Q4_K` block's 12 packed bytes.
fn q4k_scale_min(s: &[u8], j: usize) -> (u8, u8) {
    match j < 4 {
        true => (s[j] & 63, s[j + 4] & 63),
        false => (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        ),
    }
}

/// The f32 value of the little-endian f16 `lo, hi`.
fn f16(lo: u8, hi: u8) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([lo, hi])).to_f32()
}

/// One row's blocks of 32 as `(block, da, ma, mb, q[32])` (`A = da·ma`; `B = db·mb`, `db` from
/// [`row_db`] for `Q4_K`, `da` for `Q4_0`), decoded from ggml's serialized form.
fn decode_row(format: Q4Format, row: &[u8], mut put: impl FnMut(usize, f32, u8, u8, [u8; BLOCK])) {
    match format {
        Q4Format::Q4_0 => {
            for (b, blk) in row.chunks_exact(Q4_0_BYTES).enumerate() {
                let mut q = [0u8; BLOCK];
                for (j, &v) in blk[2..].iter().enumerate() {
                    q[j] = v & 0x0F;
                    q[j + 16] = v >> 4;
                }
                put(b, f16(blk[0], blk[1]), 1, 8, q);
            }
        }
        Q4Format::Q5_0 => {
            for (b, blk) in row.chunks_exact(Q5_0_BYTES).enumerate() {
                let high = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
                let mut q = [0u8; BLOCK];
                for (j, &v) in blk[6..].iter().enumerate() {
                    q[j] = (v & 0x0F) | ((((high >> j) & 1) as u8) << 4);
                    q[j + 16] = (v >> 4) | ((((high >> (j + 16)) & 1) as u8) << 4);
                }
                put(b, f16(blk[0], blk[1]), 1, 16, q);
            }
        }
        Q4Format::Q4K => {
            for (sb, blk) in row.chunks_exact(Q4K_BYTES).enumerate() {
                let d = f16(blk[0], blk[1]);
                let (scales, qs) = (&blk[4..16], &blk[16..]);
                // 64 values per 32 bytes: the low halves one sub-block, the high halves the next
                for (c, chunk) in qs.chunks_exact(32).enumerate() {
                    for half in 0..2 {
                        let j = 2 * c + half;
                        let (sc, m) = q4k_scale_min(scales, j);
                        let q = std::array::from_fn(|i| (chunk[i] >> (4 * half)) & 0x0F);
                        put(sb * 8 + j, d, sc, m, q);
                    }
                }
            }
        }
    }
}

/// A `Q4_K` row's `dmin` per 256 values (its `B` factor per group).
fn row_db(row: &[u8]) -> impl Iterator<Item = f32> + '_ {
    row.chunks_exact(Q4K_BYTES).map(|blk| f16(blk[2], blk[3]))
}

impl PackedQ4 {
    /// Pack `Q4_0`, `Q4_K` or `Q5_0` blocks of `(n, k)` (ggml's serialized form, as candle writes it,
    /// per row) for `isa`. `None` for a `k` that is not a multiple of the format's block, or a
    /// byte count that does not fit `(n, k)`.
    pub fn from_blocks(
        format: Q4Format,
        bytes: &[u8],
        n: usize,
        k: usize,
        isa: Isa,
    ) -> Option<Self> {
        use rayon::prelude::*;
        let (values, block_bytes) = match format {
            Q4Format::Q4_0 => (BLOCK, Q4_0_BYTES),
            Q4Format::Q4K => (Q4K_VALUES, Q4K_BYTES),
            Q4Format::Q5_0 => (BLOCK, Q5_0_BYTES),
        };
        if k == 0 || !k.is_multiple_of(values) || bytes.len() != n * (k / values) * block_bytes {
            return None;
        }
        let blocks = k / BLOCK;
        let shift = match format {
            Q4Format::Q4_0 | Q4Format::Q5_0 => 0,
            Q4Format::Q4K => (Q4K_VALUES / BLOCK).trailing_zeros(),
        };
        let bits = match format.five_bits() {
            true => PANEL_BITS,
            false => 0,
        };
        let groups = blocks >> shift;
        let row_bytes = (k / values) * block_bytes;
        let panels = n.div_ceil(NR);
        let row = |p: usize, c: usize| &bytes[(p * NR + c) * row_bytes..][..row_bytes];
        let mut q = Aligned::<u8>::zeroed(panels * blocks * PANEL_BLOCK);
        let mut qh = Aligned::<u8>::zeroed(panels * blocks * bits);
        let mut ma = Aligned::<u8>::zeroed(panels * blocks * NR);
        let mut mb = Aligned::<u8>::zeroed(panels * blocks * NR);
        let mut da = Aligned::<f32>::zeroed(panels * groups * NR);
        // each panel's fifth bits (an empty slice per panel for the 4-bit formats)
        let qh_chunks: Vec<&mut [u8]> = match bits {
            0 => (0..panels).map(|_| Default::default()).collect(),
            _ => qh.chunks_mut(blocks * bits).collect(),
        };
        q.par_chunks_mut(blocks * PANEL_BLOCK)
            .zip(qh_chunks.into_par_iter())
            .zip(ma.par_chunks_mut(blocks * NR))
            .zip(mb.par_chunks_mut(blocks * NR))
            .zip(da.par_chunks_mut(groups * NR))
            .enumerate()
            .for_each(|(p, ((((q, qh), ma), mb), da))| {
                for c in 0..NR.min(n - p * NR) {
                    decode_row(format, row(p, c), |blk, fa, a, b, vals| {
                        ma[blk * NR + c] = a;
                        mb[blk * NR + c] = b;
                        da[(blk >> shift) * NR + c] = fa;
                        let qb = &mut q[blk * PANEL_BLOCK..][..PANEL_BLOCK];
                        for (i, &v) in vals.iter().enumerate() {
                            let (u, j, high) = ((i % 16) / 4, i % 4, i >= 16);
                            qb[u * 64 + c * 4 + j] |= (v & 0x0F) << (4 * high as u8);
                            if bits > 0 {
                                let bit = (v >> 4) << (u + 4 * high as usize);
                                qh[blk * bits + c * 4 + j] |= bit;
                            }
                        }
                    });
                }
            });
        let mut db = Aligned::<f32>::zeroed(match format {
            Q4Format::Q4_0 | Q4Format::Q5_0 => 0,
            Q4Format::Q4K => panels * groups * NR,
        });
        if format == Q4Format::Q4K {
            db.par_chunks_mut(groups * NR)
                .enumerate()
                .for_each(|(p, db)| {
                    for c in 0..NR.min(n - p * NR) {
                        for (g, v) in row_db(row(p, c)).enumerate() {
                            db[g * NR + c] = v;
                        }
                    }
                });
        }
        Some(PackedQ4 {
            n,
            k,
            isa,
            format,
            q,
            qh,
            ma,
            mb,
            da,
            db,
            shift,
        })
    }

    /// Bytes of fifth bits per (panel, block): [`PANEL_BITS`] for `Q5_0`, none otherwise.
    fn bits_per_block(&self) -> usize {
        match self.format.five_bits() {
            true => PANEL_BITS,
            false => 0,
        }
    }

    /// Bytes held by the packed weight (values, multipliers and factors).
    pub fn bytes(&self) -> usize {
        self.q.len()
            + self.qh.len()
            + self.ma.len()
            + self.mb.len()
            + 4 * (self.da.len() + self.db.len())
    }

    /// `(out, in)`.
    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// The instruction level whose kernel the weight is packed for.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// `Q4_0`, `Q4_K` or `Q5_0`.
    pub fn format(&self) -> Q4Format {
        self.format
    }

    /// The value `q` of `W[c][kk]` (4 or 5 bits) and its block's `(A, B)`.
    fn at(&self, c: usize, kk: usize) -> (u8, f32, f32) {
        let (p, c, blk, i) = (c / NR, c % NR, kk / BLOCK, kk % BLOCK);
        let pb = p * (self.k / BLOCK) + blk;
        let (u, high) = ((i % 16) / 4, (i >= 16) as usize);
        let byte = self.q[pb * PANEL_BLOCK + u * 64 + c * 4 + i % 4];
        let mut q = (byte >> (4 * high)) & 0x0F;
        if self.format.five_bits() {
            let bits = self.qh[pb * self.bits_per_block() + c * 4 + i % 4];
            q |= ((bits >> (u + 4 * high)) & 1) << 4;
        }
        let pg = p * ((self.k / BLOCK) >> self.shift) + (blk >> self.shift);
        let db = match self.format {
            Q4Format::Q4_0 | Q4Format::Q5_0 => &self.da,
            Q4Format::Q4K => &self.db,
        };
        let a = self.da[pg * NR + c] * self.ma[pb * NR + c] as f32;
        let b = db[pg * NR + c] * self.mb[pb * NR + c] as f32;
        (q, a, b)
    }

    /// `W` dequantized as ggml does (`Q4_0`: `(q − 8)·d`; `Q5_0`: `(q − 16)·d`; `Q4_K`:
    /// `A·q − B`), `(n, k)` row-major.
    pub fn rows(&self) -> Vec<f32> {
        let mut w = Vec::with_capacity(self.n * self.k);
        for c in 0..self.n {
            w.extend((0..self.k).map(|kk| {
                let (q, a, b) = self.at(c, kk);
                match self.format.zero_point() {
                    Some(z) => (q as i32 - z) as f32 * a,
                    None => a * q as f32 - b,
                }
            }));
        }
        w
    }

    /// `gate` and `up` (each `(F, k)`, one format and kernel, `F` a positive multiple of 16)
    /// as one `(2F, k)` weight whose panels alternate: panel `2p` is gate's panel `p`, `2p + 1`
    /// up's. What [`swiglu_product`] reads; `None` when the two do not fit.
    pub fn gate_up(gate: &PackedQ4, up: &PackedQ4) -> Option<Self> {
        use super::tile_store::alternate;
        let (f, k) = (gate.n, gate.k);
        let same = (up.n, up.k, up.isa, up.format) == (f, k, gate.isa, gate.format);
        if f == 0 || !f.is_multiple_of(NR) || !same {
            return None;
        }
        let blocks = k / BLOCK;
        let groups = blocks >> gate.shift;
        Some(PackedQ4 {
            n: 2 * f,
            k,
            isa: gate.isa,
            format: gate.format,
            q: alternate(&gate.q, &up.q, blocks * PANEL_BLOCK),
            qh: alternate(&gate.qh, &up.qh, blocks * gate.bits_per_block()),
            ma: alternate(&gate.ma, &up.ma, blocks * NR),
            mb: alternate(&gate.mb, &up.mb, blocks * NR),
            da: alternate(&gate.da, &up.da, groups * NR),
            db: alternate(&gate.db, &up.db, groups * NR),
            shift: gate.shift,
        })
    }

    /// The weights stacked along `out` (`[a; b; …]`): `None` for an empty list, differing
    /// `in`, formats or kernels, or a part other than the last whose row count is not a
    /// multiple of 16.
    pub fn stack(parts: &[&PackedQ4]) -> Option<Self> {
        let first = parts.first()?;
        let aligned = parts[..parts.len() - 1].iter().all(|p| p.n % NR == 0);
        let same = |p: &&PackedQ4| p.k == first.k && p.isa == first.isa && p.format == first.format;
        if !aligned || !parts.iter().all(same) {
            return None;
        }
        Some(PackedQ4 {
            n: parts.iter().map(|p| p.n).sum(),
            k: first.k,
            isa: first.isa,
            format: first.format,
            q: Aligned::concat(&parts.iter().map(|p| &*p.q).collect::<Vec<_>>()),
            qh: Aligned::concat(&parts.iter().map(|p| &*p.qh).collect::<Vec<_>>()),
            ma: Aligned::concat(&parts.iter().map(|p| &*p.ma).collect::<Vec<_>>()),
            mb: Aligned::concat(&parts.iter().map(|p| &*p.mb).collect::<Vec<_>>()),
            da: Aligned::concat(&parts.iter().map(|p| &*p.da).collect::<Vec<_>>()),
            db: Aligned::concat(&parts.iter().map(|p| &*p.db).collect::<Vec<_>>()),
            shift: first.shift,
        })
    }
}

/// That `x` holds `m` rows of `k`.
fn rows_fit(what: &str, x: &[f32], m: usize, k: usize) -> Result<()> {
    if x.len() != m * k {
        super::bail!("{what}: {} values are not {m} rows of {k}", x.len());
    }
    Ok(())
}

/// `x (m, k) · Wᵀ -> (m, n)` row-major through the integer kernel of `w`'s [`Isa`]. An error
/// (never a panic) on a CPU without that ISA or an `x` that is not `m` rows of `k`.
pub fn product(x: &[f32], m: usize, w: &PackedQ4) -> Result<Vec<f32>> {
    w.isa.require("4-bit linear")?;
    rows_fit("4-bit linear", x, m, w.k)?;
    #[cfg(target_arch = "x86_64")]
    {
        Ok(x86::product(x, m, w))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        unreachable!("no ISA is supported off x86-64 ({}, {m})", x.len())
    }
}

/// `x (m, k) -> (m, F)`: `SiLU(x · gateᵀ) · (x · upᵀ)` for a weight of
/// [`PackedQ4::gate_up`], the SwiGLU taken as each output tile is written
/// ([`super::tile_store`]); equal bit for bit to [`product`] on the stacked weight followed
/// by the SwiGLU of each row (tested in the backends). Errors as [`product`].
pub fn swiglu_product(x: &[f32], m: usize, w: &PackedQ4) -> Result<Vec<f32>> {
    w.isa.require("4-bit gate|up")?;
    rows_fit("4-bit gate|up", x, m, w.k)?;
    #[cfg(target_arch = "x86_64")]
    {
        Ok(x86::product_with(x, m, w, super::tile_store::Out::SwiGlu))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        unreachable!("no ISA is supported off x86-64 ({}, {m})", x.len())
    }
}

pub mod portable;

#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(all(test, target_arch = "x86_64"))]
mod tests;
