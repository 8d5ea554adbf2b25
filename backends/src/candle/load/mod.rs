//! Reading a checkpoint into memory: resolution and fingerprint (`checkpoint`), `config.json` (`config`), GGUF files (`gguf`), bounds on untrusted files (`limits`), dropping mapped pages once copied (`pages`), memory-mapped safetensors shards (`shards`), weights by Hugging Face name over either store (`weights`), the embedding / head table (`table`), and opening the device (`device`).

pub mod checkpoint;
pub mod config;
pub mod device;
pub mod gguf;
pub mod limits;
pub(in crate::candle) mod pages;
pub(in crate::candle) mod shards;
pub(in crate::candle) mod table;
pub(in crate::candle) mod weights;
