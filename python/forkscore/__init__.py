"""forkscore: typed JSON decisions with a probability for every choice, from a local LLM checkpoint.

>>> import forkscore
>>> scorer = forkscore.Scorer.load("target/demo-qwen2.5", "demo")
>>> result = scorer.score("The payment service is down.",
...                       {"risk": {"type": "enum", "choices": ["low", "high"]}})
>>> result["output"]["risk"], result["fields"]["risk"]["scores"]

``score`` returns exactly the JSON object ``forkscore score`` prints (as a dict);
``decide_many`` returns one such dict per context, or the exception instance of a context
that failed (returned, not raised). Every error is a ``forkscore.Error``. Scoring releases the
GIL, so other Python threads run meanwhile. See docs/python.md in the repository; the Ray Data
recipe is ``forkscore.ray``.
"""

from forkscore._native import (
    DEFAULT_MAX_INPUT_TOKENS,
    CompileError,
    ContextError,
    EmptyContext,
    Error,
    ModelLoadError,
    OptionsError,
    SchemaError,
    Scorer,
    ScoringError,
    TemplateError,
    TooManyTokens,
    __version__,
)

__all__ = [
    "DEFAULT_MAX_INPUT_TOKENS",
    "CompileError",
    "ContextError",
    "EmptyContext",
    "Error",
    "ModelLoadError",
    "OptionsError",
    "SchemaError",
    "Scorer",
    "ScoringError",
    "TemplateError",
    "TooManyTokens",
    "__version__",
]
