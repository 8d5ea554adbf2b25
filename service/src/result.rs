//! The result JSON of one decision: exactly what `forkscore score` prints — the decision
//! (`output`, `fields`, `temperature`, `telemetry`, optional `prompt`) plus `provenance` (the
//! loaded model's provenance, then `mode`, `temperature`, `temperature_source`, `schema_hash`).
//! A merged decision's `telemetry.group` names the context group it was scored in.

use forkscore_engine::{CompiledSchema, Decision, ScoreOptions};
use serde_json::{Map, Value};

/// `model`: the loaded model's provenance object (what `forkscore score` records about it).
pub fn result_json(
    decision: &Decision,
    compiled: &CompiledSchema,
    opts: &ScoreOptions,
    model: &Map<String, Value>,
) -> Value {
    let mut value = serde_json::to_value(decision).unwrap_or_else(|e| {
        // Decision is plain data (maps of strings and finite numbers): serializing cannot fail
        serde_json::json!({"error": {"kind": "backend", "message": e.to_string()}})
    });
    let mut prov = model.clone();
    prov.insert(
        "mode".into(),
        serde_json::to_value(opts.mode).unwrap_or(Value::Null),
    );
    prov.insert("temperature".into(), decision.temperature.value.into());
    prov.insert(
        "temperature_source".into(),
        serde_json::to_value(&decision.temperature.source).unwrap_or(Value::Null),
    );
    prov.insert("schema_hash".into(), compiled.schema_hash().into());
    value["provenance"] = Value::Object(prov);
    value
}
