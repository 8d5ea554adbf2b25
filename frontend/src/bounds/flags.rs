//! Ranges of the numeric flags: nothing is pre-allocated from a user number beyond them (a
//! `--window 18446744073709551615` is refused, not a capacity overflow).

/// A numeric flag out of its range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{flag} {value} is out of range: it must be between {min} and {max}")]
pub struct FlagRangeError {
    pub flag: &'static str,
    pub value: String,
    pub min: String,
    pub max: String,
}

/// Ranges of the integer flags: (flag, smallest, largest).
pub const FLAG_RANGES: &[(&str, u64, u64)] = &[
    ("--max-input-tokens", 1, 1 << 20),
    ("--field-batch-size", 1, 1 << 16),
    ("--prefill-chunk", 1, 1 << 20),
    ("--window", 1, 1 << 16),
    ("--group-max-rows", 1, 1 << 24),
    ("--group-max-prefix-tokens", 1, 1 << 32),
    ("--group-max-mib", 1, 1 << 24),
    ("--top-k", 0, forkscore_backends::MAX_TOP_K as u64),
    (
        "--max-new-tokens",
        1,
        forkscore_engine::generate::MAX_NEW_TOKENS_LIMIT as u64,
    ),
];

/// Check `(flag, value)` pairs against [`FLAG_RANGES`] (absent optional flags are skipped).
pub fn check_flags(values: &[(&'static str, Option<usize>)]) -> Result<(), FlagRangeError> {
    for &(flag, value) in values {
        let Some(v) = value else { continue };
        let Some(&(_, min, max)) = FLAG_RANGES.iter().find(|(f, _, _)| *f == flag) else {
            continue;
        };
        if (v as u64) < min || (v as u64) > max {
            return Err(FlagRangeError {
                flag,
                value: v.to_string(),
                min: min.to_string(),
                max: max.to_string(),
            });
        }
    }
    Ok(())
}

/// `--device-memory-gib` and `--temperature`: finite, positive, and not absurd.
pub fn check_float_flag(
    flag: &'static str,
    value: Option<f64>,
    max: f64,
) -> Result<(), FlagRangeError> {
    match value {
        Some(v) if !(v.is_finite() && v > 0.0 && v <= max) => Err(FlagRangeError {
            flag,
            value: v.to_string(),
            min: "a positive number".into(),
            max: max.to_string(),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_ranges_table() {
        let cases: &[(&'static str, Option<usize>, bool)] = &[
            ("--window", Some(256), true),
            ("--window", Some(0), false),
            ("--window", Some(4_294_967_296), false),
            ("--window", Some(usize::MAX), false),
            ("--max-input-tokens", Some(0), false),
            ("--max-input-tokens", Some(4096), true),
            ("--field-batch-size", None, true),
            ("--group-max-mib", Some(usize::MAX), false),
            ("--prefill-chunk", Some(usize::MAX), false),
        ];
        for &(flag, v, ok) in cases {
            assert_eq!(check_flags(&[(flag, v)]).is_ok(), ok, "{flag} {v:?}");
        }
        assert!(check_float_flag("--temperature", Some(f64::NAN), 1e6).is_err());
        assert!(check_float_flag("--temperature", Some(1e300), 1e6).is_err());
        assert!(check_float_flag("--temperature", Some(0.7), 1e6).is_ok());
    }
}
