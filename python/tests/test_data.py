"""decide_many for data work (lists, tuples, pandas Series and DataFrame columns, items that
are not a str, progress), the async methods, ask() and to_dataframe(), on the demo checkpoint."""

import asyncio
import math

import pandas as pd
import pytest

import forkscore
from conftest import without_timings

DOWN = "Our production payment service is completely down for every customer."
ONE = "A single user cannot log in."
SCHEMA = {"risk": {"type": "enum", "choices": ["low", "high"]}, "review": {"type": "boolean"}}


def plain(results):
    return [without_timings(r) for r in results]


def same_decisions(got, expected):
    """Same labels and provenance, probabilities within f32 noise: a context merged into a
    different group (another order) moves its logits by ~1e-6."""
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g["output"] == e["output"]
        assert g["provenance"] == e["provenance"]
        for name, field in e["fields"].items():
            assert g["fields"][name]["scores"] == pytest.approx(field["scores"], abs=1e-5)


@pytest.fixture(scope="module")
def reference(scorer):
    """decide_many over a plain list: what every other input shape must give."""
    return scorer.decide_many([DOWN, ONE, DOWN + " Again."], SCHEMA)


def test_list_and_tuple_give_the_same_results(scorer, reference):
    assert isinstance(reference, list) and len(reference) == 3
    assert plain(scorer.decide_many((DOWN, ONE, DOWN + " Again."), SCHEMA)) == plain(reference)
    assert plain(scorer.decide_many(iter([DOWN, ONE, DOWN + " Again."]), SCHEMA)) == plain(reference)


def test_series_keeps_its_order_index_and_name(scorer, reference):
    texts = pd.Series([DOWN + " Again.", DOWN, ONE], index=["c", "a", "b"], name="text")
    out = scorer.decide_many(texts, SCHEMA)
    assert isinstance(out, pd.Series)
    assert list(out.index) == ["c", "a", "b"] and out.name == "text"
    same_decisions(out.tolist(), [reference[2], reference[0], reference[1]])


def test_dataframe_needs_a_column(scorer, reference):
    df = pd.DataFrame({"id": [10, 11, 12], "text": [DOWN, ONE, DOWN + " Again."]},
                      index=[7, 8, 9])
    with pytest.raises(TypeError, match=r"DataFrame: name its text column with column=.*'id', 'text'"):
        scorer.decide_many(df, SCHEMA)
    with pytest.raises(KeyError, match="'body' is not a column"):
        scorer.decide_many(df, SCHEMA, column="body")
    out = scorer.decide_many(df, SCHEMA, column="text")
    assert list(out.index) == [7, 8, 9]
    assert plain(out.tolist()) == plain(reference)
    df["result"] = out  # aligns by index
    assert df.loc[8, "result"]["output"] == reference[1]["output"]
    with pytest.raises(TypeError, match="column= applies to a pandas DataFrame only|applies to a pandas DataFrame only"):
        scorer.decide_many([DOWN], SCHEMA, column="text")


def test_single_str_and_mapping_are_refused(scorer):
    with pytest.raises(TypeError, match="not a single one"):
        scorer.decide_many(DOWN, SCHEMA)
    with pytest.raises(TypeError, match="not a mapping"):
        scorer.decide_many({"a": DOWN}, SCHEMA)


def test_non_str_items_raise_naming_rows_before_scoring(scorer):
    texts = pd.Series([DOWN, float("nan"), ONE, None], index=["a", "b", "c", "d"])
    calls = []
    with pytest.raises(forkscore.InvalidContext) as e:
        scorer.decide_many(texts, SCHEMA, progress=lambda d, t: calls.append(d))
    assert isinstance(e.value, ValueError) and isinstance(e.value, forkscore.ContextError)
    assert e.value.rows == [1, 3] and e.value.labels == ["b", "d"]
    assert "row 1 (index 'b'): expected a str, got float nan" in str(e.value)
    assert "row 3 (index 'd')" in str(e.value)
    assert "2 of 4 contexts" in str(e.value)
    assert e.value.kind == "invalid_context"
    assert calls == []  # nothing was scored
    with pytest.raises(forkscore.InvalidContext, match=r"row 1 \(index 1\): expected a str, got int 5"):
        scorer.decide_many([DOWN, 5], SCHEMA)
    with pytest.raises(ValueError, match="errors='skip'"):
        scorer.decide_many([DOWN], SCHEMA, errors="skip")


def test_non_str_items_kept_in_place(scorer, reference):
    texts = pd.Series([DOWN, float("nan"), ONE, "", None], index=list("abcde"))
    out = scorer.decide_many(texts, SCHEMA, errors="keep")
    same_decisions([out["a"], out["c"]], reference[:2])
    for label, row in (("b", 1), ("e", 4)):
        assert isinstance(out[label], forkscore.InvalidContext)
        assert (out[label].row, out[label].label) == (row, label)
    # an engine error returned in place names its row too
    assert isinstance(out["d"], forkscore.EmptyContext)
    assert (out["d"].row, out["d"].label) == (3, "d")


def test_progress_callable_moves_per_group_and_changes_nothing(scorer):
    # 100 boolean fields are 100 rows per context: the CPU group budget (1,024 rows) takes 10
    # contexts, so 11 contexts are two groups and progress moves between them
    schema = {f"f{i}": {"type": "boolean"} for i in range(100)}
    texts = [f"{DOWN} Ticket {i}." for i in range(11)]
    calls = []
    watched = scorer.decide_many(texts, schema, progress=lambda done, total: calls.append((done, total)))
    unwatched = scorer.decide_many(texts, schema)
    assert plain(watched) == plain(unwatched)  # same groups, same floats
    assert [c[1] for c in calls] == [11] * len(calls)
    done = [c[0] for c in calls]
    assert done == sorted(done) and done[-1] == 11, calls
    assert any(0 < d < 11 for d in done), calls  # it moved before the end
    sizes = sorted({r["telemetry"]["group"]["size"] for r in watched})
    assert len(sizes) == 2 and max(sizes) < 11, sizes


def test_progress_counts_kept_errors_and_reaches_the_end(scorer):
    calls = []
    scorer.decide_many([None, DOWN], SCHEMA, errors="keep", progress=lambda d, t: calls.append((d, t)))
    assert calls[0] == (1, 2) and calls[-1] == (2, 2)
    calls.clear()
    scorer.decide_many([None], SCHEMA, errors="keep", progress=lambda d, t: calls.append((d, t)))
    assert calls == [(1, 1)]


def test_progress_bar_and_a_failing_callback(scorer, capsys):
    pytest.importorskip("tqdm")
    out = scorer.decide_many([DOWN, ONE], SCHEMA, progress=True)
    assert len(out) == 2
    assert "2/2" in capsys.readouterr().err

    def boom(done, total):
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        scorer.decide_many([DOWN], SCHEMA, progress=boom)
    with pytest.raises(TypeError, match="progress="):
        scorer.decide_many([DOWN], SCHEMA, progress="yes")


def test_progress_true_without_tqdm_says_so(scorer, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_tqdm(name, *args, **kwargs):
        if name.startswith("tqdm"):
            raise ImportError("no tqdm here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    with pytest.raises(ImportError, match="pip install tqdm"):
        scorer.decide_many([DOWN], SCHEMA, progress=True)


def test_async_variants_equal_the_blocking_calls(scorer, reference):
    async def main():
        many, one, answer = await asyncio.gather(
            scorer.adecide_many([DOWN, ONE, DOWN + " Again."], SCHEMA),
            scorer.ascore(ONE, SCHEMA),
            scorer.aask(DOWN, "Is this urgent?"),
        )
        return many, one, answer

    many, one, answer = asyncio.run(main())
    assert plain(many) == plain(reference)
    assert without_timings(one) == without_timings(scorer.score(ONE, SCHEMA))
    assert answer.value == scorer.ask(DOWN, "Is this urgent?").value


def test_async_leaves_the_event_loop_running(scorer):
    """While adecide_many runs in the executor (GIL released), the loop runs other tasks."""
    texts = [DOWN * 5 + f" ({i})" for i in range(8)]

    async def main():
        ticks = 0
        task = asyncio.ensure_future(scorer.adecide_many(texts, SCHEMA, mode="independent"))
        while not task.done():
            ticks += 1
            await asyncio.sleep(0)
        return ticks, await task

    ticks, results = asyncio.run(main())
    assert len(results) == 8 and ticks > 10, ticks


def test_ask_with_choices(scorer):
    answer = scorer.ask(DOWN, "How urgent is this?", ["low", "high"])
    full = scorer.score(DOWN, {"answer": {"type": "enum", "choices": ["low", "high"],
                                          "description": "How urgent is this?"}})
    assert answer.value == full["output"]["answer"] in ("low", "high")
    assert answer.probabilities == full["fields"]["answer"]["scores"]
    assert set(answer.probabilities) == {"low", "high"}
    assert math.isclose(sum(answer.probabilities.values()), 1.0, abs_tol=1e-9)
    value, probabilities, result = answer
    assert result["output"] == {"answer": value}


def test_ask_yes_no_is_a_boolean(scorer):
    answer = scorer.ask(DOWN, "Does this need a human now?", temperature=0.5)
    assert isinstance(answer.value, bool)
    assert len(answer.probabilities) == 2
    assert answer.result["temperature"]["value"] == 0.5
    assert forkscore.ask_schema("Q?") == {"answer": {"type": "boolean", "description": "Q?"}}
    with pytest.raises(TypeError, match="not a single str"):
        scorer.ask(DOWN, "Q?", "low")
    with pytest.raises(ValueError, match="non-empty question"):
        scorer.ask(DOWN, "  ")
    with pytest.raises(forkscore.SchemaError) as e:
        scorer.ask(DOWN, "Q?", ["low", "low"])
    assert e.value.path.startswith("answer")


def test_to_dataframe_flattens_results_and_keeps_errors(scorer):
    texts = pd.Series([DOWN, "", ONE], index=["x", "y", "z"])
    out = scorer.decide_many(texts, SCHEMA)
    df = forkscore.to_dataframe(out)
    assert list(df.index) == ["x", "y", "z"]
    assert list(df.columns) == ["risk", "risk.p.low", "risk.p.high", "review",
                                "review.p.false", "review.p.true", "error", "error_kind"]
    for label in ("x", "z"):
        fields = out[label]["fields"]
        assert df.loc[label, "risk"] == fields["risk"]["value"]
        assert df.loc[label, "review"] == fields["review"]["value"]
        for choice, p in fields["risk"]["scores"].items():
            assert df.loc[label, f"risk.p.{choice}"] == p
        assert pd.isna(df.loc[label, "error"]) and pd.isna(df.loc[label, "error_kind"])
    assert df.loc["y", "error_kind"] == "empty_context"
    assert "empty" in df.loc["y", "error"]
    assert pd.isna(df.loc["y", "risk.p.low"])
    # a list gets 0..n-1; one score() result is one row
    assert list(forkscore.to_dataframe(out.tolist()).index) == [0, 1, 2]
    assert len(forkscore.to_dataframe(out["x"])) == 1
    with pytest.raises(TypeError, match="to_dataframe takes results"):
        forkscore.to_dataframe(["not a result"])
