//! The result JSON of one decision: exactly what `forkscore score` prints — the decision
//! (`output`, `fields`, `temperature`, `telemetry`, optional `prompt`) plus `provenance` (the
//! loaded model's provenance, then `mode`, `temperature`, `temperature_source`, `schema_hash`).
//! A merged decision's `telemetry.group` names the context group it was scored in.
//! `/v1/generate`'s result is what `forkscore generate` prints, with the same provenance.

use forkscore_engine::{Baseline, CompiledSchema, Decision, ScoreOptions, Temperature};
use serde::Serialize;
use serde_json::{Map, Value};

/// `model`: the loaded model's provenance object (what `forkscore score` records about it).
pub fn result_json(
    decision: &Decision,
    compiled: &CompiledSchema,
    opts: &ScoreOptions,
    model: &Map<String, Value>,
) -> Value {
    let mut value = to_value(decision);
    value["provenance"] = provenance(model, opts, &decision.temperature, compiled);
    value
}

/// forkscore's decision beside the greedy generation of the same context, with `decoding` and
/// `provenance` (`temperature`: the one the decision used).
pub fn generate_json(
    baseline: &Baseline,
    compiled: &CompiledSchema,
    opts: &ScoreOptions,
    temperature: &Temperature,
    model: &Map<String, Value>,
) -> Value {
    let mut value = to_value(baseline);
    value["decoding"] = forkscore_engine::generate::DECODING.into();
    value["provenance"] = provenance(model, opts, temperature, compiled);
    value
}

fn to_value(v: &impl Serialize) -> Value {
    serde_json::to_value(v).unwrap_or_else(|e| {
        // plain data (maps of strings and finite numbers): serializing cannot fail
        serde_json::json!({"error": {"kind": "backend", "message": e.to_string()}})
    })
}

fn provenance(
    model: &Map<String, Value>,
    opts: &ScoreOptions,
    temperature: &Temperature,
    compiled: &CompiledSchema,
) -> Value {
    let mut prov = model.clone();
    prov.insert(
        "mode".into(),
        serde_json::to_value(opts.mode).unwrap_or(Value::Null),
    );
    prov.insert("temperature".into(), temperature.value.into());
    prov.insert(
        "temperature_source".into(),
        serde_json::to_value(&temperature.source).unwrap_or(Value::Null),
    );
    prov.insert("schema_hash".into(), compiled.schema_hash().into());
    Value::Object(prov)
}
