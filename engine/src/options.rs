//! Per-request scoring options and the choices they name: how rows are evaluated ([`Mode`]),
//! how a literal field's value is selected ([`LiteralValue`]), where the context sits in the
//! prompt ([`Layout`]) and the token bound
//! ([`DEFAULT_MAX_INPUT_TOKENS`]). Plain data with no dependency inside the crate: every stage
//! reads these, none of them is needed to build one.

use serde::{Deserialize, Serialize};

/// Default bound on prefix + longest suffix tokens.
pub const DEFAULT_MAX_INPUT_TOKENS: usize = 4096;

/// Per-request scoring options.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreOptions {
    pub mode: Mode,
    /// Rows per score call in parallel mode (None: all rows in one call).
    pub field_batch_size: Option<usize>,
    /// None: the checkpoint's calibrated default, else 1.
    pub temperature: Option<f64>,
    pub allow_uncalibrated: bool,
    pub max_input_tokens: usize,
    pub include_prompt: bool,
    /// `Some(K)`: per field, the full-vocabulary probability mass on its allowed codes at the
    /// decision position and the top K unconstrained tokens there (K ≤ `MAX_TOP_K` and the
    /// vocabulary; 0 gives the mass alone). Never changes a decision.
    pub allowed_mass: Option<usize>,
    /// How a literal field's value is selected: the most probable choice (default) or the
    /// constrained greedy decoder's choice.
    pub literal_value: LiteralValue,
    /// Where the context sits in the prompt: before the catalogue of fields (default) or after
    /// it, so that the whole catalogue is part of the prompt head that grouped decisions
    /// prefill once (`engine::head`).
    pub layout: Layout,
}

impl Default for ScoreOptions {
    fn default() -> Self {
        ScoreOptions {
            mode: Mode::Parallel,
            field_batch_size: None,
            temperature: None,
            allow_uncalibrated: false,
            max_input_tokens: DEFAULT_MAX_INPUT_TOKENS,
            include_prompt: false,
            allowed_mass: None,
            literal_value: LiteralValue::Argmax,
            layout: Layout::ContextFirst,
        }
    }
}

/// How rows are evaluated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Mode {
    #[default]
    Parallel,
    CachedSerial,
    Independent,
    /// Every code row of a group in one token-tree call (packed on attention-only models).
    Tree,
}

impl Mode {
    /// Every mode, in documentation order.
    pub const ALL: [Mode; 4] = [
        Mode::Parallel,
        Mode::CachedSerial,
        Mode::Independent,
        Mode::Tree,
    ];
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "parallel" => Ok(Mode::Parallel),
            "cached-serial" | "cached_serial" => Ok(Mode::CachedSerial),
            "independent" => Ok(Mode::Independent),
            "tree" => Ok(Mode::Tree),
            other => Err(format!(
                "unknown mode {other:?} (expected parallel, cached-serial, independent or tree)"
            )),
        }
    }
}

/// How a literal field's value is selected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LiteralValue {
    /// The choice with the largest reported probability (the first choice wins ties).
    #[default]
    Argmax,
    /// The constrained greedy decoder's choice (`"literal"` and `"literal-first-token"`; the
    /// log-likelihood methods keep their argmax).
    Greedy,
}

impl LiteralValue {
    pub fn name(self) -> &'static str {
        match self {
            LiteralValue::Argmax => "argmax",
            LiteralValue::Greedy => "greedy",
        }
    }
}

impl std::str::FromStr for LiteralValue {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "argmax" => Ok(LiteralValue::Argmax),
            "greedy" => Ok(LiteralValue::Greedy),
            other => Err(format!(
                "unknown literal value rule {other:?} (expected argmax or greedy)"
            )),
        }
    }
}

/// Where the context sits in the prompt's user turn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Layout {
    /// `Context:` and the context, then the catalogue of fields and the closing line.
    #[default]
    ContextFirst,
    /// The catalogue of fields, then `Context:` and the context, then the closing line: the
    /// instructions and the whole catalogue come before the context, so every context of a
    /// schema shares them as one prompt head (prefilled once by grouped decisions). A
    /// different prompt: decisions differ from the context-first layout's.
    FieldsFirst,
}

impl Layout {
    pub fn name(self) -> &'static str {
        match self {
            Layout::ContextFirst => "context-first",
            Layout::FieldsFirst => "fields-first",
        }
    }
}

impl std::str::FromStr for Layout {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "context-first" => Ok(Layout::ContextFirst),
            "fields-first" => Ok(Layout::FieldsFirst),
            other => Err(format!(
                "unknown layout {other:?} (expected context-first or fields-first)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Layout, LiteralValue, Mode};

    #[test]
    fn layouts_parse_by_name_and_default_to_context_first() {
        for l in [Layout::ContextFirst, Layout::FieldsFirst] {
            assert_eq!(l.name().parse::<Layout>(), Ok(l));
        }
        assert_eq!(Layout::default(), Layout::ContextFirst);
        let e = "schema-first".parse::<Layout>().unwrap_err();
        assert!(e.contains("context-first or fields-first"), "{e}");
    }

    #[test]
    fn modes_parse_by_name_and_an_unknown_one_lists_them_all() {
        for (name, mode) in [
            ("parallel", Mode::Parallel),
            ("cached-serial", Mode::CachedSerial),
            ("independent", Mode::Independent),
            ("tree", Mode::Tree),
        ] {
            assert_eq!(name.parse::<Mode>(), Ok(mode));
            assert_eq!(serde_json::to_value(mode).ok(), Some(name.into()));
        }
        let e = "packed".parse::<Mode>().unwrap_err();
        assert!(
            e.contains("parallel, cached-serial, independent or tree"),
            "{e}"
        );
    }

    #[test]
    fn literal_value_rules_parse_by_name_and_default_to_argmax() {
        assert_eq!("argmax".parse::<LiteralValue>(), Ok(LiteralValue::Argmax));
        assert_eq!("greedy".parse::<LiteralValue>(), Ok(LiteralValue::Greedy));
        assert_eq!(LiteralValue::default(), LiteralValue::Argmax);
        let e = "best".parse::<LiteralValue>().unwrap_err();
        assert!(e.contains("expected argmax or greedy"), "{e}");
    }
}
