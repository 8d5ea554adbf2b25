//! The preset schemas the web page offers (`GET /v1/presets`): the example schemas of
//! `fixtures/examples/`, embedded at build time so the server needs no files at run time.

use serde_json::{json, Value};

/// (name, schema JSON text), in the order the page lists them.
pub const PRESETS: &[(&str, &str)] = &[
    (
        "support_triage",
        include_str!("../../fixtures/examples/support_triage.json"),
    ),
    (
        "parallel_schema",
        include_str!("../../fixtures/examples/parallel_schema.json"),
    ),
    (
        "priority_defined_schema",
        include_str!("../../fixtures/examples/priority_defined_schema.json"),
    ),
    (
        "fintech_fraud",
        include_str!("../../fixtures/examples/fintech_fraud.json"),
    ),
    (
        "code_security",
        include_str!("../../fixtures/examples/code_security.json"),
    ),
];

/// `{"presets": [{"name", "schema"}…]}`; a preset that is not JSON (impossible for the
/// committed fixtures, tested) is left out rather than failing the endpoint.
pub fn presets_json() -> Value {
    let list: Vec<Value> = PRESETS
        .iter()
        .filter_map(|(name, text)| {
            serde_json::from_str::<Value>(text)
                .ok()
                .map(|schema| json!({"name": name, "schema": schema}))
        })
        .collect();
    json!({ "presets": list })
}
