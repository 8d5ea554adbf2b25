//! Snapshot helpers: whole results rendered with floats rounded to a stated precision, so a
//! snapshot pins behaviour without pinning the last bit of libm's `exp`.

use serde_json::Value;

/// Significant digits kept for floats in snapshots.
pub const SNAPSHOT_DIGITS: i32 = 9;

/// Round every non-integer number in `v` to [`SNAPSHOT_DIGITS`] significant digits.
pub fn round_floats(v: &Value) -> Value {
    match v {
        Value::Number(n) if n.is_f64() => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            if x == 0.0 || !x.is_finite() {
                return v.clone();
            }
            let scale = 10f64.powi(SNAPSHOT_DIGITS - 1 - x.abs().log10().floor() as i32);
            let r = (x * scale).round() / scale;
            serde_json::Number::from_f64(r).map_or(Value::Null, Value::Number)
        }
        Value::Array(a) => Value::Array(a.iter().map(round_floats).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| (k.clone(), round_floats(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_to_significant_digits_and_keeps_integers() {
        let v =
            serde_json::json!({"p": 0.0000022435932135682548, "n": 12, "l": [6.961575984954834]});
        assert_eq!(
            round_floats(&v),
            serde_json::json!({"p": 0.00000224359321, "n": 12, "l": [6.96157598]})
        );
    }
}
