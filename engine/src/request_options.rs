//! One option set for every front end: the table of a scoring request's options ([`OPTIONS`]:
//! the name the service, Python and batch lines use, the CLI flag, the values, the default) and
//! the one parser of an options object ([`RequestOptions::from_json`]), which the service's
//! `options`, the OpenAI routes' `forkscore_options`, the Python package's keyword arguments and
//! a batch line's `options` all go through, so a value is accepted or refused with the same words
//! everywhere. The CLI's flags carry the same names in kebab case (`max_input_tokens` →
//! `--max-input-tokens`) and the same rules (checked by [`RequestOptions::check`] after clap).

use serde_json::{Map, Value};

use crate::options::{Layout, LiteralValue, Mode, ScoreOptions, DEFAULT_MAX_INPUT_TOKENS};
use crate::schema::Scoring;

/// Unconstrained tokens listed per field when `allowed_mass` is on and `top_k` is not given.
pub const DEFAULT_TOP_K: usize = 5;
/// Largest `field_batch_size` accepted.
pub const MAX_FIELD_BATCH_SIZE: usize = 65_536;
/// Largest `max_input_tokens` accepted anywhere (a server may bound it lower).
pub const MAX_INPUT_TOKENS_LIMIT: usize = 1 << 20;
/// Largest `temperature` accepted.
pub const MAX_TEMPERATURE: f64 = 1e6;

/// One option of a scoring request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionSpec {
    /// The name in an options object (service, Python keyword, batch line).
    pub name: &'static str,
    /// The command-line flag (`score`, `batch`, `eval`, `calibrate`, `generate`).
    pub flag: &'static str,
    /// What it accepts.
    pub values: &'static str,
    /// Its default.
    pub default: &'static str,
}

/// Every option of a scoring request, in documentation order.
pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        name: "scoring",
        flag: "--scoring",
        values: "code, literal, literal-first-token, literal-sum-loglik, literal-mean-loglik, json",
        default: "code",
    },
    OptionSpec {
        name: "mode",
        flag: "--mode",
        values: "parallel, cached-serial, independent, tree",
        default: "parallel",
    },
    OptionSpec {
        name: "field_batch_size",
        flag: "--field-batch-size",
        values: "an integer from 1 to 65536",
        default: "all rows in one call",
    },
    OptionSpec {
        name: "temperature",
        flag: "--temperature",
        values: "a number > 0, at most 1000000",
        default: "the checkpoint's calibrated value, else 1",
    },
    OptionSpec {
        name: "allow_uncalibrated",
        flag: "--allow-uncalibrated",
        values: "true, false",
        default: "false",
    },
    OptionSpec {
        name: "max_input_tokens",
        flag: "--max-input-tokens",
        values: "an integer from 1 to 1048576 (to the server's bound on the service)",
        default: "4096",
    },
    OptionSpec {
        name: "include_prompt",
        flag: "--include-prompt",
        values: "true, false",
        default: "false",
    },
    OptionSpec {
        name: "allowed_mass",
        flag: "--allowed-mass",
        values: "true, false",
        default: "false",
    },
    OptionSpec {
        name: "top_k",
        flag: "--top-k",
        values: "an integer from 0 to 1024 (needs allowed_mass)",
        default: "5",
    },
    OptionSpec {
        name: "literal_value",
        flag: "--literal-value",
        values: "argmax, greedy",
        default: "argmax",
    },
    OptionSpec {
        name: "layout",
        flag: "--layout",
        values: "context-first, fields-first",
        default: "context-first",
    },
];

/// The names of [`OPTIONS`], comma-separated (for the unknown-key message).
pub fn option_names() -> String {
    OPTIONS
        .iter()
        .map(|o| o.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// An option with a value it does not accept (or a name that is no option).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}: {rule}")]
pub struct OptionError {
    /// The option's name (as in an options object).
    pub name: String,
    pub rule: String,
}

/// A request's options: the engine's scoring options and the default `scoring` of the
/// schema's fields that name none.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestOptions {
    pub score: ScoreOptions,
    pub scoring: Scoring,
}

impl Default for RequestOptions {
    fn default() -> Self {
        RequestOptions {
            score: ScoreOptions::default(),
            scoring: Scoring::Code,
        }
    }
}

impl RequestOptions {
    /// The defaults, with `max_input_tokens` at `bound`.
    pub fn with_bound(bound: usize) -> RequestOptions {
        let mut o = RequestOptions::default();
        o.score.max_input_tokens = bound;
        o
    }

    /// Parse an options object: every key must be one of [`OPTIONS`], every value of the right
    /// type and range; `max_input_tokens` at most `bound` — the service's, which is then also
    /// the default when the key is absent; `usize::MAX` elsewhere, where the default is
    /// [`DEFAULT_MAX_INPUT_TOKENS`]. The first wrong key is the error.
    pub fn from_json(
        obj: &Map<String, Value>,
        bound: usize,
    ) -> Result<RequestOptions, OptionError> {
        let default_max = match bound {
            usize::MAX => DEFAULT_MAX_INPUT_TOKENS,
            b => b,
        };
        let mut out = RequestOptions::with_bound(default_max);
        let (mut allowed_mass, mut top_k) = (false, None);
        for (key, value) in obj {
            let bad = |rule: &str| OptionError {
                name: key.clone(),
                rule: rule.to_string(),
            };
            let word = || value.as_str().ok_or_else(|| bad("must be a string"));
            let flag = || value.as_bool().ok_or_else(|| bad("must be a boolean"));
            let o = &mut out.score;
            match key.as_str() {
                "scoring" => out.scoring = word()?.parse::<Scoring>().map_err(|e| bad(&e))?,
                "mode" => o.mode = word()?.parse::<Mode>().map_err(|e| bad(&e))?,
                "literal_value" => {
                    o.literal_value = word()?.parse::<LiteralValue>().map_err(|e| bad(&e))?
                }
                "layout" => o.layout = word()?.parse::<Layout>().map_err(|e| bad(&e))?,
                "temperature" => {
                    let t = value.as_f64().filter(|t| temperature_ok(*t));
                    o.temperature = Some(t.ok_or_else(|| bad(TEMPERATURE_RULE))?);
                }
                "allow_uncalibrated" => o.allow_uncalibrated = flag()?,
                "include_prompt" => o.include_prompt = flag()?,
                "allowed_mass" => allowed_mass = flag()?,
                "max_input_tokens" => {
                    let bound = bound.min(MAX_INPUT_TOKENS_LIMIT);
                    let n = value
                        .as_u64()
                        .filter(|n| *n >= 1 && (*n as u128) <= bound as u128);
                    o.max_input_tokens = n.ok_or_else(|| bad(&max_tokens_rule(bound)))? as usize;
                }
                "field_batch_size" => {
                    let n = value
                        .as_u64()
                        .filter(|n| (1..=MAX_FIELD_BATCH_SIZE as u64).contains(n));
                    o.field_batch_size = Some(n.ok_or_else(|| {
                        bad(&format!(
                            "must be an integer from 1 to {MAX_FIELD_BATCH_SIZE}"
                        ))
                    })? as usize);
                }
                "top_k" => {
                    let max = forkscore_seam::MAX_TOP_K;
                    let n = value.as_u64().filter(|n| *n as usize <= max);
                    top_k = Some(
                        n.ok_or_else(|| bad(&format!("must be an integer from 0 to {max}")))?
                            as usize,
                    );
                }
                _ => {
                    return Err(bad(&format!(
                        "unknown option (allowed: {})",
                        option_names()
                    )))
                }
            }
        }
        out.score.allowed_mass = allowed_mass_and_top_k(allowed_mass, top_k)?;
        Ok(out)
    }

    /// The same rules for options that arrived typed (the CLI's flags, after clap): the ranges
    /// of `temperature`, `field_batch_size`, `max_input_tokens` and `top_k`.
    pub fn check(&self) -> Result<(), OptionError> {
        let o = &self.score;
        let bad = |name: &str, rule: String| OptionError {
            name: name.into(),
            rule,
        };
        if let Some(t) = o.temperature {
            if !temperature_ok(t) {
                return Err(bad("temperature", TEMPERATURE_RULE.into()));
            }
        }
        if let Some(n) = o.field_batch_size {
            if !(1..=MAX_FIELD_BATCH_SIZE).contains(&n) {
                return Err(bad(
                    "field_batch_size",
                    format!("must be an integer from 1 to {MAX_FIELD_BATCH_SIZE}"),
                ));
            }
        }
        if !(1..=MAX_INPUT_TOKENS_LIMIT).contains(&o.max_input_tokens) {
            return Err(bad("max_input_tokens", max_tokens_rule(usize::MAX)));
        }
        if let Some(k) = o.allowed_mass {
            if k > forkscore_seam::MAX_TOP_K {
                return Err(bad(
                    "top_k",
                    format!("must be an integer from 0 to {}", forkscore_seam::MAX_TOP_K),
                ));
            }
        }
        Ok(())
    }
}

/// `allowed_mass` on with `top_k` K (default [`DEFAULT_TOP_K`]) is `Some(K)`; `top_k` without
/// `allowed_mass` is an error.
pub fn allowed_mass_and_top_k(
    allowed_mass: bool,
    top_k: Option<usize>,
) -> Result<Option<usize>, OptionError> {
    match (allowed_mass, top_k) {
        (true, k) => Ok(Some(k.unwrap_or(DEFAULT_TOP_K))),
        (false, Some(_)) => Err(OptionError {
            name: "top_k".into(),
            rule: "top_k needs allowed_mass: true (as --top-k needs --allowed-mass)".into(),
        }),
        (false, None) => Ok(None),
    }
}

const TEMPERATURE_RULE: &str = "must be a finite number > 0, at most 1000000";

fn temperature_ok(t: f64) -> bool {
    t.is_finite() && t > 0.0 && t <= MAX_TEMPERATURE
}

fn max_tokens_rule(bound: usize) -> String {
    if bound >= MAX_INPUT_TOKENS_LIMIT {
        format!("must be an integer from 1 to {MAX_INPUT_TOKENS_LIMIT}")
    } else {
        format!("must be an integer from 1 to this server's bound {bound}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<RequestOptions, OptionError> {
        RequestOptions::from_json(v.as_object().expect("object"), usize::MAX)
    }

    /// Every option of the table is accepted by name with a value of its kind, and refused by
    /// name with a wrong one.
    #[test]
    fn every_option_of_the_table_parses_and_refuses_by_name() {
        let good = json!({"scoring": "literal", "mode": "tree", "field_batch_size": 3,
            "temperature": 0.5, "allow_uncalibrated": true, "max_input_tokens": 100,
            "include_prompt": true, "allowed_mass": true, "top_k": 7, "literal_value": "greedy",
            "layout": "fields-first"});
        let o = parse(good.clone()).expect("all good");
        assert_eq!(
            o.scoring,
            Scoring::Literal(crate::schema::LiteralMethod::Exact)
        );
        assert_eq!(o.score.mode, Mode::Tree);
        assert_eq!(o.score.field_batch_size, Some(3));
        assert_eq!(o.score.temperature, Some(0.5));
        assert_eq!(o.score.max_input_tokens, 100);
        assert_eq!(o.score.allowed_mass, Some(7));
        assert_eq!(o.score.literal_value, LiteralValue::Greedy);
        assert_eq!(o.score.layout, Layout::FieldsFirst);
        for spec in OPTIONS {
            assert!(good.get(spec.name).is_some(), "{} not covered", spec.name);
            let e = parse(json!({ spec.name: "not-a-value-of-any-option" })).expect_err(spec.name);
            assert_eq!(e.name, spec.name);
        }
        let e = parse(json!({"temprature": 1.0})).expect_err("typo");
        assert!(
            e.rule.contains("unknown option") && e.rule.contains("temperature"),
            "{e}"
        );
        let e = parse(json!({"top_k": 3})).expect_err("top_k alone");
        assert_eq!(e.name, "top_k");
        assert_eq!(parse(json!({})).expect("empty"), RequestOptions::default());
    }

    #[test]
    fn the_server_bound_caps_max_input_tokens() {
        let obj = json!({"max_input_tokens": 5000});
        let e = RequestOptions::from_json(obj.as_object().expect("obj"), 4096).expect_err("over");
        assert!(e.rule.contains("4096"), "{e}");
    }

    #[test]
    fn typed_options_are_held_to_the_same_ranges() {
        let mut o = RequestOptions::default();
        assert_eq!(o.check(), Ok(()));
        o.score.temperature = Some(0.0);
        assert_eq!(o.check().expect_err("t=0").name, "temperature");
        o.score.temperature = None;
        o.score.field_batch_size = Some(0);
        assert_eq!(o.check().expect_err("fbs=0").name, "field_batch_size");
    }
}

#[cfg(test)]
mod doc_tests {
    /// docs/options.md lists every option by name and flag.
    #[test]
    fn the_options_page_lists_every_option() {
        let doc = include_str!("../../docs/options.md");
        for o in super::OPTIONS {
            let row = format!("| `{}` | `{}` |", o.name, o.flag);
            assert!(doc.contains(&row), "docs/options.md lacks {row}");
        }
    }
}
