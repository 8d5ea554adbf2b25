//! The result JSON, built here once for every front end: `forkscore score` prints it, the
//! service's routes and the Python package's `Scorer.score` / `decide_many` return it, and
//! `forkscore batch` writes it as a record (with the record's `id` and `line` first).
//!
//! Layout: [`RecordKey`] (`id`, `line`; batch records only), the body's fields (a decision:
//! `output`, `fields`, `temperature`, `telemetry`, optional `prompt`; a generation baseline
//! likewise), the [`Layout::extra`] keys (a batch's reuse facts, `generate`'s `decoding`), then
//! `provenance`. A decision's provenance ([`decision_provenance`]) is the model's provenance
//! object, then `mode`, `temperature`, `temperature_source`, `literal_value` (only when not the
//! default `argmax`), `schema_hash`; a batch record's is the job's
//! ([`crate::provenance::RecordProvenance`]).

use forkscore_engine::{CompiledSchema, Decision, ScoreOptions, Temperature};
use serde::Serialize;
use serde_json::{json, Map, Value};

/// The keys a batch record starts with.
#[derive(Debug, Clone, Copy)]
pub struct RecordKey<'a> {
    /// The input line's `id`.
    pub id: &'a Value,
    /// Its 1-based input line number.
    pub line: u64,
}

/// Where a result's keys go, beyond the body and `provenance`.
#[derive(Debug, Clone, Default)]
pub struct Layout<'a> {
    /// A batch record: `id` and `line` lead the object.
    pub record: Option<RecordKey<'a>>,
    /// Keys after the body's fields and before `provenance`, in this order.
    pub extra: Vec<(&'a str, Value)>,
}

/// The result object: `layout.record`'s keys, `body`'s fields, `layout.extra`, `provenance`.
/// A body that does not serialize (plain data: it cannot happen in practice) leaves an `error`
/// object (`kind` `serialize`) in place of its fields, so the result still names its record
/// and provenance.
pub fn result_json(body: &impl Serialize, layout: Layout<'_>, provenance: Value) -> Value {
    let mut rec = Map::new();
    if let Some(key) = layout.record {
        rec.insert("id".into(), key.id.clone());
        rec.insert("line".into(), json!(key.line));
    }
    match serde_json::to_value(body) {
        Ok(Value::Object(fields)) => rec.extend(fields),
        Ok(other) => {
            rec.insert("decision".into(), other);
        }
        Err(e) => {
            rec.insert(
                "error".into(),
                json!({"kind": "serialize", "message": e.to_string()}),
            );
        }
    }
    for (key, value) in layout.extra {
        rec.insert(key.into(), value);
    }
    rec.insert("provenance".into(), provenance);
    Value::Object(rec)
}

/// The provenance of one decision: `model` (the loaded model's provenance object, see
/// [`crate::provenance::ModelProvenance::object`]), then from `options` the `mode`, then
/// `temperature`, `temperature_source`, `literal_value` (`options.literal_value`; absent for
/// the default `argmax`, as in a batch record, so default results are unchanged) and
/// `schema_hash`.
pub fn decision_provenance(
    model: &Map<String, Value>,
    options: &ScoreOptions,
    temperature: &Temperature,
    schema_hash: &str,
) -> Value {
    let mut prov = model.clone();
    prov.insert(
        "mode".into(),
        serde_json::to_value(options.mode).unwrap_or(Value::Null),
    );
    prov.insert("temperature".into(), temperature.value.into());
    prov.insert(
        "temperature_source".into(),
        serde_json::to_value(&temperature.source).unwrap_or(Value::Null),
    );
    if !crate::provenance::is_argmax(&options.literal_value) {
        prov.insert("literal_value".into(), options.literal_value.name().into());
    }
    prov.insert("schema_hash".into(), schema_hash.into());
    Value::Object(prov)
}

/// One decision exactly as `forkscore score` prints it: the decision's fields, then its
/// [`decision_provenance`] (`options`: those it was scored with).
pub fn decision_json(
    decision: &Decision,
    compiled: &CompiledSchema,
    options: &ScoreOptions,
    model: &Map<String, Value>,
) -> Value {
    let provenance = decision_provenance(
        model,
        options,
        &decision.temperature,
        compiled.schema_hash(),
    );
    result_json(decision, Layout::default(), provenance)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Body {
        output: &'static str,
        temperature: f64,
    }

    #[test]
    fn keys_come_in_layout_order() {
        let body = Body {
            output: "x",
            temperature: 0.5,
        };
        let id = json!("a1");
        let layout = Layout {
            record: Some(RecordKey { id: &id, line: 7 }),
            extra: vec![("reused", json!(true))],
        };
        let value = result_json(&body, layout, json!({"mode": "parallel"}));
        let keys: Vec<&str> = value
            .as_object()
            .expect("a JSON object")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            [
                "id",
                "line",
                "output",
                "temperature",
                "reused",
                "provenance"
            ]
        );
        assert_eq!(value["line"], json!(7));
        assert_eq!(value["provenance"]["mode"], json!("parallel"));
        // without a record key the body leads
        let plain = result_json(&body, Layout::default(), Value::Null);
        let keys: Vec<&str> = plain
            .as_object()
            .expect("a JSON object")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, ["output", "temperature", "provenance"]);
    }

    #[test]
    fn a_decision_provenance_extends_the_model_object() {
        let mut model = Map::new();
        model.insert("model_id".into(), json!("m"));
        let temperature = Temperature::uniform(0.8, forkscore_engine::TemperatureSource::Explicit);
        let prov = decision_provenance(&model, &ScoreOptions::default(), &temperature, "h");
        let keys: Vec<&str> = prov
            .as_object()
            .expect("a JSON object")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            [
                "model_id",
                "mode",
                "temperature",
                "temperature_source",
                "schema_hash"
            ]
        );
        assert_eq!(prov["temperature"], json!(0.8));
        assert_eq!(prov["mode"], json!("parallel"));
        assert_eq!(prov["schema_hash"], json!("h"));
    }

    #[test]
    fn the_literal_value_rule_is_recorded_only_when_not_argmax() {
        let model = Map::new();
        let temperature = Temperature::uniform(1.0, forkscore_engine::TemperatureSource::Default);
        let argmax = decision_provenance(&model, &ScoreOptions::default(), &temperature, "h");
        assert!(argmax.get("literal_value").is_none(), "{argmax}");
        let greedy = ScoreOptions {
            literal_value: forkscore_engine::LiteralValue::Greedy,
            mode: forkscore_engine::Mode::Tree,
            ..ScoreOptions::default()
        };
        let prov = decision_provenance(&model, &greedy, &temperature, "h");
        assert_eq!(prov["literal_value"], json!("greedy"));
        assert_eq!(prov["mode"], json!("tree"));
        let keys: Vec<&str> = prov
            .as_object()
            .expect("a JSON object")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            [
                "mode",
                "temperature",
                "temperature_source",
                "literal_value",
                "schema_hash"
            ]
        );
    }
}
