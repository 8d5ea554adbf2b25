"""Type stubs of the forkscore package. python/tests/test_stubs.py compares them with the
runtime package (signatures, defaults, the Literal values the binding accepts)."""

from typing import (
    Any,
    Callable,
    Dict,
    Hashable,
    Iterable,
    List,
    Literal,
    Mapping,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    Union,
)

__version__: str
DEFAULT_MAX_INPUT_TOKENS: int
#: The request options every front end shares: name, CLI flag, values, default.
OPTIONS: List[Dict[str, str]]

Mode = Literal["parallel", "cached-serial", "independent", "tree"]
ScoringMethod = Literal[
    "code", "literal", "literal-first-token", "literal-sum-loglik", "literal-mean-loglik", "json"
]
LiteralValue = Literal["argmax", "greedy"]
Layout = Literal["context-first", "fields-first"]
BatchMode = Literal["grouped", "direct", "serial"]
DType = Literal["f32", "bf16", "f16"]
Quantization = Literal["q8_0", "q4k", "bf16", "int8"]
#: `decide_many`'s policy for items that are not a str.
ErrorPolicy = Literal["raise", "keep"]
#: `progress=`: a tqdm bar (True), none (None / False), or a callable(done, total).
Progress = Union[bool, None, Callable[[int, int], Any]]
#: A schema: the flat form or the JSON Schema form, as a dict or as JSON text.
SchemaLike = Union[str, Mapping[str, Any]]
#: The JSON object `forkscore score` prints: "output", "fields", "temperature", "telemetry",
#: "provenance" (and "prompt" with include_prompt=True).
Result = Dict[str, Any]
#: decide_many's contexts: a list/tuple/iterable of str, a pandas Series, or a DataFrame
#: (with column=).
Contexts = Union[Sequence[Optional[str]], Iterable[Any], Any]

class Error(Exception):
    """Base class of every forkscore error."""

    #: The error kind of a `forkscore batch` error record (e.g. "invalid_schema", "empty_context").
    kind: str
    #: Set on the exceptions `decide_many` returns in place: the 0-based position and the
    #: index label of the context.
    row: int
    label: Hashable

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

class InvalidContext(ContextError, ValueError):
    """A decide_many item that is not a str (kind "invalid_context"). When raised
    (errors="raise"), `rows` / `labels` name every bad item."""

    rows: List[int]
    labels: List[Hashable]

class OptionsError(Error): ...
class ModelLoadError(Error): ...
class TemplateError(Error): ...
class ScoringError(Error): ...

class Answer(NamedTuple):
    """What `ask` returns."""

    value: Any
    probabilities: Dict[str, float]
    result: Result

def ask_schema(question: str, choices: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """The one-field schema `ask` scores: field "answer", enum of `choices` or boolean."""

def to_dataframe(results: Any) -> Any:
    """Results flattened to a pandas DataFrame: FIELD, FIELD.p.CHOICE, error, error_kind."""

class Scorer:
    """A loaded model. Thread-safe; every scoring call releases the GIL."""

    def __init__(self, native: Any) -> None: ...
    @classmethod
    def load(
        cls,
        model: str,
        revision: Optional[str] = None,
        device: str = "cpu",
        dtype: Optional[DType] = None,
        *,
        prefill_chunk: Optional[int] = None,
        quantize: Optional[Quantization] = None,
        calibration_file: Optional[str] = None,
        context_special_tokens: bool = False,
        deterministic: bool = False,
    ) -> "Scorer":
        """Load like `forkscore score --model MODEL --revision REVISION --device DEVICE`.

        Raises ModelLoadError (missing folder, missing revision, bad checkpoint) or
        OptionsError (unknown device, dtype or quantization)."""
    @property
    def provenance(self) -> Dict[str, Any]:
        """What provenance records about the loaded model."""
    def score(
        self,
        context: str,
        schema: SchemaLike,
        *,
        mode: Mode = "parallel",
        temperature: Optional[float] = None,
        max_input_tokens: int = 4096,
        field_batch_size: Optional[int] = None,
        allow_uncalibrated: bool = False,
        include_prompt: bool = False,
        allowed_mass: bool = False,
        top_k: int = 5,
        scoring: ScoringMethod = "code",
        literal_value: LiteralValue = "argmax",
        layout: Layout = "context-first",
    ) -> Result:
        """One decision: the dict `forkscore score` prints. Raises a forkscore.Error subclass."""
    def decide_many(
        self,
        contexts: Contexts,
        schema: SchemaLike,
        *,
        column: Optional[Hashable] = None,
        errors: ErrorPolicy = "raise",
        progress: Progress = None,
        mode: Mode = "parallel",
        temperature: Optional[float] = None,
        max_input_tokens: int = 4096,
        field_batch_size: Optional[int] = None,
        allow_uncalibrated: bool = False,
        include_prompt: bool = False,
        allowed_mass: bool = False,
        top_k: int = 5,
        scoring: ScoringMethod = "code",
        literal_value: LiteralValue = "argmax",
        layout: Layout = "context-first",
    ) -> Any:
        """One entry per context, in order (a list; a pandas Series with the input's index for
        pandas input): its result dict, or its exception instance (returned, not raised, with
        `row` and `label`). A bad schema or bad options raise; items that are not a str raise
        InvalidContext (errors="raise") or are InvalidContext entries (errors="keep")."""
    def batch_records(
        self,
        lines: Sequence[Tuple[int, Union[str, bytes]]],
        schema: Optional[SchemaLike] = None,
        *,
        batch_mode: BatchMode = "grouped",
        schema_dir: Optional[str] = None,
        mode: Mode = "parallel",
        temperature: Optional[float] = None,
        max_input_tokens: int = 4096,
        field_batch_size: Optional[int] = None,
        allow_uncalibrated: bool = False,
        include_prompt: bool = False,
        allowed_mass: bool = False,
        top_k: int = 5,
        scoring: ScoringMethod = "code",
        literal_value: LiteralValue = "argmax",
        layout: Layout = "context-first",
    ) -> List[str]:
        """`forkscore batch` in memory: (line number, JSONL input line) pairs in, the output
        records (JSON text) out, exactly as `forkscore batch` writes them."""
    def ask(
        self,
        context: str,
        question: str,
        choices: Optional[Sequence[str]] = None,
        **options: Any,
    ) -> Answer:
        """One question: field "answer" (enum of `choices`, boolean when omitted) with the
        question as its description; options as `score`."""
    async def ascore(self, context: str, schema: SchemaLike, **options: Any) -> Result:
        """`score` in the running loop's default executor."""
    async def adecide_many(self, contexts: Contexts, schema: SchemaLike, **options: Any) -> Any:
        """`decide_many` in the running loop's default executor."""
    async def aask(
        self,
        context: str,
        question: str,
        choices: Optional[Sequence[str]] = None,
        **options: Any,
    ) -> Answer:
        """`ask` in the running loop's default executor."""
