//! The safetensors header and index reader: any bytes in as a checkpoint folder's weight files
//! (a single `model.safetensors`, or — when the input starts with `I` — an index JSON and one
//! shard, split at the first NUL byte). Never a panic, never an allocation from a declared
//! length; every listed tensor's bytes are readable.
#![no_main]

use forkscore_backends::candle::inspect_weights;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(dir) = tempfile::tempdir() else {
        return;
    };
    if let Some(rest) = data.strip_prefix(b"I") {
        let (index, shard) = match rest.iter().position(|&b| b == 0) {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, &[][..]),
        };
        let _ = std::fs::write(dir.path().join("model.safetensors.index.json"), index);
        let _ = std::fs::write(dir.path().join("model-00001-of-00001.safetensors"), shard);
    } else {
        let _ = std::fs::write(dir.path().join("model.safetensors"), data);
    }
    if let Ok(tensors) = inspect_weights(dir.path()) {
        for (name, shape) in &tensors {
            assert!(!name.is_empty() || shape.len() < 64);
        }
    }
});
