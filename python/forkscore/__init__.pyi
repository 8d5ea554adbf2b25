"""Type stubs of the forkscore package (the native module forkscore._native, re-exported)."""

from typing import Any, Literal, Mapping, Optional, Sequence, Tuple, Union

__version__: str
DEFAULT_MAX_INPUT_TOKENS: int

Mode = Literal["parallel", "cached-serial", "independent"]
ScoringMethod = Literal[
    "code", "literal", "literal-first-token", "literal-sum-loglik", "literal-mean-loglik"
]
#: A schema: the flat form or the JSON Schema form, as a dict or as JSON text.
SchemaLike = Union[str, Mapping[str, Any]]
#: The JSON object `forkscore score` prints: "output", "fields", "temperature", "telemetry",
#: "provenance" (and "prompt" with include_prompt=True).
Result = dict[str, Any]

class Error(Exception):
    """Base class of every forkscore error."""

    #: The error kind of a `forkscore batch` error record (e.g. "invalid_schema", "empty_context").
    kind: str

class SchemaError(Error):
    """The schema was rejected."""

    #: JSON path of the offending value ("<root>" for the whole schema).
    path: str
    #: The rule it broke.
    rule: str

class CompileError(Error): ...
class ContextError(Error): ...
class EmptyContext(ContextError): ...
class TooManyTokens(ContextError): ...
class OptionsError(Error): ...
class ModelLoadError(Error): ...
class TemplateError(Error): ...
class ScoringError(Error): ...

class Scorer:
    """A loaded model. Thread-safe; every scoring call releases the GIL."""

    @staticmethod
    def load(
        model: str,
        revision: Optional[str] = None,
        device: str = "cpu",
        dtype: Optional[Literal["f32", "bf16", "f16"]] = None,
        *,
        prefill_chunk: Optional[int] = None,
        quantize: Optional[Literal["q8_0", "q4k", "bf16"]] = None,
        calibration_file: Optional[str] = None,
        context_special_tokens: bool = False,
    ) -> "Scorer":
        """Load like `forkscore score --model MODEL --revision REVISION --device DEVICE`.

        Raises ModelLoadError (missing folder, missing revision, bad checkpoint) or
        OptionsError (unknown device, dtype or quantization)."""
    @property
    def provenance(self) -> dict[str, Any]:
        """What provenance records about the loaded model."""
    def score(
        self,
        context: str,
        schema: SchemaLike,
        *,
        mode: Mode = "parallel",
        temperature: Optional[float] = None,
        max_input_tokens: int = ...,
        field_batch_size: Optional[int] = None,
        allow_uncalibrated: bool = False,
        include_prompt: bool = False,
        allowed_mass: bool = False,
        top_k: int = 5,
        scoring: ScoringMethod = "code",
    ) -> Result:
        """One decision: the dict `forkscore score` prints. Raises a forkscore.Error subclass."""
    def decide_many(
        self,
        contexts: Sequence[str],
        schema: SchemaLike,
        *,
        mode: Mode = "parallel",
        temperature: Optional[float] = None,
        max_input_tokens: int = ...,
        field_batch_size: Optional[int] = None,
        allow_uncalibrated: bool = False,
        include_prompt: bool = False,
        allowed_mass: bool = False,
        top_k: int = 5,
        scoring: ScoringMethod = "code",
    ) -> list[Union[Result, Error]]:
        """One entry per context, in order: its result dict, or its exception instance
        (returned, not raised). A bad schema or bad options raise."""
    def batch_records(
        self,
        lines: Sequence[Tuple[int, str]],
        schema: Optional[SchemaLike] = None,
        *,
        batch_mode: Literal["grouped", "direct", "serial"] = "grouped",
        schema_dir: Optional[str] = None,
        mode: Mode = "parallel",
        temperature: Optional[float] = None,
        max_input_tokens: int = ...,
        field_batch_size: Optional[int] = None,
        allow_uncalibrated: bool = False,
        include_prompt: bool = False,
        allowed_mass: bool = False,
        top_k: int = 5,
        scoring: ScoringMethod = "code",
    ) -> list[str]:
        """`forkscore batch` in memory: (line number, JSONL input line) pairs in, the output
        records (JSON text) out, exactly as `forkscore batch` writes them."""
