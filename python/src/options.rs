//! The request options of the scoring calls: keyword arguments parsed into the engine's
//! `ScoreOptions` under the same names and rules as every other front end, and the shared
//! option table exported to Python as `forkscore.OPTIONS`.

use forkscore_engine::schema::Scoring;
use forkscore_engine::{Mode, ScoreOptions};
use forkscore_frontend::bounds::{check_flags, check_float_flag};
use pyo3::prelude::*;

use crate::{flag_error, with_kind, OptionsError};

pub(crate) fn option_error(
    py: Python<'_>,
    what: &str,
    value: &str,
    e: impl std::fmt::Display,
) -> PyErr {
    with_kind(
        py,
        OptionsError::new_err(format!("{what} {value:?}: {e}")),
        &"options",
    )
}

pub(crate) fn parse<T: std::str::FromStr>(py: Python<'_>, what: &str, value: &str) -> PyResult<T>
where
    T::Err: std::fmt::Display,
{
    value
        .parse::<T>()
        .map_err(|e| option_error(py, what, value, e))
}

/// The request options every scoring call takes (keyword arguments in Python).
#[derive(Clone)]
pub(crate) struct Options {
    pub(crate) score: ScoreOptions,
    pub(crate) scoring: Scoring,
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn options(
    py: Python<'_>,
    mode: &str,
    temperature: Option<f64>,
    max_input_tokens: usize,
    field_batch_size: Option<usize>,
    allow_uncalibrated: bool,
    include_prompt: bool,
    allowed_mass: bool,
    top_k: usize,
    scoring: &str,
    literal_value: &str,
    layout: &str,
) -> PyResult<Options> {
    check_flags(&[
        ("--max-input-tokens", Some(max_input_tokens)),
        ("--field-batch-size", field_batch_size),
        ("--top-k", Some(top_k)),
    ])
    .map_err(|e| flag_error(py, &e))?;
    check_float_flag("--temperature", temperature, 1e6).map_err(|e| flag_error(py, &e))?;
    Ok(Options {
        score: ScoreOptions {
            mode: parse::<Mode>(py, "mode", mode)?,
            field_batch_size,
            temperature,
            allow_uncalibrated,
            max_input_tokens,
            include_prompt,
            allowed_mass: allowed_mass.then_some(top_k),
            literal_value: parse::<forkscore_engine::LiteralValue>(
                py,
                "literal_value",
                literal_value,
            )?,
            layout: parse::<forkscore_engine::Layout>(py, "layout", layout)?,
        },
        scoring: parse::<Scoring>(py, "scoring", scoring)?,
    })
}

/// `forkscore.OPTIONS`: the engine's option table as a list of dicts (name, flag, values,
/// default).
pub(crate) fn option_table(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyList>> {
    let options = pyo3::types::PyList::empty(py);
    for o in forkscore_engine::OPTIONS {
        let d = pyo3::types::PyDict::new(py);
        d.set_item("name", o.name)?;
        d.set_item("flag", o.flag)?;
        d.set_item("values", o.values)?;
        d.set_item("default", o.default)?;
        options.append(d)?;
    }
    Ok(options)
}
