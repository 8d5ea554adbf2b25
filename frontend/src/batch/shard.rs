//! `--shard I/N`: one of N processes (a Kubernetes Indexed Job, a Slurm array, one process per
//! GPU) takes a deterministic share of the input's lines; `forkscore merge` joins the N outputs.
//!
//! Ownership: a line with an id belongs to shard `key(id) mod N`, where `key` is the first 16
//! bytes of the SHA-256 of the id's JSON text (`"a1"`, `7`) read little-endian — the same key the
//! job uses to find duplicate ids, so every line sharing an id lands in one shard and duplicates
//! are found exactly as in one unsharded run. A line without a readable id (an error record) is
//! owned by its 1-based line number: `(line − 1) mod N`. Ownership depends on nothing but the
//! line, so a shard resumes (`--resume`) like any job, and every process agrees on the split.

use std::fmt;
use std::str::FromStr;

use serde_json::Value;

/// Shard `index` of `count` (`index < count`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shard {
    index: u32,
    count: u32,
}

/// Why a `--shard` value was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ShardError {
    #[error("--shard takes INDEX/COUNT with 0 <= INDEX < COUNT (e.g. 0/4), got {0:?}")]
    Syntax(String),
    #[error("--shard {index}/{count}: the index must be below the count (shards are 0..{count})")]
    OutOfRange { index: u32, count: u32 },
    #[error("--shard {index}/0: the count must be at least 1")]
    ZeroCount { index: u32 },
}

impl Shard {
    pub fn new(index: u32, count: u32) -> Result<Self, ShardError> {
        if count == 0 {
            return Err(ShardError::ZeroCount { index });
        }
        if index >= count {
            return Err(ShardError::OutOfRange { index, count });
        }
        Ok(Shard { index, count })
    }

    pub fn index(&self) -> u32 {
        self.index
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    /// Whether this shard takes input line `line` (1-based) whose id is `id`.
    pub fn owns(&self, line: u64, id: Option<&Value>) -> bool {
        let n = u128::from(self.count);
        let slot = match id {
            Some(id) => id_key(id) % n,
            None => u128::from(line.saturating_sub(1)) % n,
        };
        slot == u128::from(self.index)
    }
}

/// The 128-bit key of an id: the first 16 bytes of the SHA-256 of its JSON text.
pub fn id_key(id: &Value) -> u128 {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(id.to_string().as_bytes());
    let mut b = [0u8; 16];
    b.copy_from_slice(&d[..16]);
    u128::from_le_bytes(b)
}

impl FromStr for Shard {
    type Err = ShardError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let syntax = || ShardError::Syntax(s.to_string());
        let (i, n) = s.trim().split_once('/').ok_or_else(syntax)?;
        let index: u32 = i.trim().parse().map_err(|_| syntax())?;
        let count: u32 = n.trim().parse().map_err(|_| syntax())?;
        Shard::new(index, count)
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl serde::Serialize for Shard {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Shard {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <String as serde::Deserialize>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn parses_and_refuses() {
        assert_eq!("2/4".parse::<Shard>(), Shard::new(2, 4));
        assert_eq!(
            " 0 / 1 ".parse::<Shard>().map(|s| s.to_string()),
            Ok("0/1".into())
        );
        assert_eq!(
            "4/4".parse::<Shard>(),
            Err(ShardError::OutOfRange { index: 4, count: 4 })
        );
        assert_eq!(
            "0/0".parse::<Shard>(),
            Err(ShardError::ZeroCount { index: 0 })
        );
        for bad in ["", "1", "a/2", "1/b", "-1/2", "1/2/3", "1.0/2"] {
            assert!(
                matches!(bad.parse::<Shard>(), Err(ShardError::Syntax(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn one_shard_owns_everything() {
        let s = Shard::new(0, 1).unwrap();
        assert!(s.owns(1, Some(&json!("a"))) && s.owns(9, None));
    }

    proptest! {
        /// Every line belongs to exactly one shard, and lines sharing an id share a shard.
        #[test]
        fn every_line_has_exactly_one_owner(count in 1u32..9, line in 1u64..10_000, id in proptest::option::of("[a-z0-9]{1,8}"), as_int in any::<bool>()) {
            let id: Option<Value> = id.map(|s| if as_int { json!(s.len() * 7) } else { json!(s) });
            let owners: Vec<u32> = (0..count)
                .filter(|&i| Shard::new(i, count).unwrap().owns(line, id.as_ref()))
                .collect();
            prop_assert_eq!(owners.len(), 1);
            if id.is_some() {
                let other_line = line + 12_345;
                prop_assert!(Shard::new(owners[0], count).unwrap().owns(other_line, id.as_ref()));
            }
        }
    }
}
