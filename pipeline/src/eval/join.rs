//! Predictions (the scoring job's output records) joined with labels by id, per field: class
//! names, and per item the true class, the predicted class (the record's value), the reported
//! probabilities and the log-scores at T = 1 (`logits`: a code field's raw logits, a literal
//! field's method log-scores), which calibration refits. Every label that yields no item is
//! counted under a named reason, never dropped silently.

use super::labels::Label;
use super::metrics::Scored;
use indexmap::IndexMap;
use serde::Serialize;
use serde_json::Value;
use std::collections::HashMap;

/// One item of a field.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    pub id: Value,
    pub scored: Scored,
    /// Log-scores at T = 1, in class order.
    pub log_scores: Vec<f32>,
    /// The predicted value as written in the record.
    pub value: Value,
}

/// A field's items and classes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FieldItems {
    /// Choice keys (as in the records' `scores`), in choice order.
    pub classes: Vec<String>,
    /// The choices as JSON values, same order.
    pub choices: Vec<Value>,
    pub items: Vec<Item>,
}

/// Why a label produced no item (a count per reason is reported).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Failure {
    pub id: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    pub kind: String,
    pub message: String,
}

/// Per field its items (in first-seen field order), and every failure.
#[derive(Debug, Clone, Default)]
pub struct Joined {
    pub fields: IndexMap<String, FieldItems>,
    pub failures: Vec<Failure>,
    /// Labelled items with a decision record.
    pub decided: usize,
}

/// Join `records` (the predictions file's lines, parsed) with `labels`.
pub fn join(records: &[Value], labels: &[Label]) -> Joined {
    let by_id: HashMap<String, &Value> = records
        .iter()
        .filter_map(|r| r.get("id").map(|id| (id.to_string(), r)))
        .collect();
    let mut out = Joined::default();
    for label in labels {
        let fail = |field: Option<&str>, kind: &str, message: String| Failure {
            id: label.id.clone(),
            field: field.map(str::to_string),
            kind: kind.to_string(),
            message,
        };
        let Some(rec) = by_id.get(&label.id.to_string()) else {
            out.failures.push(fail(
                None,
                "no_prediction",
                format!("no record with id {} in the predictions", label.id),
            ));
            continue;
        };
        if let Some(e) = rec.get("error") {
            let kind = e["kind"].as_str().unwrap_or("error");
            let message = e["message"].as_str().unwrap_or("").to_string();
            out.failures.push(fail(None, kind, message));
            continue;
        }
        out.decided += 1;
        for (name, want) in &label.expected {
            let Some(f) = rec.get("fields").and_then(|f| f.get(name)) else {
                out.failures.push(fail(
                    Some(name),
                    "field_not_in_schema",
                    format!("the decision has no field {name:?}"),
                ));
                continue;
            };
            match field_item(f, want, &label.id) {
                Err(message) => out.failures.push(fail(Some(name), "bad_record", message)),
                Ok((classes, choices, item)) => {
                    let entry = out.fields.entry(name.clone()).or_default();
                    if entry.classes.is_empty() {
                        entry.classes = classes;
                        entry.choices = choices;
                    } else if entry.classes != classes {
                        out.failures.push(fail(
                            Some(name),
                            "choices_differ",
                            format!(
                                "choices {classes:?} differ from the field's first-seen {:?}",
                                entry.classes
                            ),
                        ));
                        continue;
                    }
                    match item {
                        Some(item) => entry.items.push(item),
                        None => out.failures.push(fail(
                            Some(name),
                            "label_not_a_choice",
                            format!("expected {want} is not one of {:?}", entry.choices),
                        )),
                    }
                }
            }
        }
    }
    out
}

type FieldRow = (Vec<String>, Vec<Value>, Option<Item>);

/// One field result of a record → classes, choices and the item (None when `want` is not a
/// choice).
fn field_item(f: &Value, want: &Value, id: &Value) -> Result<FieldRow, String> {
    let scores = f["scores"].as_object().ok_or("field has no \"scores\"")?;
    let logits = f["logits"].as_object().ok_or("field has no \"logits\"")?;
    let choices = f["choices"]
        .as_array()
        .ok_or("field has no \"choices\"")?
        .clone();
    let classes: Vec<String> = scores.keys().cloned().collect();
    if classes.len() != choices.len() {
        return Err(format!(
            "{} scores for {} choices",
            classes.len(),
            choices.len()
        ));
    }
    let probabilities: Vec<f64> = classes
        .iter()
        .map(|k| {
            scores[k]
                .as_f64()
                .ok_or(format!("score of {k:?} is not a number"))
        })
        .collect::<Result<_, _>>()?;
    let log_scores: Vec<f32> = classes
        .iter()
        .map(|k| match logits.get(k) {
            Some(v) => v
                .as_f64()
                .map(|x| x as f32)
                .ok_or(format!("logit of {k:?} is not a number")),
            // a -inf log-score is written as null by serde_json
            None => Err(format!("no logit for {k:?}")),
        })
        .collect::<Result<_, _>>()?;
    let value = f["value"].clone();
    let predicted = choices
        .iter()
        .position(|c| *c == value)
        .ok_or(format!("value {value} is not one of the choices"))?;
    let item = choices.iter().position(|c| c == want).map(|truth| Item {
        id: id.clone(),
        scored: Scored {
            truth,
            predicted,
            probabilities,
        },
        log_scores,
        value,
    });
    Ok((classes, choices, item))
}
