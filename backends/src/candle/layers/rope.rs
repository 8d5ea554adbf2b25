//! Rotary position embedding (rotate-half layout, HF `rotate_half`), with explicit per-row
//! positions and partial rotation.
//!
//! In: per-row absolute positions (a row's prefix length plus the token's index in its suffix, or
//! a prefill chunk's offset plus index). Out: cos/sin tables `(B, L, R/2)` built once per
//! backbone call and shared by every attention layer, and [`RopeTables::apply`] on `(B, H, L, hd)`.
//! Only the first `R = rotary_dim` dims of each head rotate (dim `i` pairs with `i + R/2`);
//! dims `R..hd` pass through (Qwen3.5 uses `R = hd / 4`; Qwen2/Qwen3 rotate the whole head).
//! Angles are `position * inv_freq` in f32, `inv_freq[i] = 1 / theta^(2i/R)`, as transformers does.

use candle_core::{DType, Device, Tensor, D};

use crate::error::CandleError;

pub(crate) struct Rope {
    /// `(R/2,)` frequencies; `R` is the rotary dim.
    inv_freq: Vec<f32>,
    /// On accelerators: cos/sin of positions `0..len` in one dtype on one device, grown on
    /// demand, from which each call gathers its rows (one small upload of positions instead of
    /// computing and uploading `rows · len · R` values on the host for every call). The values
    /// are the host's, so both ways give the same tables bit for bit.
    cache: std::sync::Mutex<Option<RopeCache>>,
}

/// cos/sin `(len, R/2)` of positions `0..len` in `dtype` on `device`.
struct RopeCache {
    len: usize,
    dtype: DType,
    device: Device,
    cos: Tensor,
    sin: Tensor,
}

/// Positions cached at least (a GPU prefill chunk).
const MIN_CACHED_POSITIONS: usize = 4096;

/// cos and sin `(B, L, R/2)` in the compute dtype.
pub(crate) struct RopeTables {
    pub cos: Tensor,
    pub sin: Tensor,
}

impl Rope {
    pub fn new(theta: f64, rotary_dim: usize) -> Self {
        let half = rotary_dim / 2;
        let base = theta as f32;
        let inv_freq = (0..half)
            .map(|i| 1.0f32 / base.powf((2 * i) as f32 / rotary_dim as f32))
            .collect();
        Rope {
            inv_freq,
            cache: std::sync::Mutex::new(None),
        }
    }

    /// cos and sin of `positions`, computed on the host in f32.
    fn host_values(&self, positions: impl Iterator<Item = u32>) -> (Vec<f32>, Vec<f32>) {
        let (lo, _) = positions.size_hint();
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(lo * half);
        let mut sin = Vec::with_capacity(lo * half);
        for p in positions {
            for &f in &self.inv_freq {
                let angle = p as f32 * f;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        (cos, sin)
    }

    /// Tables for `positions` gathered from the device cache (accelerators only).
    fn cached_tables(
        &self,
        positions: &[u32],
        rows: usize,
        len: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<RopeTables, CandleError> {
        let half = self.inv_freq.len();
        let need = positions
            .iter()
            .copied()
            .max()
            .map_or(0, |m| m as usize + 1);
        let mut cache = self.cache.lock().map_err(|_| CandleError::InvalidRequest {
            reason: "RoPE cache lock poisoned".into(),
        })?;
        let fits = cache
            .as_ref()
            .is_some_and(|c| c.len >= need && c.dtype == dtype && c.device.same_device(device));
        if !fits {
            let n = need.next_power_of_two().max(MIN_CACHED_POSITIONS);
            let (cos, sin) = self.host_values(0..n as u32);
            let make = |v: Vec<f32>| {
                Tensor::from_vec(v, (n, half), device).and_then(|t| t.to_dtype(dtype))
            };
            *cache = Some(RopeCache {
                len: n,
                dtype,
                device: device.clone(),
                cos: make(cos).map_err(CandleError::tensor("rope cos cache"))?,
                sin: make(sin).map_err(CandleError::tensor("rope sin cache"))?,
            });
        }
        let Some(c) = cache.as_ref() else {
            return Err(CandleError::InvalidRequest {
                reason: "RoPE cache missing".into(),
            });
        };
        // (rows·len,) positions -> (rows·len, R/2) -> (rows, len, R/2)
        let idx = Tensor::new(positions, device).map_err(CandleError::tensor("rope positions"))?;
        let gather = |t: &Tensor| {
            t.index_select(&idx, 0)
                .and_then(|t| t.reshape((rows, len, half)))
        };
        Ok(RopeTables {
            cos: gather(&c.cos).map_err(CandleError::tensor("rope cos"))?,
            sin: gather(&c.sin).map_err(CandleError::tensor("rope sin"))?,
        })
    }

    /// Tables for `positions`, row-major `(rows, len)`.
    pub fn tables(
        &self,
        positions: &[u32],
        rows: usize,
        len: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<RopeTables, CandleError> {
        if !device.is_cpu() {
            return self.cached_tables(positions, rows, len, dtype, device);
        }
        let half = self.inv_freq.len();
        let (cos, sin) = self.host_values(positions.iter().copied());
        let make = |v: Vec<f32>| {
            Tensor::from_vec(v, (rows, len, half), device).and_then(|t| t.to_dtype(dtype))
        };
        Ok(RopeTables {
            cos: make(cos).map_err(CandleError::tensor("rope cos"))?,
            sin: make(sin).map_err(CandleError::tensor("rope sin"))?,
        })
    }
}

impl RopeTables {
    /// `(B, H, L, hd) -> (B, H, L, hd)`, rotating the first `R` dims (`R = 2 * cos.dim(2)`).
    pub fn apply(&self, x: &Tensor) -> Result<Tensor, CandleError> {
        rotate(x, &self.cos, &self.sin)
    }
}

/// `x (B, H, L, hd)` with its first `R` dims rotated by `cos, sin (B, L, R/2)` (`R = hd` or a
/// partial rotary dim): candle's rope kernel over the rotary part, the rest passed through.
pub fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor, CandleError> {
    let op = CandleError::tensor("rope");
    let r = 2 * cos
        .dim(D::Minus1)
        .map_err(CandleError::tensor("rope dims"))?;
    let head_dim = x.dim(D::Minus1).map_err(CandleError::tensor("rope dims"))?;
    if r == head_dim {
        let x = x
            .contiguous()
            .map_err(CandleError::tensor("rope contiguous"))?;
        return candle_nn::rotary_emb::rope(&x, cos, sin).map_err(op);
    }
    let rot = x.narrow(D::Minus1, 0, r).and_then(|v| v.contiguous());
    let pass = x.narrow(D::Minus1, r, head_dim - r);
    rot.and_then(|rot| candle_nn::rotary_emb::rope(&rot, cos, sin))
        .and_then(|rot| Tensor::cat(&[&rot, &pass?], D::Minus1))
        .map_err(op)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rotating by p then reading relative dot products: <R(p)q, R(p+d)k> depends only on d.
    #[test]
    fn rotation_is_relative() -> Result<(), CandleError> {
        let rope = Rope::new(10_000.0, 8);
        let dev = Device::Cpu;
        let q = Tensor::arange(0f32, 12.0, &dev).and_then(|t| t.reshape((1, 1, 1, 12)));
        let k = Tensor::arange(3f32, 15.0, &dev).and_then(|t| t.reshape((1, 1, 1, 12)));
        let (q, k) = (
            q.map_err(CandleError::tensor("t"))?,
            k.map_err(CandleError::tensor("t"))?,
        );
        let dot = |pq: u32, pk: u32| -> Result<f32, CandleError> {
            let a = rope.tables(&[pq], 1, 1, DType::F32, &dev)?.apply(&q)?;
            let b = rope.tables(&[pk], 1, 1, DType::F32, &dev)?.apply(&k)?;
            (a * b)
                .and_then(|t| t.sum_all())
                .and_then(|t| t.to_scalar::<f32>())
                .map_err(CandleError::tensor("dot"))
        };
        let (d1, d2) = (dot(3, 5)?, dot(10, 12)?);
        assert!((d1 - d2).abs() < 1e-3, "{d1} vs {d2}");
        // pass-through dims stay untouched
        let a = rope.tables(&[7], 1, 1, DType::F32, &dev)?.apply(&q)?;
        let tail = a
            .narrow(D::Minus1, 8, 4)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>());
        assert_eq!(
            tail.map_err(CandleError::tensor("tail"))?,
            vec![8.0, 9.0, 10.0, 11.0]
        );
        Ok(())
    }
}
