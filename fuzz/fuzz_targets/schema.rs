//! The schema parser: any text in, a schema or a typed error out, never a panic. A schema that
//! parses hashes, and parses again from its own JSON value to the same hash.
#![no_main]

use forkscore_engine::Schema;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(schema) = Schema::from_json_str(text) {
        let hash = schema.hash();
        assert!(!schema.fields().is_empty());
        let value: serde_json::Value = serde_json::from_str(text).expect("parsed once");
        let again = Schema::from_value(&value).expect("the lenient value parses too");
        assert_eq!(again.hash(), hash);
    }
});
