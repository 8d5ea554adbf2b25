//! Additive f32 attention masks (0 = visible, -inf = hidden), shaped to broadcast over the
//! 5-D score layout `(Hkv, B, G, L, keys)` used by [`super::attention`].
//!
//! - causal: within the new tokens of one call, query `i` sees new keys `j <= i`. Right padding
//!   needs no extra mask: pad tokens sit after a row's last valid token, so no valid query sees
//!   them, and pad queries are never read.
//! - tree: the new tokens are the nodes of a token tree packed into one sequence (parents
//!   first); query `i` sees new key `j` exactly when `j` is `i` or one of its ancestors. Every
//!   node sees the whole past (the prefix it continues), so the past part needs no mask.
//! - left padding: when rows continue prefixes of different lengths merged into one `P`-long
//!   past (left-padded), row `r` hides its first `P - len_r` past keys.

use candle_core::{Device, Tensor};

use crate::error::CandleError;

/// `(1, 1, 1, L, L)` causal mask over the new tokens.
pub fn causal(len: usize, device: &Device) -> Result<Tensor, CandleError> {
    let data: Vec<f32> = (0..len)
        .flat_map(|i| (0..len).map(move |j| if j <= i { 0.0 } else { f32::NEG_INFINITY }))
        .collect();
    Tensor::from_vec(data, (1, 1, 1, len, len), device).map_err(CandleError::tensor("causal mask"))
}

/// `(1, 1, 1, T, T)` tree mask over `T` packed tree nodes: `parents[i]` is node `i`'s parent
/// (an earlier index) or `None` for a root; query `i` sees key `j` iff `j` is `i` or an ancestor.
pub fn tree(parents: &[Option<usize>], device: &Device) -> Result<Tensor, CandleError> {
    check_parents(parents)?;
    let t = parents.len();
    // row i = row of its parent with column i opened (parents come first, so their rows are done)
    let mut data = vec![f32::NEG_INFINITY; t * t];
    for (i, parent) in parents.iter().enumerate() {
        match *parent {
            Some(p) => {
                let (done, row) = data.split_at_mut(i * t);
                row[..t].copy_from_slice(&done[p * t..(p + 1) * t]);
            }
            None => {}
        }
        data[i * t + i] = 0.0;
    }
    Tensor::from_vec(data, (1, 1, 1, t, t), device).map_err(CandleError::tensor("tree mask"))
}

/// Every node's parent must be an earlier node.
fn check_parents(parents: &[Option<usize>]) -> Result<(), CandleError> {
    match parents
        .iter()
        .enumerate()
        .find_map(|(i, p)| p.filter(|&p| p >= i).map(|p| (i, p)))
    {
        Some((i, p)) => Err(CandleError::InvalidRequest {
            reason: format!("tree node {i} has parent {p}: parents must come first"),
        }),
        None => Ok(()),
    }
}

/// `(T, T)` u8 visibility of packed tree nodes (1 = query `i` sees key `j`), the form the flash
/// kernel reads: the same information as [`tree`]'s additive mask.
pub fn tree_visibility(parents: &[Option<usize>], device: &Device) -> Result<Tensor, CandleError> {
    let additive = tree(parents, &Device::Cpu)?;
    let t = parents.len();
    additive
        .reshape((t, t))
        .and_then(|m| m.eq(0f64))
        .and_then(|m| m.to_device(device))
        .map_err(CandleError::tensor("tree visibility"))
}

/// The mask over the new keys of one call: causal (built on first use: the flash kernel never
/// reads it, so a GPU prefill of `L` tokens does not fill and upload `L²` floats — 16 MB at
/// 2,000 tokens — that only the candle attention path needs), or a token tree's (the additive
/// mask for the candle path and, on CUDA, the u8 visibility the flash kernel reads, each built
/// on first use).
pub struct NewKeysMask {
    len: usize,
    device: Device,
    /// The tree's parents, `None` for a causal mask.
    tree: Option<Vec<Option<usize>>>,
    built: std::sync::OnceLock<Tensor>,
    visibility: std::sync::OnceLock<Tensor>,
}

impl NewKeysMask {
    /// The causal mask over `len` new tokens.
    pub fn causal(len: usize, device: &Device) -> Self {
        NewKeysMask {
            len,
            device: device.clone(),
            tree: None,
            built: std::sync::OnceLock::new(),
            visibility: std::sync::OnceLock::new(),
        }
    }

    /// The tree mask of packed nodes with these parents, see [`tree`]. Parents must come
    /// first (checked here).
    pub fn tree(parents: &[Option<usize>], device: &Device) -> Result<Self, CandleError> {
        check_parents(parents)?;
        Ok(NewKeysMask {
            len: parents.len(),
            device: device.clone(),
            tree: Some(parents.to_vec()),
            built: std::sync::OnceLock::new(),
            visibility: std::sync::OnceLock::new(),
        })
    }

    /// True for a tree mask.
    pub fn is_tree(&self) -> bool {
        self.tree.is_some()
    }

    /// `(1, 1, 1, L, L)`, see [`causal`] and [`tree`].
    pub fn tensor(&self) -> Result<&Tensor, CandleError> {
        if let Some(t) = self.built.get() {
            return Ok(t);
        }
        let t = match &self.tree {
            Some(parents) => tree(parents, &self.device)?,
            None => causal(self.len, &self.device)?,
        };
        Ok(self.built.get_or_init(|| t))
    }

    /// For a tree, its `(L, L)` u8 visibility ([`tree_visibility`]); `None` when causal.
    pub fn visibility(&self) -> Result<Option<&Tensor>, CandleError> {
        let Some(parents) = &self.tree else {
            return Ok(None);
        };
        if let Some(t) = self.visibility.get() {
            return Ok(Some(t));
        }
        let t = tree_visibility(parents, &self.device)?;
        Ok(Some(self.visibility.get_or_init(|| t)))
    }
}

/// `(1, B, 1, 1, P)` mask hiding each row's left padding in a merged past of length `p`.
/// `past_lens[r] <= p` is row `r`'s own prefix length.
pub fn left_padding(past_lens: &[usize], p: usize, device: &Device) -> Result<Tensor, CandleError> {
    let data: Vec<f32> = past_lens
        .iter()
        .flat_map(|&len| (0..p).map(move |j| if j + len >= p { 0.0 } else { f32::NEG_INFINITY }))
        .collect();
    Tensor::from_vec(data, (1, past_lens.len(), 1, 1, p), device)
        .map_err(CandleError::tensor("padding mask"))
}

/// `(B,)` u32: row `r`'s first visible key in a merged past of length `p` (`p - past_lens[r]`),
/// the left-padding mask in the form the flash kernel reads.
pub fn past_starts(past_lens: &[usize], p: usize, device: &Device) -> Result<Tensor, CandleError> {
    let data: Vec<u32> = past_lens
        .iter()
        .map(|&len| p.saturating_sub(len) as u32)
        .collect();
    Tensor::from_vec(data, past_lens.len(), device).map_err(CandleError::tensor("past starts"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_mask_opens_exactly_each_nodes_ancestors_and_itself() {
        // 0 -> 1 -> {2, 3}; 4 (another root)
        let parents = [None, Some(0), Some(1), Some(1), None];
        let m = tree(&parents, &Device::Cpu)
            .and_then(|t| t.flatten_all().map_err(CandleError::tensor("flatten")))
            .and_then(|t| t.to_vec1::<f32>().map_err(CandleError::tensor("host")))
            .expect("mask");
        let open: Vec<Vec<usize>> = m
            .chunks(5)
            .map(|r| (0..5).filter(|&j| r[j] == 0.0).collect())
            .collect();
        assert_eq!(
            open,
            [vec![0], vec![0, 1], vec![0, 1, 2], vec![0, 1, 3], vec![4]]
        );
        // a chain is the causal mask
        let chain = tree(&[None, Some(0), Some(1)], &Device::Cpu).expect("chain");
        let c = causal(3, &Device::Cpu).expect("causal");
        let diff = (chain.flatten_all().unwrap().to_vec1::<f32>().unwrap())
            == c.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(diff);
    }

    #[test]
    fn tree_visibility_is_the_additive_mask_as_bytes() {
        let parents = [None, Some(0), Some(1), Some(1), None, Some(4)];
        let v = tree_visibility(&parents, &Device::Cpu)
            .and_then(|t| t.flatten_all().map_err(CandleError::tensor("flatten")))
            .and_then(|t| t.to_vec1::<u8>().map_err(CandleError::tensor("host")))
            .expect("visibility");
        let m = tree(&parents, &Device::Cpu)
            .and_then(|t| t.flatten_all().map_err(CandleError::tensor("flatten")))
            .and_then(|t| t.to_vec1::<f32>().map_err(CandleError::tensor("host")))
            .expect("mask");
        let want: Vec<u8> = m.iter().map(|&x| u8::from(x == 0.0)).collect();
        assert_eq!(v, want);
        let lazy = NewKeysMask::tree(&parents, &Device::Cpu).expect("mask");
        assert!(lazy.is_tree());
        let built = lazy
            .visibility()
            .expect("visibility")
            .expect("a tree has one")
            .flatten_all()
            .and_then(|t| t.to_vec1::<u8>())
            .expect("host");
        assert_eq!(built, want);
        assert!(NewKeysMask::causal(4, &Device::Cpu)
            .visibility()
            .expect("causal")
            .is_none());
        assert!(NewKeysMask::tree(&[None, Some(1)], &Device::Cpu).is_err());
    }
}
