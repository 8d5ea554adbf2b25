//! The labelled input of `forkscore eval` / `forkscore calibrate`: one JSON object per line, a
//! batch line (`id`, `context`, optional `schema` | `schema_file` | `question`) plus
//! `"expected": {"field": value, …}`. In: the file's bytes. Out: the batch input the scoring job
//! reads (each line without `expected`, a relative `schema_file` made absolute so the derived
//! file can live anywhere) and the labels by line. A line whose JSON cannot be read is passed
//! through unchanged, so the batch job writes its error record and the line is counted as
//! failed; a line without a usable `expected` object is a label problem, counted and reported.

use forkscore_engine::strict_json::parse_strict;
use serde::Serialize;
use serde_json::{Map, Value};
use std::path::Path;

/// One labelled line.
#[derive(Debug, Clone, PartialEq)]
pub struct Label {
    /// 1-based line number in the labelled file (= in the derived batch input).
    pub line: u64,
    pub id: Value,
    /// Field name → expected value (a JSON value as the field's choices are written).
    pub expected: Map<String, Value>,
}

/// A line that carries no usable label.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LabelProblem {
    pub line: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<Value>,
    pub message: String,
}

/// The labelled file, split into the batch input and the labels.
#[derive(Debug, Clone, Default)]
pub struct Labelled {
    /// The derived batch input, one line per input line, newline-terminated.
    pub batch_input: String,
    pub labels: Vec<Label>,
    pub problems: Vec<LabelProblem>,
}

/// Split `text` (the labelled file; `base_dir` its folder, for relative schema files).
pub fn split(text: &str, base_dir: &Path) -> Labelled {
    let mut out = Labelled::default();
    for (i, raw) in text.lines().enumerate() {
        let line = i as u64 + 1;
        if raw.trim().is_empty() {
            // the batch reader skips blank lines the same way
            out.batch_input.push_str(raw);
            out.batch_input.push('\n');
            continue;
        }
        let problem = |id: Option<Value>, message: String| LabelProblem { line, id, message };
        let Ok(Value::Object(mut obj)) = parse_strict(raw) else {
            out.problems.push(problem(
                None,
                "not a JSON object (the scoring job records why)".into(),
            ));
            out.batch_input.push_str(raw);
            out.batch_input.push('\n');
            continue;
        };
        let id = obj.get("id").cloned();
        match obj.remove("expected") {
            Some(Value::Object(expected)) if !expected.is_empty() => match &id {
                Some(id @ (Value::String(_) | Value::Number(_))) => out.labels.push(Label {
                    line,
                    id: id.clone(),
                    expected,
                }),
                _ => out.problems.push(problem(id, "no usable \"id\"".into())),
            },
            Some(Value::Object(_)) => out
                .problems
                .push(problem(id, "\"expected\" is an empty object".into())),
            Some(other) => out.problems.push(problem(
                id,
                format!("\"expected\" must be an object of field → value, got {other}"),
            )),
            None => out
                .problems
                .push(problem(id, "no \"expected\" object".into())),
        }
        if let Some(Value::String(f)) = obj.get("schema_file") {
            let p = Path::new(f);
            if p.is_relative() {
                let abs = base_dir.join(p);
                obj.insert("schema_file".into(), abs.display().to_string().into());
            }
        }
        out.batch_input.push_str(&Value::Object(obj).to_string());
        out.batch_input.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn labels_are_split_from_batch_lines_and_problems_counted() {
        let text = concat!(
            r#"{"id": "a", "context": "x", "expected": {"topic": "sport"}}"#,
            "\n",
            r#"{"id": 2, "context": "y", "schema_file": "s.json", "expected": {"ok": true}}"#,
            "\n",
            "not json\n",
            r#"{"id": "c", "context": "z"}"#,
            "\n",
            r#"{"id": "d", "context": "z", "expected": ["sport"]}"#,
            "\n",
        );
        let l = split(text, Path::new("/data"));
        assert_eq!(l.labels.len(), 2);
        assert_eq!(l.labels[1].line, 2);
        assert_eq!(l.labels[1].expected["ok"], json!(true));
        let lines: Vec<&str> = l.batch_input.lines().collect();
        assert_eq!(lines.len(), 5, "one batch line per input line");
        assert_eq!(lines[0], r#"{"id":"a","context":"x"}"#);
        let second: Value = serde_json::from_str(lines[1]).unwrap();
        assert_eq!(second["schema_file"], json!("/data/s.json"));
        assert_eq!(lines[2], "not json");
        let problem_lines: Vec<u64> = l.problems.iter().map(|p| p.line).collect();
        assert_eq!(problem_lines, [3, 4, 5]);
    }
}
