//! The ggml block formats the kernel packs, decoded one row at a time into blocks of 32 values
//! with their `A` / `B` multipliers and factors (see the parent module).

use super::BLOCK;

/// Bytes of one serialized `Q4_0` block: an f16 scale and 16 bytes of 4-bit values.
const Q4_0_BYTES: usize = 18;
/// Bytes of one serialized `Q5_0` block: an f16 scale, 32 fifth bits, 16 bytes of low nibbles.
const Q5_0_BYTES: usize = 22;
/// Values per `Q4_K` / `Q6_K` block.
pub(super) const K_VALUES: usize = 256;
/// Bytes of one `Q4_K` block: f16 `d` and `dmin`, 12 bytes of 6-bit scales and mins, 128 bytes
/// of 4-bit values.
const Q4K_BYTES: usize = 144;
/// Bytes of one `Q6_K` block: 128 bytes of low nibbles, 64 of high bit pairs, 16 signed 8-bit
/// scales (one per 16 values), an f16 `d`.
const Q6K_BYTES: usize = 210;

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
    /// 210 bytes per 256 values: low nibbles, high bit pairs, a signed 8-bit scale per 16
    /// values and an f16 `d` (`w = d·scale·(q − 32)`, `q ∈ [0, 63]`).
    Q6K,
}

impl Q4Format {
    /// Values per serialized block and its bytes.
    pub(super) fn block(self) -> (usize, usize) {
        match self {
            Q4Format::Q4_0 => (BLOCK, Q4_0_BYTES),
            Q4Format::Q5_0 => (BLOCK, Q5_0_BYTES),
            Q4Format::Q4K => (K_VALUES, Q4K_BYTES),
            Q4Format::Q6K => (K_VALUES, Q6K_BYTES),
        }
    }

    /// log2 of the blocks of 32 that share one `da` (and `db`): the serialized block's.
    pub(super) fn shift(self) -> u32 {
        (self.block().0 / BLOCK).trailing_zeros()
    }

    /// Bits above the low nibble per value: 1 for `Q5_0`, 2 for `Q6_K`, none otherwise.
    pub(super) fn high_bits(self) -> usize {
        match self {
            Q4Format::Q5_0 => 1,
            Q4Format::Q6K => 2,
            Q4Format::Q4_0 | Q4Format::Q4K => 0,
        }
    }

    /// Whether each half block of 16 values has a scale of its own (`Q6_K`: `ma` the low
    /// half's signed scale, `mb` the high half's; `B = 32·A`), rather than one `A` and `B`
    /// per block of 32.
    pub(super) fn split(self) -> bool {
        self == Q4Format::Q6K
    }

    /// The offset `q` is taken from when the block's `B` is `A` times it (`Q4_0`, `Q5_0`,
    /// `Q6_K`).
    pub(super) fn zero_point(self) -> Option<i32> {
        match self {
            Q4Format::Q4_0 => Some(8),
            Q4Format::Q5_0 => Some(16),
            Q4Format::Q6K => Some(32),
            Q4Format::Q4K => None,
        }
    }
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a `Q4_K` block's 12 packed bytes.
pub(super) fn q4k_scale_min(s: &[u8], j: usize) -> (u8, u8) {
    match j < 4 {
        true => (s[j] & 63, s[j + 4] & 63),
        false => (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        ),
    }
}

/// The f32 value of the little-endian f16 `lo, hi`.
pub(super) fn f16(lo: u8, hi: u8) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([lo, hi])).to_f32()
}

/// One row's blocks of 32 as `(block, da, ma, mb, q[32])` (`A = da·ma`; `B = db·mb`, `db` from
/// [`row_db`] for `Q4_K`, `da` for `Q4_0` / `Q5_0`; `Q6_K`: `ma`, `mb` the halves' signed
/// scales as bytes), decoded from ggml's serialized form.
pub(super) fn decode_row(
    format: Q4Format,
    row: &[u8],
    mut put: impl FnMut(usize, f32, u8, u8, [u8; BLOCK]),
) {
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
        Q4Format::Q6K => {
            for (sb, blk) in row.chunks_exact(Q6K_BYTES).enumerate() {
                let (ql, qh, scales) = (&blk[..128], &blk[128..192], &blk[192..208]);
                let d = f16(blk[208], blk[209]);
                // ggml's order: per half of 128 values, value 32t + l (t 0..4, l 0..32) takes
                // the nibble of ql[l + 32·(t % 2)] (low for t < 2) and bits 2t, 2t + 1 of qh[l]
                let mut q = [0u8; K_VALUES];
                for n in 0..2 {
                    let (ql, qh) = (&ql[64 * n..][..64], &qh[32 * n..][..32]);
                    for l in 0..32 {
                        for t in 0..4 {
                            let nib = (ql[l + 32 * (t % 2)] >> (4 * (t / 2))) & 0x0F;
                            let high = (qh[l] >> (2 * t)) & 3;
                            q[128 * n + 32 * t + l] = nib | (high << 4);
                        }
                    }
                }
                for (j, vals) in q.chunks_exact(BLOCK).enumerate() {
                    let vals = std::array::from_fn(|i| vals[i]);
                    put(sb * 8 + j, d, scales[2 * j], scales[2 * j + 1], vals);
                }
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
pub(super) fn row_db(row: &[u8]) -> impl Iterator<Item = f32> + '_ {
    row.chunks_exact(Q4K_BYTES).map(|blk| f16(blk[2], blk[3]))
}
