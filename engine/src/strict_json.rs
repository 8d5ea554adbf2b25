//! Strict JSON parsing: like `serde_json::from_str::<Value>`, but a repeated key in any object is
//! an error naming its path instead of silently keeping the last value.

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::fmt;

/// Why strict parsing failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StrictJsonError {
    #[error("duplicate key `{key}` in the object at `{path}`")]
    DuplicateKey { path: String, key: String },
    #[error("invalid JSON: {message}")]
    Syntax { message: String },
}

/// Parse `text` into a [`Value`], rejecting duplicate object keys anywhere.
pub fn parse_strict(text: &str) -> Result<Value, StrictJsonError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let seed = StrictSeed {
        path: String::new(),
    };
    let value = seed
        .deserialize(&mut de)
        .map_err(|e| classify(e.to_string()))?;
    de.end().map_err(|e| StrictJsonError::Syntax {
        message: e.to_string(),
    })?;
    Ok(value)
}

const DUP_MARKER: &str = "\u{0}forkscore-duplicate\u{0}";

fn classify(message: String) -> StrictJsonError {
    match message.split_once(DUP_MARKER) {
        Some((_, rest)) => {
            let rest = rest.split(" at line").next().unwrap_or(rest);
            let (path, key) = rest.split_once(DUP_MARKER).unwrap_or((rest, ""));
            StrictJsonError::DuplicateKey {
                path: path.to_string(),
                key: key.to_string(),
            }
        }
        None => StrictJsonError::Syntax { message },
    }
}

fn child_path(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

struct StrictSeed {
    path: String,
}

impl<'de> DeserializeSeed<'de> for StrictSeed {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(StrictVisitor { path: self.path })
    }
}

struct StrictVisitor {
    path: String,
}

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        StrictSeed { path: self.path }.deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(StrictSeed {
            path: format!("{}[{}]", self.path, out.len()),
        })? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                let shown = if self.path.is_empty() {
                    "<root>"
                } else {
                    self.path.as_str()
                };
                return Err(de::Error::custom(format!(
                    "{DUP_MARKER}{shown}{DUP_MARKER}{key}"
                )));
            }
            let value = map.next_value_seed(StrictSeed {
                path: child_path(&self.path, &key),
            })?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_keys_are_reported_with_their_path() {
        let err = parse_strict(r#"{"a": {"b": 1, "b": 2}}"#).unwrap_err();
        assert_eq!(
            err,
            StrictJsonError::DuplicateKey {
                path: "a".into(),
                key: "b".into()
            }
        );
        let err = parse_strict(r#"{"x": 1, "x": 1}"#).unwrap_err();
        assert_eq!(
            err,
            StrictJsonError::DuplicateKey {
                path: "<root>".into(),
                key: "x".into()
            }
        );
    }

    #[test]
    fn ordinary_json_round_trips_in_order() {
        let v = parse_strict(r#"{"z": [1, 2.5, null, true], "a": "s"}"#).unwrap();
        assert_eq!(
            serde_json::to_string(&v).unwrap(),
            r#"{"z":[1,2.5,null,true],"a":"s"}"#
        );
        assert!(matches!(
            parse_strict("{} x"),
            Err(StrictJsonError::Syntax { .. })
        ));
        assert!(matches!(
            parse_strict("{"),
            Err(StrictJsonError::Syntax { .. })
        ));
    }
}
