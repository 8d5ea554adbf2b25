"""The contexts `Scorer.decide_many` accepts, normalised once: a list or tuple (or any other
iterable of texts), a pandas Series, or a DataFrame with ``column=`` naming its text column.

Every item must be a ``str``; an item that is not (None, NaN, a number, bytes) is an
``InvalidContext`` naming its position and its index label, raised before anything is scored
(``errors="raise"``) or returned in its place (``errors="keep"``)."""

from __future__ import annotations

import sys
from typing import Any, Hashable, List, NamedTuple, Optional

from forkscore._native import ContextError

#: The `errors=` policies of `decide_many` for items that are not a str.
ERROR_POLICIES = ("raise", "keep")
#: How many bad rows a raised InvalidContext names before "and N more".
_NAMED_ROWS = 5


class InvalidContext(ContextError, ValueError):
    """An item of ``decide_many``'s contexts that is not a ``str`` (None, NaN, a number...).

    ``row`` is its 0-based position, ``label`` its index label (the pandas index label; the
    position for a list). Raised with ``errors="raise"`` (then ``rows`` / ``labels`` list
    every bad item), returned in the item's place with ``errors="keep"``."""

    kind = "invalid_context"


class Contexts(NamedTuple):
    """`decide_many`'s input, normalised: the items, their index labels, the pandas index to
    return results on (None for a plain sequence) and the name of the returned Series."""

    items: List[Any]
    labels: List[Hashable]
    index: Any
    name: Optional[Hashable]


def _pandas_types():
    pandas = sys.modules.get("pandas")
    if pandas is None:  # nothing can be a pandas object unless pandas was imported
        return None, None
    return pandas.DataFrame, pandas.Series


def normalise(contexts: Any, column: Optional[Hashable]) -> Contexts:
    """The items and labels of `contexts`; refuses a DataFrame without `column`, `column` on
    anything but a DataFrame, a single str and a mapping (each with a TypeError / KeyError
    saying what to pass instead)."""
    frame_type, series_type = _pandas_types()
    if frame_type is not None and isinstance(contexts, frame_type):
        if column is None:
            raise TypeError(
                "decide_many got a pandas DataFrame: name its text column with column=... "
                f"(columns: {list(contexts.columns)!r})"
            )
        if column not in contexts.columns:
            raise KeyError(
                f"column={column!r} is not a column of the DataFrame (columns: {list(contexts.columns)!r})"
            )
        contexts = contexts[column]
        if frame_type is not None and isinstance(contexts, frame_type):
            raise TypeError(f"column={column!r} names several DataFrame columns (duplicate name)")
    elif column is not None:
        raise TypeError(
            f"column={column!r} applies to a pandas DataFrame only; got {type(contexts).__name__}"
        )
    if series_type is not None and isinstance(contexts, series_type):
        return Contexts(list(contexts.array), list(contexts.index), contexts.index, contexts.name)
    if isinstance(contexts, (str, bytes)):
        raise TypeError(
            "decide_many takes a list of contexts, not a single one: use score(context, ...) "
            "or decide_many([context], ...)"
        )
    if hasattr(contexts, "keys"):
        raise TypeError(
            "decide_many takes a sequence of contexts, not a mapping: pass list(d.values()) "
            "or a pandas Series"
        )
    items = list(contexts)
    return Contexts(items, list(range(len(items))), None, None)


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{type(value).__name__} {text}"


def invalid(contexts: Contexts, errors: str) -> List[InvalidContext]:
    """One InvalidContext per item that is not a str (in order). With errors="raise", raises
    one InvalidContext naming the first bad rows instead, when there is any."""
    if errors not in ERROR_POLICIES:
        raise ValueError(f"errors={errors!r}: expected one of {ERROR_POLICIES}")
    found = []
    for row, (item, label) in enumerate(zip(contexts.items, contexts.labels)):
        if isinstance(item, str):
            continue
        e = InvalidContext(f"row {row} (index {label!r}): expected a str, got {_describe(item)}")
        e.row, e.label = row, label
        found.append(e)
    if found and errors == "raise":
        named = "; ".join(str(e) for e in found[:_NAMED_ROWS])
        more = f"; and {len(found) - _NAMED_ROWS} more" if len(found) > _NAMED_ROWS else ""
        e = InvalidContext(
            f"{len(found)} of {len(contexts.items)} contexts are not a str, nothing was scored "
            f"(errors='keep' scores the others and returns these errors in place): {named}{more}"
        )
        e.rows = [x.row for x in found]
        e.labels = [x.label for x in found]
        e.row, e.label = e.rows[0], e.labels[0]
        raise e
    return found
