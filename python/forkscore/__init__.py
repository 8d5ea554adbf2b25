"""forkscore: typed JSON decisions with a probability for every choice, from a local LLM checkpoint.

>>> import forkscore
>>> scorer = forkscore.Scorer.load("target/demo-qwen2.5", "demo")
>>> result = scorer.score("The payment service is down.",
...                       {"risk": {"type": "enum", "choices": ["low", "high"]}})
>>> result["output"]["risk"], result["fields"]["risk"]["scores"]
>>> scorer.ask("The payment service is down.", "Is this urgent?")   # Answer(value=True, ...)

``score`` returns exactly the JSON object ``forkscore score`` prints (as a dict);
``decide_many`` takes a list, a pandas Series or a DataFrame column (``column=``) and returns
one such dict per context, or the exception instance of a context that failed (returned, not
raised); ``to_dataframe`` flattens results to a DataFrame. Every error is a ``forkscore.Error``.
Scoring releases the GIL, so other Python threads (and ``adecide_many`` / ``ascore`` /
``aask``) run meanwhile. See docs/python.md in the repository; the Ray Data recipe is
``forkscore.ray``.
"""

from forkscore._frame import to_dataframe
from forkscore._inputs import InvalidContext
from forkscore._native import (
    DEFAULT_MAX_INPUT_TOKENS,
    OPTIONS,
    CompileError,
    ContextError,
    EmptyContext,
    Error,
    ModelLoadError,
    OptionsError,
    SchemaError,
    ScoringError,
    TemplateError,
    TooManyTokens,
    __version__,
)
from forkscore._scorer import Answer, Scorer, ask_schema

__all__ = [
    "DEFAULT_MAX_INPUT_TOKENS",
    "OPTIONS",
    "Answer",
    "CompileError",
    "ContextError",
    "EmptyContext",
    "Error",
    "InvalidContext",
    "ModelLoadError",
    "OptionsError",
    "SchemaError",
    "Scorer",
    "ScoringError",
    "TemplateError",
    "TooManyTokens",
    "__version__",
    "ask_schema",
    "to_dataframe",
]
