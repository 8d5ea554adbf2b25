"""`forkscore.Scorer`: the native scorer (forkscore._native.Scorer) with the Python-side
conveniences for data work: `decide_many` over lists, pandas Series and DataFrame columns with
per-row input errors and optional progress, async variants, and `ask()` for one question.

Scoring itself is the native module's (the CLI's own code, GIL released); this layer only
turns Python inputs into texts and results back into the input's shape."""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Callable, Dict, Hashable, NamedTuple, Optional, Sequence, Union

from forkscore import _inputs
from forkscore._native import DEFAULT_MAX_INPUT_TOKENS, OptionsError
from forkscore._native import Scorer as _NativeScorer

#: The one field `ask()` builds its schema with.
ASK_FIELD = "answer"



def _check_switches(**switches: Any) -> None:
    """The boolean options must be booleans: an OptionsError naming the option otherwise (the
    same rule and words as the service's `options`, instead of the binding's bare TypeError)."""
    for name, value in switches.items():
        if not isinstance(value, bool):
            err = OptionsError(f"{name} {value!r}: must be a boolean (True or False)")
            err.kind = "options"
            raise err

class Answer(NamedTuple):
    """What `ask()` returns: the chosen value (a choice, or a bool for a yes/no question), the
    probability of every choice (keyed as in the result's ``scores``), and the full result."""

    value: Any
    probabilities: Dict[str, float]
    result: Dict[str, Any]


def _progress_callback(progress: Any, total: int):
    """(callback for the native call, close function) for `progress=`: None/False → none,
    True → a tqdm bar (ImportError naming tqdm when it is not installed), a callable → it."""
    if progress is None or progress is False:
        return None, lambda: None
    if progress is True:
        try:
            from tqdm.auto import tqdm
        except ImportError as e:
            raise ImportError(
                "progress=True shows a tqdm bar, but tqdm is not installed: pip install tqdm "
                "(or pass a callable progress(done, total))"
            ) from e
        bar = tqdm(total=total, unit="ctx", desc="forkscore")

        def update(done: int, _total: int) -> None:
            bar.update(done - bar.n)

        return update, bar.close
    if callable(progress):
        return progress, lambda: None
    raise TypeError(f"progress= takes True, False, None or a callable(done, total); got {progress!r}")


class Scorer:
    """A loaded model, ready to score. Thread-safe: scoring releases the GIL and a Scorer may
    be shared by threads (and by the async methods, which run in the default executor)."""

    __slots__ = ("_native",)

    def __init__(self, native: _NativeScorer) -> None:
        """Wraps a native scorer; use `Scorer.load`."""
        if not isinstance(native, _NativeScorer):
            raise TypeError("use forkscore.Scorer.load(model, revision, ...) to make a Scorer")
        self._native = native

    @classmethod
    def load(
        cls,
        model: str,
        revision: Optional[str] = None,
        device: str = "cpu",
        dtype: Optional[str] = None,
        *,
        prefill_chunk: Optional[int] = None,
        quantize: Optional[str] = None,
        calibration_file: Optional[str] = None,
        context_special_tokens: bool = False,
        deterministic: bool = False,
    ) -> "Scorer":
        """Load like `forkscore score --model MODEL --revision REVISION --device DEVICE`."""
        return cls(
            _NativeScorer.load(
                model,
                revision,
                device,
                dtype,
                prefill_chunk=prefill_chunk,
                quantize=quantize,
                calibration_file=calibration_file,
                context_special_tokens=context_special_tokens,
                deterministic=deterministic,
            )
        )

    @property
    def provenance(self) -> Dict[str, Any]:
        """What provenance records about the loaded model (a dict)."""
        return self._native.provenance

    def __repr__(self) -> str:
        return repr(self._native)

    def score(
        self,
        context: str,
        schema: Any,
        *,
        mode: str = "parallel",
        temperature: Optional[float] = None,
        max_input_tokens: int = DEFAULT_MAX_INPUT_TOKENS,
        field_batch_size: Optional[int] = None,
        allow_uncalibrated: bool = False,
        include_prompt: bool = False,
        allowed_mass: bool = False,
        top_k: int = 5,
        scoring: str = "code",
        literal_value: str = "argmax",
        layout: str = "context-first",
    ) -> Dict[str, Any]:
        """One decision: the dict `forkscore score` prints. Raises a forkscore.Error subclass."""
        _check_switches(
            allow_uncalibrated=allow_uncalibrated,
            include_prompt=include_prompt,
            allowed_mass=allowed_mass,
        )
        return self._native.score(
            context,
            schema,
            mode=mode,
            temperature=temperature,
            max_input_tokens=max_input_tokens,
            field_batch_size=field_batch_size,
            allow_uncalibrated=allow_uncalibrated,
            include_prompt=include_prompt,
            allowed_mass=allowed_mass,
            top_k=top_k,
            scoring=scoring,
            literal_value=literal_value,
            layout=layout,
        )

    def decide_many(
        self,
        contexts: Any,
        schema: Any,
        *,
        column: Optional[Hashable] = None,
        errors: str = "raise",
        progress: Union[bool, None, Callable[[int, int], Any]] = None,
        mode: str = "parallel",
        temperature: Optional[float] = None,
        max_input_tokens: int = DEFAULT_MAX_INPUT_TOKENS,
        field_batch_size: Optional[int] = None,
        allow_uncalibrated: bool = False,
        include_prompt: bool = False,
        allowed_mass: bool = False,
        top_k: int = 5,
        scoring: str = "code",
        literal_value: str = "argmax",
        layout: str = "context-first",
    ) -> Any:
        """Many contexts against one schema, in bounded merged groups. See docs/python.md.

        `contexts`: a list/tuple (any iterable of str), a pandas Series, or a DataFrame with
        `column=` naming its text column. Returns a list in input order (a pandas Series with
        the input's index for pandas input): per context its result dict, or the exception
        instance of that context (returned, with `row` and `label` set). An item that is not a
        str raises InvalidContext naming the rows before anything is scored (errors="raise"),
        or is returned as an InvalidContext in place (errors="keep")."""
        _check_switches(
            allow_uncalibrated=allow_uncalibrated,
            include_prompt=include_prompt,
            allowed_mass=allowed_mass,
        )
        given = _inputs.normalise(contexts, column)
        bad = _inputs.invalid(given, errors)
        bad_rows = {e.row for e in bad}
        texts = [t for row, t in enumerate(given.items) if row not in bad_rows]
        total = len(given.items)
        callback, close = _progress_callback(progress, total)
        reported = [0]

        def on_progress(done: int, _of: int) -> None:
            reported[0] = done + len(bad)
            callback(reported[0], total)

        try:
            if callback is not None and bad:
                reported[0] = len(bad)
                callback(reported[0], total)
            decided = iter(
                self._native.decide_many(
                    texts,
                    schema,
                    mode=mode,
                    temperature=temperature,
                    max_input_tokens=max_input_tokens,
                    field_batch_size=field_batch_size,
                    allow_uncalibrated=allow_uncalibrated,
                    include_prompt=include_prompt,
                    allowed_mass=allowed_mass,
                    top_k=top_k,
                    scoring=scoring,
                    literal_value=literal_value,
                    layout=layout,
                    progress=None if callback is None else on_progress,
                )
            )
            # (the native call reports nothing when it has nothing to score)
            if callback is not None and reported[0] != total:
                callback(total, total)
        finally:
            close()
        bad_at = {e.row: e for e in bad}
        results = []
        for row, label in enumerate(given.labels):
            item = bad_at.get(row)
            if item is None:
                item = next(decided)
                if isinstance(item, BaseException):
                    item.row, item.label = row, label
            results.append(item)
        if given.index is None:
            return results
        import pandas

        return pandas.Series(results, index=given.index, name=given.name, dtype=object)

    def batch_records(
        self,
        lines: Sequence[Any],
        schema: Any = None,
        *,
        batch_mode: str = "grouped",
        schema_dir: Optional[str] = None,
        mode: str = "parallel",
        temperature: Optional[float] = None,
        max_input_tokens: int = DEFAULT_MAX_INPUT_TOKENS,
        field_batch_size: Optional[int] = None,
        allow_uncalibrated: bool = False,
        include_prompt: bool = False,
        allowed_mass: bool = False,
        top_k: int = 5,
        scoring: str = "code",
        literal_value: str = "argmax",
        layout: str = "context-first",
    ) -> Any:
        """`forkscore batch` in memory: (line number, JSONL line) pairs in, records out."""
        _check_switches(
            allow_uncalibrated=allow_uncalibrated,
            include_prompt=include_prompt,
            allowed_mass=allowed_mass,
        )
        return self._native.batch_records(
            lines,
            schema,
            batch_mode=batch_mode,
            schema_dir=schema_dir,
            mode=mode,
            temperature=temperature,
            max_input_tokens=max_input_tokens,
            field_batch_size=field_batch_size,
            allow_uncalibrated=allow_uncalibrated,
            include_prompt=include_prompt,
            allowed_mass=allowed_mass,
            top_k=top_k,
            scoring=scoring,
            literal_value=literal_value,
            layout=layout,
        )

    def ask(
        self,
        context: str,
        question: str,
        choices: Optional[Sequence[str]] = None,
        **options: Any,
    ) -> Answer:
        """One question about `context`: the one-field schema ``{"answer": {"type": "enum",
        "choices": choices, "description": question}}`` (a boolean field when `choices` is
        omitted: the value is then True/False). Options as `score`. Returns an `Answer`."""
        result = self.score(context, ask_schema(question, choices), **options)
        field = result["fields"][ASK_FIELD]
        return Answer(field["value"], dict(field["scores"]), result)

    async def ascore(self, context: str, schema: Any, **options: Any) -> Dict[str, Any]:
        """`score` in the running loop's default executor (the GIL is released meanwhile)."""
        return await _in_executor(self.score, context, schema, **options)

    async def adecide_many(self, contexts: Any, schema: Any, **options: Any) -> Any:
        """`decide_many` in the running loop's default executor; a `progress` callable is
        called from that worker thread."""
        return await _in_executor(self.decide_many, contexts, schema, **options)

    async def aask(
        self,
        context: str,
        question: str,
        choices: Optional[Sequence[str]] = None,
        **options: Any,
    ) -> Answer:
        """`ask` in the running loop's default executor."""
        return await _in_executor(self.ask, context, question, choices, **options)


async def _in_executor(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, functools.partial(call, *args, **kwargs))


def ask_schema(question: str, choices: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """The one-field schema `ask` scores (see `Scorer.ask`)."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError("ask() needs a non-empty question (str)")
    if choices is None:
        return {ASK_FIELD: {"type": "boolean", "description": question}}
    if isinstance(choices, (str, bytes)):
        raise TypeError("choices is a list of choices, not a single str: choices=[...]")
    return {ASK_FIELD: {"type": "enum", "choices": list(choices), "description": question}}
