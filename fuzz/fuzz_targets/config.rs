//! config.json parsing: any bytes in, a validated config or a typed error out. A config that
//! parses has every size within the limits, one layer kind per layer, and an even head_dim.
#![no_main]

use forkscore_backends::candle::limits::MAX_DIMS;
use forkscore_backends::candle::ModelConfig;
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    if let Ok(c) = ModelConfig::from_json(Path::new("config.json"), &value) {
        let limit = |k: &str| MAX_DIMS.iter().find(|(n, _)| *n == k).map_or(u64::MAX, |d| d.1);
        assert!(c.text.num_layers as u64 <= limit("num_hidden_layers"));
        assert!(c.text.hidden_size as u64 <= limit("hidden_size"));
        assert_eq!(c.text.layer_kinds.len(), c.text.num_layers);
        assert!(c.text.head_dim > 0 && c.text.head_dim % 2 == 0);
        assert!(c.text.rotary_dim() <= c.text.head_dim);
    }
});
