//! Local `$ref`s of a chat request's JSON Schema, inlined before forkscore's schema compiler
//! sees it. Pydantic writes an `enum.Enum` field as `{"$ref": "#/$defs/Level"}` with the enum in
//! the root's `$defs`; the OpenAI SDK sends that unchanged (`client.chat.completions.parse` with
//! a model class). Each property that is a `$ref` to `#/$defs/NAME` or `#/definitions/NAME` is
//! replaced by that definition, the property's own keys (a `description`, …) kept over it; then
//! `$defs` / `definitions` are dropped. Any other reference is refused, naming the property.

use crate::error::ApiError;
use serde_json::{Map, Value};

/// Where the schema is in a chat request.
pub const SCHEMA_PARAM: &str = "response_format.json_schema.schema";

/// Most references followed for one property (a definition may itself be a reference).
const MAX_HOPS: usize = 8;

/// Inline the local references of `schema`'s properties (a schema without any is unchanged).
pub fn inline_refs(schema: &mut Value) -> Result<(), ApiError> {
    let Some(root) = schema.as_object_mut() else {
        return Ok(());
    };
    let mut defs = Map::new();
    for key in ["$defs", "definitions"] {
        match root.remove(key) {
            None => {}
            Some(Value::Object(d)) => {
                for (name, def) in d {
                    defs.insert(format!("#/{key}/{name}"), def);
                }
            }
            Some(_) => {
                return Err(ApiError::bad(
                    "invalid_schema",
                    format!("{SCHEMA_PARAM}.{key}"),
                    format!("{key} must be an object of definitions"),
                ))
            }
        }
    }
    let Some(Value::Object(props)) = root.get_mut("properties") else {
        return Ok(());
    };
    for (name, prop) in props.iter_mut() {
        let param = format!("{SCHEMA_PARAM}.properties.{name}.$ref");
        let mut hops = 0;
        while let Value::Object(p) = prop {
            let Some(target) = p.remove("$ref") else {
                break;
            };
            hops += 1;
            let found = target
                .as_str()
                .and_then(|t| defs.get(t))
                .and_then(Value::as_object);
            let def = match found {
                Some(def) if hops <= MAX_HOPS => def,
                Some(_) => {
                    return Err(ApiError::bad(
                        "invalid_schema",
                        param,
                        format!("more than {MAX_HOPS} references in a row"),
                    ))
                }
                None => {
                    return Err(ApiError::bad(
                        "invalid_schema",
                        param,
                        format!("unresolved reference {target} (only local #/$defs/NAME and #/definitions/NAME references to an object are supported)"),
                    ))
                }
            };
            let mut merged = def.clone();
            merged.extend(std::mem::take(p));
            *p = merged;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pydantic_enum_reference_is_inlined_with_the_propertys_own_keys_kept() {
        let mut s = json!({
            "$defs": {"Level": {"enum": ["low", "high"], "title": "Level", "type": "string"},
                      "Alias": {"$ref": "#/$defs/Level"}},
            "properties": {
                "level": {"$ref": "#/$defs/Level"},
                "other": {"$ref": "#/$defs/Alias", "description": "d"},
                "urgent": {"type": "boolean"}
            },
            "required": ["level", "other", "urgent"], "title": "T", "type": "object"
        });
        inline_refs(&mut s).unwrap();
        assert_eq!(
            s,
            json!({
                "properties": {
                    "level": {"enum": ["low", "high"], "title": "Level", "type": "string"},
                    "other": {"enum": ["low", "high"], "title": "Level", "type": "string", "description": "d"},
                    "urgent": {"type": "boolean"}
                },
                "required": ["level", "other", "urgent"], "title": "T", "type": "object"
            })
        );
    }

    #[test]
    fn an_unresolved_or_endless_reference_is_refused_at_its_property() {
        for (defs, want) in [
            (json!({}), "unresolved reference \"#/$defs/Level\""),
            (
                json!({"Level": {"$ref": "#/$defs/Level"}}),
                "more than 8 references",
            ),
            (json!({"Level": "low"}), "unresolved reference"),
        ] {
            let mut s = json!({"$defs": defs, "type": "object",
                               "properties": {"level": {"$ref": "#/$defs/Level"}}});
            let e = inline_refs(&mut s).unwrap_err();
            assert_eq!(e.path, format!("{SCHEMA_PARAM}.properties.level.$ref"));
            assert!(e.message.contains(want), "{}", e.message);
        }
        let mut s = json!({"$defs": [1], "type": "object", "properties": {}});
        assert_eq!(
            inline_refs(&mut s).unwrap_err().path,
            format!("{SCHEMA_PARAM}.$defs")
        );
    }
}
