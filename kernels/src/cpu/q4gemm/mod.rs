//! 4-, 5- and 6-bit linear layers (`Q4_0`, `Q4_K`, `Q5_0`, `Q6_K`) on x86 CPUs as integer
//! products: `y = x Wᵀ` with `W` kept as its low nibbles (two per byte; the bits above them in a
//! plane of their own) and, per block of 32 `k`, one scale and one offset (`Q6_K`: per half
//! block of 16), packed once at load; `x` rounded on each call to 8-bit blocks of 32 exactly as the `Q8_0`
//! kernel rounds ([`super::qgemm`]: `d = max|x| / 127`, `q = round(x / d)`).
//!
//! The formats dequantize, per block `b` of 32 `k` and column `c`, as `w = A·q − B` with
//! `q ∈ [0, 15]` (`Q5_0`: `[0, 31]`; `Q6_K`: `[0, 63]`):
//! - `Q4_0`: `A = d`, `B = 8·d` (`w = (q − 8)·d`);
//! - `Q5_0`: `A = d`, `B = 16·d` (`w = (q − 16)·d`);
//! - `Q6_K`: per half block of 16, `A = d·scale` (a signed 8-bit scale), `B = 32·A`
//!   (`w = d·scale·(q − 32)`, as ggml dequantizes).
//! - `Q4_K`: per sub-block of 32 of a 256-block, `A = d·scale`, `B = dmin·min` (6-bit `scale` and
//!   `min`, as ggml dequantizes).
//!
//! So with the activations `x ≈ dx·qx` per block, and `S = Σ_j q·qx`, `s = Σ_j qx` exact in
//! integers,
//!
//! `y[r][c] = Σ_b dx[r][b] · (A[c][b]·S[r][c][b] − B[c][b]·s[r][b])`
//!
//! one f32 `fmsub` and one `fma` per block after the integer sum. `Q6_K` sums each half `h` of
//! the block apart, `S_h` and `s_h`, and adds `dx · (A_h · (S_h − 32·s_h))` per half, low half
//! first (`S_h − 32·s_h` is an exact integer in f32). This is the product of the
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
//!   16 columns. 5- and 6-bit values would overflow that sum (16 · 31 · 127), so for `Q5_0`
//!   and `Q6_K` each group's products (at most 4 · 31 · 127 = 15,748 and 2 · 63 · 127 = 16,002)
//!   are widened to 32 bits at once.
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
//! halves by one right shift (`u`); 0.81 byte a weight (its file form: 0.69). `Q6_K`'s high bit
//! pairs: per (panel, block) 128 bytes, the low half's 64 then the high half's, column `c`'s
//! bytes at `4c..4c + 4`, value `i`'s pair at bits `2u, 2u + 1` of byte `i % 4`
//! (`u = (i % 16) / 4`); `ma` / `mb` hold the halves' signed scales, `da` the `d` per 256
//! values: 0.83 byte a weight (its file form: 0.82).
//! Activations, per group of `MR` rows and block: eight broadcast units of four `i8` (values
//! `4g..4g+4`), the scale `dx`, the sum `s` and the sum of the first 16 values (`Q6_K`'s low
//! half) per row.
//!
//! [`portable::product`] computes the same sums in plain Rust; the tests hold the kernels to
//! it bit for bit, and it to the dequantized product.

use super::aligned::Aligned;
use super::isa::Isa;
use super::panel::NR;
use super::Result;
pub use formats::Q4Format;
use formats::{decode_row, row_db};

/// `k` per block (of the activations, of `Q4_0`, of a `Q4_K` sub-block).
pub const BLOCK: usize = 32;
/// Bytes of one (panel, block): 16 columns × 32 values × 4 bits.
const PANEL_BLOCK: usize = NR * BLOCK / 2;
/// Bytes of one (panel, block)'s plane per bit above the nibble: 16 columns × 32 bits.
const PANEL_BITS: usize = NR * BLOCK / 8;
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
    /// `[panel][block]` planes of the bits above the nibble (`Q5_0`: one, `Q6_K`: two, see the
    /// module doc; empty for the 4-bit formats).
    qh: Aligned<u8>,
    /// `[panel][block][column]`: the multipliers of `A` and `B`.
    ma: Aligned<u8>,
    mb: Aligned<u8>,
    /// `[panel][group][column]`: the factors of `A` and `B` per group of `1 << shift` blocks
    /// (`db` empty but for `Q4_K`: the other formats' `B` factor is `da`).
    da: Aligned<f32>,
    db: Aligned<f32>,
    /// log2 of the blocks per group: 3 for `Q4_K` and `Q6_K` (256 values), 0 for `Q4_0` and
    /// `Q5_0`.
    shift: u32,
}

impl PackedQ4 {
    /// Pack `Q4_0`, `Q4_K`, `Q5_0` or `Q6_K` blocks of `(n, k)` (ggml's serialized form, as candle writes it,
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
        let (values, block_bytes) = format.block();
        if k == 0 || !k.is_multiple_of(values) || bytes.len() != n * (k / values) * block_bytes {
            return None;
        }
        let blocks = k / BLOCK;
        let shift = format.shift();
        let bits = PANEL_BITS * format.high_bits();
        let groups = blocks >> shift;
        let row_bytes = (k / values) * block_bytes;
        let panels = n.div_ceil(NR);
        let row = |p: usize, c: usize| &bytes[(p * NR + c) * row_bytes..][..row_bytes];
        let mut q = Aligned::<u8>::zeroed(panels * blocks * PANEL_BLOCK);
        let mut qh = Aligned::<u8>::zeroed(panels * blocks * bits);
        let mut ma = Aligned::<u8>::zeroed(panels * blocks * NR);
        let mut mb = Aligned::<u8>::zeroed(panels * blocks * NR);
        let mut da = Aligned::<f32>::zeroed(panels * groups * NR);
        // each panel's high-bit planes (an empty slice per panel for the 4-bit formats)
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
                            if let Some((at, shift)) = high_bit_place(format, i) {
                                qh[blk * bits + at + c * 4] |= (v >> 4) << shift;
                            }
                        }
                    });
                }
            });
        let mut db = Aligned::<f32>::zeroed(match format {
            Q4Format::Q4_0 | Q4Format::Q5_0 | Q4Format::Q6K => 0,
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

    /// Bytes of high bits per (panel, block): [`PANEL_BITS`] per bit above the nibble.
    fn bits_per_block(&self) -> usize {
        PANEL_BITS * self.format.high_bits()
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

    /// The stored code `q` of `W[c][kk]` (4, 5 or 6 bits, before its offset).
    pub fn code(&self, c: usize, kk: usize) -> u8 {
        self.at(c, kk).0
    }

    /// The code `q` of `W[c][kk]` (4, 5 or 6 bits) and its block's (`Q6_K`: half's) `(A, B)`.
    fn at(&self, c: usize, kk: usize) -> (u8, f32, f32) {
        let (p, c, blk, i) = (c / NR, c % NR, kk / BLOCK, kk % BLOCK);
        let pb = p * (self.k / BLOCK) + blk;
        let (u, high) = ((i % 16) / 4, (i >= 16) as usize);
        let byte = self.q[pb * PANEL_BLOCK + u * 64 + c * 4 + i % 4];
        let mut q = (byte >> (4 * high)) & 0x0F;
        if let Some((at, shift)) = high_bit_place(self.format, i) {
            let mask = (1u8 << self.format.high_bits()) - 1;
            q |= ((self.qh[pb * self.bits_per_block() + at + c * 4] >> shift) & mask) << 4;
        }
        let pg = p * ((self.k / BLOCK) >> self.shift) + (blk >> self.shift);
        let (ma, mb) = (self.ma[pb * NR + c], self.mb[pb * NR + c]);
        let (a, b) = match self.format {
            // the half's signed scale; `B = 32·A`
            Q4Format::Q6K => {
                let sc = [ma, mb][high] as i8 as f32;
                (sc, 32.0 * sc)
            }
            _ => (ma as f32, mb as f32),
        };
        let db = match self.format {
            Q4Format::Q4K => &self.db,
            _ => &self.da,
        };
        (q, self.da[pg * NR + c] * a, db[pg * NR + c] * b)
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

/// Where value `i` (0..32) of a block keeps its bits above the nibble within a (panel, block)'s
/// high-bit plane: `(byte offset before the column's 4 bytes, bit shift)`, `None` for the 4-bit
/// formats. `Q5_0`: byte `i % 4`, bit `u + 4·half` (`u = (i % 16) / 4`); `Q6_K`: the half's 64
/// bytes, byte `i % 4`, bits `2u, 2u + 1` (see the module doc).
fn high_bit_place(format: Q4Format, i: usize) -> Option<(usize, usize)> {
    let (u, j, half) = ((i % 16) / 4, i % 4, i / 16);
    match format.high_bits() {
        1 => Some((j, u + 4 * half)),
        2 => Some((64 * half + j, 2 * u)),
        _ => None,
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

mod formats;
pub mod portable;

#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(all(test, target_arch = "x86_64"))]
mod tests;
