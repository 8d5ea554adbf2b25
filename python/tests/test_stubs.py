"""The type stubs (forkscore/__init__.pyi) against the runtime package, so they cannot drift:
every name, every Scorer method's parameters (names, kinds, defaults), the option keywords
the Python layer passes to the native binding, and the Literal values of Mode / ScoringMethod
against the values the binding accepts."""

import ast
import inspect
import re
from pathlib import Path

import pytest

import forkscore
from forkscore import _native

STUB = Path(forkscore.__file__).with_name("__init__.pyi")
KINDS = {
    "posonlyargs": inspect.Parameter.POSITIONAL_ONLY,
    "args": inspect.Parameter.POSITIONAL_OR_KEYWORD,
    "kwonlyargs": inspect.Parameter.KEYWORD_ONLY,
}


@pytest.fixture(scope="module")
def stub():
    return ast.parse(STUB.read_text())


def stub_default(node):
    """A stub default as a value: literals, and names of the package's constants."""
    if isinstance(node, ast.Name):
        return getattr(forkscore, node.id)
    return ast.literal_eval(node)


def stub_parameters(fn: ast.AST):
    """(name, kind, default or inspect.Parameter.empty) of a stub function, `self`/`cls` dropped."""
    a = fn.args
    out = []
    positional = a.posonlyargs + a.args
    defaults = [inspect.Parameter.empty] * (len(positional) - len(a.defaults)) + [
        stub_default(d) for d in a.defaults
    ]
    for arg, default in zip(positional, defaults):
        kind = KINDS["posonlyargs"] if arg in a.posonlyargs else KINDS["args"]
        out.append((arg.arg, kind, default))
    if a.vararg:
        out.append((a.vararg.arg, inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.empty))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        out.append((arg.arg, KINDS["kwonlyargs"],
                    inspect.Parameter.empty if default is None else stub_default(default)))
    if a.kwarg:
        out.append((a.kwarg.arg, inspect.Parameter.VAR_KEYWORD, inspect.Parameter.empty))
    return [p for p in out if p[0] not in ("self", "cls")]


def runtime_parameters(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()
            if p.name not in ("self", "cls")]


def literal_values(stub, name):
    for node in stub.body:
        if isinstance(node, ast.Assign) and node.targets[0].id == name:
            return {ast.literal_eval(e) for e in node.value.slice.elts}
    raise AssertionError(f"{name} not in the stub")


def test_every_public_name_is_in_the_stub_and_nothing_else(stub):
    stubbed = {n.name for n in stub.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    stubbed |= {n.target.id for n in stub.body if isinstance(n, ast.AnnAssign)}
    public = set(forkscore.__all__)
    assert public <= stubbed, public - stubbed
    for name in stubbed:
        assert hasattr(forkscore, name), f"the stub declares {name}, the package has none"


def test_functions_and_scorer_methods_match_the_runtime(stub):
    checked = 0
    for node in stub.body:
        if isinstance(node, ast.FunctionDef):
            assert stub_parameters(node) == runtime_parameters(getattr(forkscore, node.name)), node.name
            checked += 1
        if isinstance(node, ast.ClassDef) and node.name == "Scorer":
            stubbed = set()
            for item in node.body:
                if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                stubbed.add(item.name)
                runtime = inspect.getattr_static(forkscore.Scorer, item.name)
                if isinstance(runtime, property):
                    assert any(getattr(d, "id", None) == "property" for d in item.decorator_list)
                    continue
                fn = getattr(forkscore.Scorer, item.name)
                assert stub_parameters(item) == runtime_parameters(fn), item.name
                assert isinstance(item, ast.AsyncFunctionDef) == inspect.iscoroutinefunction(fn), item.name
                checked += 1
            public = {n for n in dir(forkscore.Scorer) if not n.startswith("_")}
            assert public <= stubbed, public - stubbed
    assert checked >= 9


@pytest.mark.parametrize("method", ["score", "decide_many", "batch_records"])
def test_python_layer_passes_every_native_option(method):
    """The Python Scorer's keyword options are the native binding's (names and defaults; the
    native signature shows `...` for max_input_tokens, whose default is DEFAULT_MAX_INPUT_TOKENS)."""
    native = {p.name: p.default for p in inspect.signature(getattr(_native.Scorer, method)).parameters.values()
              if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name != "progress"}
    python = {p.name: p.default for p in inspect.signature(getattr(forkscore.Scorer, method)).parameters.values()
              if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert set(native) <= set(python)
    for name, default in native.items():
        expected = forkscore.DEFAULT_MAX_INPUT_TOKENS if default is Ellipsis else default
        assert python[name] == expected, name
    # the load keywords too
    native_load = runtime_parameters(_native.Scorer.load)
    assert [(n, d) for n, _, d in runtime_parameters(forkscore.Scorer.load)] == [(n, d) for n, _, d in native_load]


def accepted_values(scorer, option, message_pattern):
    """The values the binding names as accepted, read from its error for an unknown value."""
    with pytest.raises(forkscore.OptionsError) as e:
        scorer.score("x", {"a": {"type": "boolean"}}, **{option: "no-such-value"})
    expected = re.search(message_pattern, str(e.value)).group(1)
    return {v.strip().strip('"') for v in re.split(r",| or ", expected) if v.strip()}


def test_literals_are_what_the_binding_accepts(stub, scorer):
    modes = literal_values(stub, "Mode")
    assert modes == accepted_values(scorer, "mode", r"expected ([^)]*)\)")
    methods = literal_values(stub, "ScoringMethod")
    assert methods == accepted_values(scorer, "scoring", r"expected ([^)]*)\)")
    for mode in modes:
        assert scorer.score("Is it down?", {"a": {"type": "boolean"}}, mode=mode)["provenance"]["mode"]
    with pytest.raises(forkscore.OptionsError, match="grouped, direct or serial"):
        scorer.batch_records([], batch_mode="no-such-mode")
    assert literal_values(stub, "BatchMode") == {"grouped", "direct", "serial"}
    assert literal_values(stub, "ErrorPolicy") == set(forkscore._inputs.ERROR_POLICIES)
