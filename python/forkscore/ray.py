"""Ray Data recipe: score a JSONL file of decisions on a Ray cluster, one model per actor.

The records are exactly those of ``forkscore batch`` (same keys, same error kinds, same
provenance with ``batch_mode``, ``default_schema_hash``...): each actor runs the batch job's own
code over its batch of lines (``Scorer.batch_records``), so a Ray output and a ``forkscore
batch`` output of the same input hold the same records (timings aside).

    import ray
    from forkscore.ray import ForkscoreActor, read_jsonl, write_jsonl

    ds = read_jsonl("decisions.jsonl")            # rows {"path", "line", "text"}: one per line
    out = ds.map_batches(
        ForkscoreActor,
        fn_constructor_kwargs={"model": "/models/Qwen2.5-1.5B-Instruct", "revision": "v1",
                               "device": "cuda", "schema_file": "schema.json"},
        compute=ray.data.ActorPoolStrategy(size=4),  # actors = model copies (one per GPU)
        num_gpus=1,           # per actor; 0 on CPU
        batch_size=256,       # lines per batch_records call (one batch job window)
    )
    write_jsonl(out, "results.jsonl")

``ray.data.read_json(path)`` works too (rows are the parsed objects, re-serialized per row),
but Arrow merges the inline ``schema`` objects of different rows into one struct type, so use
``read_jsonl`` when lines bring their own schemas. ``compute=ActorPoolStrategy(size=N)`` is
Ray's current way to ask for N actors (``concurrency=N`` is deprecated since Ray 2.51;
``ActorPoolStrategy(min_size=M, max_size=N)`` autoscales). Rows without a ``line`` column get line 0
(unknown). Ids must be unique within a batch (``duplicate_id`` records otherwise); across
batches nothing checks them. This module imports Ray only inside ``read_jsonl`` /
``write_jsonl``; ``ForkscoreActor`` itself is plain Python and is tested without Ray.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from forkscore._native import Scorer

__all__ = ["ForkscoreActor", "batch_lines", "read_jsonl", "write_jsonl", "numbered_lines"]

#: Columns a row from ``read_jsonl`` has that are not part of a decision line.
_META_COLUMNS = ("line", "path", "text")


def numbered_lines(data: bytes, path: Optional[str] = None) -> List[Dict[str, Any]]:
    """Split a JSONL file's bytes into rows ``{"path", "line", "text"}`` (1-based physical line
    numbers, as ``forkscore batch`` counts them; a UTF-8 byte-order mark on line 1 dropped;
    ``text`` is bytes, so a line that is not UTF-8 still gets its ``invalid_utf8`` record)."""
    rows = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        if raw.strip():
            rows.append({"path": path, "line": number, "text": raw})
    return rows


def _file_rows(row: Mapping[str, Any]) -> List[Dict[str, Any]]:
    return numbered_lines(bytes(row["bytes"]), row.get("path"))


def read_jsonl(paths: Union[str, Sequence[str]], **read_kwargs: Any) -> Any:
    """A Ray dataset with one row ``{"path", "line", "text"}`` per non-blank input line.

    Each file is read whole by one task (``ray.data.read_binary_files``) and split into
    numbered lines, so line numbers are those of ``forkscore batch``; for very large files,
    split them first (or use ``forkscore batch --shard``)."""
    import ray

    ds = ray.data.read_binary_files(paths, include_paths=True, **read_kwargs)
    return ds.flat_map(_file_rows)


def _plain(value: Any) -> Any:
    """Arrow/NumPy values as plain JSON values; None entries of objects dropped (Arrow fills
    the keys other rows had with None)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items() if v is not None}
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return _plain(value.tolist())
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def batch_lines(batch: Mapping[str, Sequence[Any]]) -> List[Tuple[int, Union[str, bytes]]]:
    """The (line number, JSONL line) pairs of a Ray batch (a dict of columns).

    With a ``text`` column (``read_jsonl``), each row's ``text`` is its raw line. Otherwise each
    row's columns (except ``line`` / ``path``) are re-serialized as its JSON line, dropping
    missing (None) values. ``line`` gives the line number (0 when absent)."""
    columns = {k: list(v) for k, v in batch.items()}
    n = max((len(v) for v in columns.values()), default=0)
    numbers = columns.get("line")

    def number(i: int) -> int:
        if numbers is None or numbers[i] is None:
            return 0
        return int(numbers[i])

    if "text" in columns:
        texts = columns["text"]
        return [
            (number(i), t if isinstance(t, (str, bytes)) else bytes(t)) for i, t in enumerate(texts)
        ]
    keys = [k for k in columns if k not in _META_COLUMNS]
    out = []
    for i in range(n):
        row = {k: _plain(columns[k][i]) for k in keys}
        row = {k: v for k, v in row.items() if v is not None}
        out.append((number(i), json.dumps(row, ensure_ascii=False, allow_nan=False)))
    return out


class ForkscoreActor:
    """A Ray Data callable class: loads one model per actor, turns each batch of lines into
    ``forkscore batch`` records (one ``record`` column of JSON text).

    Constructor keywords: ``model``, ``revision``, ``device``, ``dtype`` (as ``Scorer.load``);
    ``load_options`` (other ``Scorer.load`` keywords, e.g. ``{"quantize": "q8_0"}``);
    ``schema`` (dict or JSON text) or ``schema_file``: the default schema of lines that bring
    none; ``batch_mode`` (``grouped`` | ``direct`` | ``serial``); ``schema_dir``: the folder a
    line's relative ``schema_file`` is read from (default: ``schema_file``'s folder, else the
    working directory); any other keyword is a scoring option of ``Scorer.batch_records``
    (``mode``, ``temperature``, ``max_input_tokens``...).
    """

    def __init__(
        self,
        model: str,
        revision: Optional[str] = None,
        device: str = "cpu",
        dtype: Optional[str] = None,
        *,
        schema: Optional[Union[str, Mapping[str, Any]]] = None,
        schema_file: Optional[str] = None,
        batch_mode: str = "grouped",
        schema_dir: Optional[str] = None,
        load_options: Optional[Mapping[str, Any]] = None,
        **score_options: Any,
    ) -> None:
        if schema is not None and schema_file is not None:
            raise ValueError("give at most one of schema and schema_file")
        if schema_file is not None:
            with open(schema_file, encoding="utf-8") as f:
                schema = f.read()
            if schema_dir is None:
                schema_dir = os.path.dirname(os.path.abspath(schema_file))
        self.schema = schema
        self.batch_mode = batch_mode
        self.schema_dir = schema_dir
        self.score_options = dict(score_options)
        self.scorer = Scorer.load(model, revision, device, dtype, **dict(load_options or {}))

    def records(self, lines: Sequence[Tuple[int, Union[str, bytes]]]) -> List[str]:
        """The output records of (line number, JSONL line) pairs."""
        return self.scorer.batch_records(
            list(lines),
            self.schema,
            batch_mode=self.batch_mode,
            schema_dir=self.schema_dir,
            **self.score_options,
        )

    def __call__(self, batch: Mapping[str, Sequence[Any]]) -> Dict[str, List[str]]:
        return {"record": self.records(batch_lines(batch))}


def write_jsonl(ds: Any, path: str) -> int:
    """Write the ``record`` column of ``ds`` (the output of ``map_batches(ForkscoreActor,
    ...)``) to one JSONL file, streaming; returns the number of records. Records come in
    Ray's output order: set ``ray.data.DataContext.get_current().execution_options.
    preserve_order = True`` for input order (each record also carries its ``id`` and
    ``line``)."""
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        for batch in ds.iter_batches(batch_format="numpy"):
            for record in batch["record"]:
                f.write(str(record))
                f.write("\n")
                written += 1
    return written

