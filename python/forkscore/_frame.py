"""`forkscore.to_dataframe`: results (of `decide_many`, `score`) flattened to a pandas
DataFrame, one row per result, for data work."""

from __future__ import annotations

from typing import Any, Dict, List


def _rows(results: Any) -> List[Any]:
    if isinstance(results, dict):  # one result of `score`
        return [results]
    return list(results)


def to_dataframe(results: Any) -> Any:
    """One row per result, in order: for each field ``FIELD`` its value, and ``FIELD.p.CHOICE``
    the probability of each choice (the result's ``scores``); ``error`` / ``error_kind`` are
    the message and ``kind`` of a row whose entry is an exception (its field columns NaN) and
    None elsewhere. A pandas Series (what `decide_many` returns for pandas input) keeps its
    index; a list gets 0..n-1. Columns follow the first result's field and choice order."""
    import pandas

    index = results.index if isinstance(results, pandas.Series) else None
    records: List[Dict[str, Any]] = []
    columns: Dict[str, None] = {}
    for entry in _rows(results):
        row: Dict[str, Any] = {}
        if isinstance(entry, BaseException):
            row["error"] = str(entry)
            row["error_kind"] = getattr(entry, "kind", type(entry).__name__)
        elif isinstance(entry, dict) and "fields" in entry:
            for name, field in entry["fields"].items():
                row[name] = field["value"]
                for choice, p in field["scores"].items():
                    row[f"{name}.p.{choice}"] = p
            row["error"] = None
            row["error_kind"] = None
        else:
            raise TypeError(
                f"to_dataframe takes results of score/decide_many (dicts or exceptions); got {type(entry).__name__}"
            )
        for key in row:
            if key not in ("error", "error_kind"):
                columns.setdefault(key)
        records.append(row)
    order = [*columns, "error", "error_kind"]
    frame = pandas.DataFrame(records, columns=order)
    if index is not None:
        frame.index = index
    return frame
