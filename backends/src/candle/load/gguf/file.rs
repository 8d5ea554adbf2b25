//! The GGUF container, parsed from a memory-mapped file with every length checked.
//!
//! In: the bytes of a `.gguf` file (version 2 or 3, little-endian). Out: [`GgufFile`] — the
//! metadata key/values, the tensor infos (name, shape, ggml type, byte range) and the mapped
//! bytes the ranges point into. Layout: magic `GGUF`, version `u32`, tensor count `u64`,
//! key/value count `u64`; each key/value (`u64`-length string key, `u32` value type, value);
//! each tensor info (name, `u32` dimension count, `u64` dimensions innermost first, `u32` ggml
//! type, `u64` offset); padding to `general.alignment` (default 32); the tensor data.
//!
//! The file is untrusted: every length is checked against the bytes left before anything is
//! allocated from it (a string or array can never claim more than the file holds), arrays nest
//! at most [`MAX_ARRAY_DEPTH`] deep, a tensor has at most 4 dimensions whose element count
//! cannot overflow, its bytes lie inside the file at an offset aligned as the format requires,
//! and its ggml type is one this backend reads ([`TensorType`]); anything else is a typed error
//! naming the file and what is wrong. Tensor bytes are not read here.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use candle_core::quantized::GgmlDType;
use memmap2::Mmap;

use crate::error::CandleError;

/// `GGUF` read as a little-endian `u32`.
const MAGIC: u32 = 0x4655_4747;
/// Arrays of arrays are allowed by the format; deeper nesting than this is refused.
pub(crate) const MAX_ARRAY_DEPTH: usize = 2;
/// ggml's `GGML_MAX_DIMS`.
const MAX_DIMS: usize = 4;
const DEFAULT_ALIGNMENT: u64 = 32;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<MetaValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl MetaValue {
    /// The value as an unsigned integer, when it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer, when it is an integer that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// The value as a float, when it is a float or an integer.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The format's name of the value's type (for error messages).
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "uint8",
            MetaValue::I8(_) => "int8",
            MetaValue::U16(_) => "uint16",
            MetaValue::I16(_) => "int16",
            MetaValue::U32(_) => "uint32",
            MetaValue::I32(_) => "int32",
            MetaValue::F32(_) => "float32",
            MetaValue::Bool(_) => "bool",
            MetaValue::String(_) => "string",
            MetaValue::Array(_) => "array",
            MetaValue::U64(_) => "uint64",
            MetaValue::I64(_) => "int64",
            MetaValue::F64(_) => "float64",
        }
    }
}

/// The ggml tensor types this backend reads: the float types and candle's block formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorType(pub GgmlDType);

impl TensorType {
    /// The ggml type with id `id`, or `Err(name)` with ggml's name of a type this backend does
    /// not read (`"unknown"` for an id ggml does not define).
    pub fn from_id(id: u32) -> Result<Self, &'static str> {
        let t = match id {
            0 => GgmlDType::F32,
            1 => GgmlDType::F16,
            2 => GgmlDType::Q4_0,
            3 => GgmlDType::Q4_1,
            6 => GgmlDType::Q5_0,
            7 => GgmlDType::Q5_1,
            8 => GgmlDType::Q8_0,
            9 => GgmlDType::Q8_1,
            10 => GgmlDType::Q2K,
            11 => GgmlDType::Q3K,
            12 => GgmlDType::Q4K,
            13 => GgmlDType::Q5K,
            14 => GgmlDType::Q6K,
            15 => GgmlDType::Q8K,
            30 => GgmlDType::BF16,
            other => return Err(unsupported_type_name(other)),
        };
        Ok(TensorType(t))
    }

    /// ggml's name of the type (`Q4_K`, `F32`, …).
    pub fn name(self) -> &'static str {
        match self.0 {
            GgmlDType::F32 => "F32",
            GgmlDType::F16 => "F16",
            GgmlDType::BF16 => "BF16",
            GgmlDType::Q4_0 => "Q4_0",
            GgmlDType::Q4_1 => "Q4_1",
            GgmlDType::Q5_0 => "Q5_0",
            GgmlDType::Q5_1 => "Q5_1",
            GgmlDType::Q8_0 => "Q8_0",
            GgmlDType::Q8_1 => "Q8_1",
            GgmlDType::Q2K => "Q2_K",
            GgmlDType::Q3K => "Q3_K",
            GgmlDType::Q4K => "Q4_K",
            GgmlDType::Q5K => "Q5_K",
            GgmlDType::Q6K => "Q6_K",
            GgmlDType::Q8K => "Q8_K",
        }
    }

    /// F32, F16 or BF16 (not a block format).
    pub fn is_float(self) -> bool {
        matches!(self.0, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16)
    }

    /// Bytes of `elements` values, `None` when they do not fill whole blocks.
    fn byte_len(self, elements: u64) -> Option<u64> {
        let block = self.0.block_size() as u64;
        elements
            .is_multiple_of(block)
            .then(|| (elements / block).checked_mul(self.0.type_size() as u64))
            .flatten()
    }
}

/// ggml's names of the types [`TensorType::from_id`] refuses.
fn unsupported_type_name(id: u32) -> &'static str {
    match id {
        4 => "Q4_2 (removed from ggml)",
        5 => "Q4_3 (removed from ggml)",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => "unknown",
    }
}

/// Every type [`TensorType::from_id`] accepts, for error messages.
pub const READABLE_TYPES: &str =
    "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K";

/// One stored tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Row-major shape, outermost first (GGUF stores the dimensions innermost first: a
    /// `(out, in)` weight is `[in, out]` in the file).
    pub shape: Vec<usize>,
    pub dtype: TensorType,
    /// Byte range in the file.
    pub start: usize,
    pub end: usize,
}

/// A parsed GGUF file, its bytes mapped.
pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: BTreeMap<String, MetaValue>,
    pub tensors: BTreeMap<String, TensorInfo>,
    /// Where the header and tensor infos end (the data section starts at the next alignment).
    pub header_len: usize,
    mmap: Mmap,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Map and parse `path` (a regular file).
    pub fn open(path: &Path) -> Result<Self, CandleError> {
        if super::super::limits::regular_file_len(path)?.is_none() {
            return Err(CandleError::MissingFile {
                path: path.to_path_buf(),
                reason: "no such GGUF file".into(),
            });
        }
        let file = File::open(path).map_err(|source| CandleError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        // SAFETY: read-only private map; as for safetensors, a file truncated while loaded may
        // fault the process (the documented limit of every memory-mapped loader).
        let mmap = unsafe { Mmap::map(&file) }.map_err(|source| CandleError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let parsed = parse(&mmap).map_err(|reason| CandleError::InvalidCheckpoint {
            path: path.to_path_buf(),
            reason: format!("not a readable GGUF file: {reason}"),
        })?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            version: parsed.version,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            header_len: parsed.header_len,
            mmap,
        })
    }

    /// The stored bytes of `info` (in the file, nothing copied).
    pub fn bytes(&self, info: &TensorInfo) -> &[u8] {
        // ranges were checked against the file length at parse time
        &self.mmap[info.start..info.end]
    }

    /// Drop the mapped pages of `info` from this process's memory once its bytes were copied
    /// ([`crate::candle::load::pages::release`]).
    pub fn release(&self, info: &TensorInfo) {
        self.release_range(info.start, info.end);
    }

    /// Drop the mapped pages that lie wholly inside the file's bytes `start..end`.
    pub fn release_range(&self, start: usize, end: usize) {
        crate::candle::load::pages::release(&self.mmap, start, end);
    }

    /// The header and tensor-info bytes (what the fingerprint hashes).
    pub fn header_bytes(&self) -> &[u8] {
        &self.mmap[..self.header_len]
    }

    pub fn file_len(&self) -> u64 {
        self.mmap.len() as u64
    }
}

/// What [`parse`] reads from the bytes.
pub struct Parsed {
    pub version: u32,
    pub metadata: BTreeMap<String, MetaValue>,
    pub tensors: BTreeMap<String, TensorInfo>,
    pub header_len: usize,
}

/// Parse a whole GGUF file held in `bytes`. Errors are plain reasons (the caller names the
/// file).
pub fn parse(bytes: &[u8]) -> Result<Parsed, String> {
    let mut r = Reader { bytes, pos: 0 };
    let magic = r
        .u32()
        .map_err(|_| "shorter than the 4-byte magic".to_string())?;
    if magic != MAGIC {
        return Err(format!(
            "the file does not start with the magic `GGUF` (found {:02x?})",
            &bytes[..4]
        ));
    }
    let version = r.u32()?;
    if !(2..=3).contains(&version) {
        return Err(format!(
            "GGUF version {version} is not supported (versions 2 and 3 are)"
        ));
    }
    let tensor_count = r.u64()?;
    let kv_count = r.u64()?;
    // each key/value takes at least 8 (key length) + 4 (type) + 1 bytes; each tensor info at
    // least 8 + 4 + 4 + 8 bytes: counts beyond that cannot be honest
    if kv_count > r.left() as u64 / 13 {
        return Err(format!(
            "the header declares {kv_count} metadata entries, more than the {} bytes left can hold: truncated or corrupt",
            r.left()
        ));
    }
    let mut metadata = BTreeMap::new();
    for _ in 0..kv_count {
        let key = r.string()?;
        let ty = r.u32()?;
        let value = r
            .value(ty, 0)
            .map_err(|e| format!("metadata `{key}`: {e}"))?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(format!("metadata key `{key}` appears twice"));
        }
    }
    if tensor_count > r.left() as u64 / 24 {
        return Err(format!(
            "the header declares {tensor_count} tensors, more than the {} bytes left can hold: truncated or corrupt",
            r.left()
        ));
    }
    let mut infos = Vec::with_capacity(tensor_count as usize);
    for _ in 0..tensor_count {
        let name = r.string()?;
        let n_dims = r.u32()? as usize;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(format!(
                "tensor `{name}` has {n_dims} dimensions (1 to {MAX_DIMS} allowed)"
            ));
        }
        let mut dims = Vec::with_capacity(n_dims);
        for _ in 0..n_dims {
            dims.push(r.u64()?);
        }
        let type_id = r.u32()?;
        let offset = r.u64()?;
        infos.push((name, dims, type_id, offset));
    }
    let header_len = r.pos;
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a >= 8 && a.is_power_of_two() && a <= 1 << 20 => a,
            _ => {
                return Err(format!(
                    "general.alignment {v:?} is not a power of two between 8 and 2^20"
                ))
            }
        },
    };
    let data_start = (header_len as u64).div_ceil(alignment) * alignment;
    let file_len = bytes.len() as u64;
    let mut tensors = BTreeMap::new();
    for (name, dims, type_id, offset) in infos {
        let dtype = TensorType::from_id(type_id).map_err(|type_name| {
            format!(
                "tensor `{name}` has ggml type {type_id} ({type_name}), which forkscore cannot read (readable: {READABLE_TYPES})"
            )
        })?;
        let elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                format!("tensor `{name}` has dimensions {dims:?}: empty or too large")
            })?;
        let len = dtype.byte_len(elements).ok_or_else(|| {
            format!(
                "tensor `{name}`: {elements} values do not fill whole {} blocks of {}",
                dtype.name(),
                dtype.0.block_size()
            )
        })?;
        if !offset.is_multiple_of(alignment) {
            return Err(format!(
                "tensor `{name}` starts at data offset {offset}, not a multiple of the alignment {alignment}"
            ));
        }
        let start = data_start
            .checked_add(offset)
            .filter(|s| s.checked_add(len).is_some_and(|e| e <= file_len))
            .ok_or_else(|| {
                format!(
                    "tensor `{name}` ({len} bytes at data offset {offset}) lies beyond the end of the file ({file_len} bytes): truncated?"
                )
            })?;
        let shape: Vec<usize> = dims.iter().rev().map(|&d| d as usize).collect();
        let info = TensorInfo {
            shape,
            dtype,
            start: start as usize,
            end: (start + len) as usize,
        };
        if tensors.insert(name.clone(), info).is_some() {
            return Err(format!("tensor `{name}` appears twice"));
        }
    }
    Ok(Parsed {
        version,
        metadata,
        tensors,
        header_len,
    })
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn left(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        if n > self.left() {
            return Err(format!(
                "truncated: {n} bytes needed at byte {}, {} left",
                self.pos,
                self.left()
            ));
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn string(&mut self) -> Result<String, String> {
        let len = self.u64()?;
        if len > self.left() as u64 {
            return Err(format!(
                "a string of {len} bytes at byte {} runs past the end of the file",
                self.pos
            ));
        }
        let bytes = self.take(len as usize)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| format!("a string is not UTF-8: {e}"))
    }

    fn value(&mut self, ty: u32, depth: usize) -> Result<MetaValue, String> {
        Ok(match ty {
            0 => MetaValue::U8(self.array::<1>()?[0]),
            1 => MetaValue::I8(self.array::<1>()?[0] as i8),
            2 => MetaValue::U16(u16::from_le_bytes(self.array()?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.array()?)),
            4 => MetaValue::U32(self.u32()?),
            5 => MetaValue::I32(i32::from_le_bytes(self.array()?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.array()?)),
            7 => match self.array::<1>()?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => return Err(format!("bool value {b} is neither 0 nor 1")),
            },
            8 => MetaValue::String(self.string()?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(format!("arrays nested deeper than {MAX_ARRAY_DEPTH}"));
                }
                let item = self.u32()?;
                let len = self.u64()?;
                // every element takes at least one byte
                if len > self.left() as u64 {
                    return Err(format!(
                        "an array of {len} elements runs past the end of the file"
                    ));
                }
                let mut items = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    items.push(self.value(item, depth + 1)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::U64(self.u64()?),
            11 => MetaValue::I64(i64::from_le_bytes(self.array()?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.array()?)),
            other => return Err(format!("unknown metadata value type {other}")),
        })
    }
}
