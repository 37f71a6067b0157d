"""Type stubs, docstrings and the generated API reference (issue 16, items 2 and 3).

* ``cudnn_compat/__init__.pyi`` and ``docs/api.md`` are generated (tools/gen_stubs.py,
  tools/gen_api_docs.py): regenerated in memory, they must equal the checked-in files;
* the stub names exactly the public names of the package, and each legacy function's stub takes
  the Python parameters the function takes;
* every public function and class of ``cudnn_compat`` has a docstring;
* with mypy installed, mypy sees every legacy name (both spellings) through the stub, and the
  examples use no name it cannot see;
* the graph operation kinds the API reference lists for a function are the ones its calls build.
"""
from __future__ import annotations

import ast
import importlib.util
import inspect
import pathlib
import subprocess
import sys
import types

import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat._core import call as _call, registry as _registry
from cudnn_compat._core.registry import LEGACY

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import gen_api_docs  # noqa: E402
import gen_stubs  # noqa: E402

STUB = ROOT / "cudnn_compat" / "__init__.pyi"
HAVE_MYPY = importlib.util.find_spec("mypy") is not None


def _stub_tree() -> ast.Module:
    return ast.parse(STUB.read_text())


def _stub_defs() -> dict:
    """Top-level name -> AST node of the checked-in stub."""
    out = {}
    for node in _stub_tree().body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = node
    return out


def test_stub_is_current():
    assert STUB.read_text() == gen_stubs.render(), \
        "cudnn_compat/__init__.pyi is stale: run python tools/gen_stubs.py"


def test_api_reference_is_current():
    assert (ROOT / "docs" / "api.md").read_text() == gen_api_docs.render(), \
        "docs/api.md is stale: run python tools/gen_api_docs.py"


def test_stub_names_every_public_name_and_nothing_else():
    runtime = set(gen_stubs.public_names())
    stub = {k for k in _stub_defs() if not k.startswith("_")}
    assert len(runtime) > 1000
    assert runtime - stub == set(), "public names missing from the stub"
    assert stub - runtime == set(), "stub names that cudnn_compat does not have"
    # every legacy function under both spellings, and every C-spelled CuPy 13 alias
    defs = _stub_defs()
    for name in list(cc.exported()) + list(LEGACY):
        assert isinstance(defs[name], ast.FunctionDef), name


def test_stub_parameters_match_the_functions():
    defs = _stub_defs()
    checked = 0
    for name, value in gen_stubs.public_names().items():
        if getattr(value, "c_name", None) not in LEGACY:
            continue
        fn = inspect.unwrap(value)
        want = [p.name for p in inspect.signature(fn).parameters.values()]
        node = defs[name]
        a = node.args
        got = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
        got += [a.vararg.arg] if a.vararg else []
        got += [a.kwarg.arg] if a.kwarg else []
        assert sorted(got) == sorted(want) and got[:len(a.args)] == want[:len(a.args)], name
        doc = ast.get_docstring(node)  # the reference entry help() shows (tests/test_docstrings.py)
        assert doc == inspect.cleandoc(value.__doc__), f"{name}: the stub's docstring is not the function's"
        checked += 1
    assert checked >= 2 * len(LEGACY)


@pytest.mark.parametrize("name, params, ret", [
    ("cudnnConvolutionForward", {"handle": "_Handle | int", "alpha": "float", "x": "_Buffer", "algo": "int",
                                 "workSpaceSizeInBytes": "int", "convDesc": "_ConvolutionDescriptor | int"}, "None"),
    ("cudnnSetTensorNdDescriptor", {"dimA": "_IntArray", "nbDims": "int", "dataType": "int"}, "None"),
    ("cudnnGetTensor4dDescriptor", {"tensorDesc": "_TensorDescriptor | int"}, "tuple[" + ", ".join(["int"] * 9) + "]"),
    ("cudnnGetLRNDescriptor", {}, "tuple[int, float, float, float]"),
    ("cudnnCreateTensorDescriptor", {}, "_TensorDescriptor"),
    ("cudnnGetConvolutionForwardWorkspaceSize", {"wDesc": "_FilterDescriptor | int"}, "int"),
    ("cudnnSetActivationDescriptor", {"coef": "float", "mode": "int"}, "None"),
    ("cudnnFindConvolutionForwardAlgorithm", {"requestedAlgoCount": "int"}, "list[CuDNNAlgoPerf]"),
    ("cudnnRNNForward", {"rnnDesc": "_RNNDescriptor | int", "xDesc": "_RNNDataDescriptor | int",
                         "weightSpaceSize": "int"}, "None"),
    ("cudnnCreate", {"place": "str | None"}, "_Handle"),
])
def test_stub_types(name, params, ret):
    node = _stub_defs()[name]
    ann = {a.arg: ast.unparse(a.annotation) for a in node.args.args}
    for p, t in params.items():
        assert ann[p] == t, (name, p)
    assert ast.unparse(node.returns) == ret


def _matches(value, ann: str) -> bool:
    """Whether a returned value fits a stub annotation (the few forms the generator writes)."""
    if ann == "Any":
        return True
    if ann == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if ann == "float":
        return isinstance(value, float)
    if ann == "float | None":
        return value is None or isinstance(value, float)
    if ann == "list[int]":
        return isinstance(value, list) and all(isinstance(v, int) for v in value)
    if ann.startswith("_") and " " not in ann:
        return type(value).__name__ == ann[1:]
    raise AssertionError(f"no rule for {ann}")


def _split(ann: str) -> list:
    """'tuple[int, list[int], float | None]' -> ['int', 'list[int]', 'float | None']."""
    inner, depth, cur, out = ann[len("tuple["):-1], 0, "", []
    for ch in inner:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return out + [cur.strip()]


def test_stub_return_types_are_what_the_getters_return():
    """Call getters and compare each returned value with the stub's return annotation (tuple arity
    and element types), so a return type that the out-parameters do not describe is caught."""
    h = cc.cudnnCreate("cpu")
    t = cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensor4dDescriptor(t, cc.CUDNN_TENSOR_NCHW, cc.CUDNN_DATA_FLOAT, 1, 2, 5, 6)
    f = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(f, cc.CUDNN_DATA_FLOAT, cc.CUDNN_TENSOR_NCHW, 2, 2, 3, 3)
    cv = cc.cudnnCreateConvolutionDescriptor()
    cc.cudnnSetConvolution2dDescriptor(cv, 1, 1, 1, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION, cc.CUDNN_DATA_FLOAT)
    a = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(a, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    p = cc.cudnnCreatePoolingDescriptor()
    cc.cudnnSetPoolingNdDescriptor(p, cc.CUDNN_POOLING_MAX, cc.CUDNN_NOT_PROPAGATE_NAN, 2, [2, 2], [0, 0], [1, 1])
    o = cc.cudnnCreateOpTensorDescriptor()
    cc.cudnnSetOpTensorDescriptor(o, cc.CUDNN_OP_TENSOR_ADD, cc.CUDNN_DATA_FLOAT, cc.CUDNN_NOT_PROPAGATE_NAN)
    calls = {
        "cudnnCreate": ("cpu",), "cudnnCreateTensorDescriptor": (), "cudnnGetVersion": (),
        "cudnnGetTensor4dDescriptor": (t,), "cudnnGetTensorNdDescriptor": (t, 4), "cudnnGetTensorSizeInBytes": (t,),
        "cudnnGetFilter4dDescriptor": (f,), "cudnnGetFilterNdDescriptor": (f, 4),
        "cudnnGetConvolution2dDescriptor": (cv,), "cudnnGetConvolutionNdDescriptor": (cv, 2),
        "cudnnGetConvolution2dForwardOutputDim": (cv, t, f), "cudnnGetConvolutionNdForwardOutputDim": (cv, t, f, 4),
        "cudnnGetConvolutionForwardWorkspaceSize": (h, t, f, cv, t, 0),
        "cudnnGetLRNDescriptor": (cc.cudnnCreateLRNDescriptor(),), "cudnnGetActivationDescriptor": (a,),
        "cudnnGetPoolingNdDescriptor": (p, 2), "cudnnGetPoolingNdForwardOutputDim": (p, t, 4),
        "cudnnGetPooling2dForwardOutputDim": (p, t), "cudnnGetOpTensorDescriptor": (o,),
        "cudnnGetActivationDescriptorSwishBeta": (a,), "cudnnGetErrorString": (0,),
    }
    defs = _stub_defs()
    for name, args in calls.items():
        value = LEGACY[name](*args)
        ann = ast.unparse(defs[name].returns)
        if ann.startswith("tuple["):
            parts = _split(ann)
            assert isinstance(value, tuple) and len(value) == len(parts), (name, ann, value)
            assert all(_matches(v, t_) for v, t_ in zip(value, parts)), (name, ann, value)
        elif ann == "str":
            assert isinstance(value, str), name
        else:
            assert _matches(value, ann), (name, ann, value)


def _public_callables() -> dict:
    out = {}
    for k, v in vars(cc).items():
        if k.startswith("_") or (isinstance(v, types.ModuleType) and not callable(v)):
            continue
        if callable(v):
            out[k] = v
    return out


def test_every_public_function_has_a_docstring():
    items = _public_callables()
    assert len(items) > 550
    missing = sorted(k for k, v in items.items() if not (inspect.getdoc(v) or "").strip())
    assert missing == [], f"public functions without a docstring: {missing}"
    # the registry's own functions, unwrapped (functools.wraps copies the docstring)
    bare = sorted(c for c, f in LEGACY.items() if not (inspect.unwrap(f).__doc__ or "").strip())
    assert bare == []


def test_docstrings_of_the_v8_rnn_setters_cite_002():
    for name in ("cudnnRNNForward", "cudnnSetRNNDescriptor_v8", "cudnnSetRNNBiasMode", "cudnnSetRNNPaddingMode",
                 "cudnnSetRNNMatrixMathType", "cudnnDropoutForward", "cudnnSetTensor4dDescriptor"):
        assert "002 §" in LEGACY[name].__doc__, name


# -- mypy --------------------------------------------------------------------------------------------

def _mypy(paths, tmp_path) -> "tuple[int, str]":
    proc = subprocess.run([sys.executable, "-m", "mypy", "--follow-imports=silent", "--ignore-missing-imports",
                           "--no-error-summary", "--cache-dir", str(tmp_path / ".mypy_cache"), *map(str, paths)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.skipif(not HAVE_MYPY, reason="mypy not installed (pip install mypy)")
def test_mypy_sees_every_legacy_name(tmp_path):
    names = sorted(set(cc.exported()) | set(LEGACY) | {k for k, v in _public_callables().items()})
    lines = ["import cudnn_compat", "from typing import Any", "", "def use(x: Any) -> None: ...", ""]
    lines += [f"use(cudnn_compat.{n})" for n in names]
    lines += ["h = cudnn_compat.cudnnCreate('cpu')",
              "d = cudnn_compat.cudnnCreateTensorDescriptor()",
              "cudnn_compat.cudnnSetTensor4dDescriptor(d, cudnn_compat.CUDNN_TENSOR_NCHW, "
              "cudnn_compat.CUDNN_DATA_FLOAT, 1, 2, 3, 4)",
              "t: tuple[int, int, int, int, int, int, int, int, int] = cudnn_compat.cudnnGetTensor4dDescriptor(d)",
              "n: int = cudnn_compat.cudnnGetTensorSizeInBytes(d)", ""]
    good = tmp_path / "every_name.py"
    good.write_text("\n".join(lines))
    # the control: names that do not exist and a wrong arity are errors (the check can fail)
    bad = tmp_path / "bad_names.py"
    bad.write_text("import cudnn_compat\ncudnn_compat.cudnnNoSuchFunction(1)\ncudnn_compat.convolutionForwardX\n"
                   "cudnn_compat.cudnnSetTensor4dDescriptor(1)\n")
    rc, out = _mypy([good, bad, STUB], tmp_path)
    errors = [ln for ln in out.splitlines() if ": error:" in ln]
    assert [e for e in errors if "every_name.py" in e or "__init__.pyi" in e] == [], out[-3000:]
    assert sum("bad_names.py" in e for e in errors) == 3, out[-3000:]


@pytest.mark.skipif(not HAVE_MYPY, reason="mypy not installed (pip install mypy)")
def test_mypy_on_examples_finds_every_cudnn_compat_name(tmp_path):
    rc, out = _mypy([ROOT / "examples"], tmp_path)
    missing = [ln for ln in out.splitlines() if "cudnn_compat" in ln and "has no attribute" in ln]
    assert missing == [], "\n".join(missing)
    assert "Cannot find implementation or library stub" not in out or "cudnn_compat" not in out


# -- the API reference's operation kinds --------------------------------------------------------------

@pytest.fixture
def recorded_kinds():
    """Record, per legacy function, the graph operation kinds of the plans its calls execute."""
    seen: dict = {}

    def hook(proceed, c_name, args, kwargs):
        before = _call.last_plan()
        try:
            return proceed(args, kwargs)
        finally:
            after = _call.last_plan()
            if after is not None and after is not before:
                seen.setdefault(c_name, set()).update(op.kind for op in after.graph.ops)

    _registry.HOOKS.append(hook)
    try:
        yield seen
    finally:
        _registry.HOOKS.remove(hook)


def test_api_reference_operation_kinds_are_the_graphs_built(recorded_kinds):
    from cudnn_compat.tools import demo
    demo.run("cpu")  # convolution, bias, activation, pooling, batch norm, softmax
    h = cc.cudnnCreate("cpu")
    d = cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensor4dDescriptor(d, cc.CUDNN_TENSOR_NCHW, cc.CUDNN_DATA_FLOAT, 2, 3, 4, 5)
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    y = np.zeros_like(x)
    cc.cudnnScaleTensor(h, d, y, 2.0)
    cc.cudnnSoftmaxBackward(h, cc.CUDNN_SOFTMAX_ACCURATE, cc.CUDNN_SOFTMAX_MODE_CHANNEL, 1.0, d, x, d, x, 0.0, d, y)
    lrn = cc.cudnnCreateLRNDescriptor()
    cc.cudnnLRNCrossChannelForward(h, lrn, cc.CUDNN_LRN_CROSS_CHANNEL_DIM1, 1.0, d, x, 0.0, d, y)
    assert len(recorded_kinds) >= 8, recorded_kinds
    for name, kinds in recorded_kinds.items():
        table = set(gen_api_docs.OP_KINDS.get(name, ()))
        assert kinds <= table, f"{name} built {sorted(kinds)}; docs/api.md (OP_KINDS) lists {sorted(table)}"
        # the reference engine ran it on the CPU place: the page must list it for these kinds
        assert "reference" in [e for e, _ in gen_api_docs.engines_for(table)], name


def test_engines_follow_what_the_engines_declare():
    e = gen_api_docs.engines_for
    assert [n for n, _ in e(("ConvolutionForward", "Pointwise"))] == ["reference", "cupy", "cudnn"]
    assert [n for n, _ in e(("Softmax", "Pointwise"))] == ["reference", "cupy"]
    assert [n for n, _ in e(("Pointwise",))] == ["reference", "cupy"]  # no pure pointwise graphs in cudnn
    assert [n for n, _ in e(("CTCLoss",))] == ["reference", "cupy"]  # cupy_engine/ctc.py (issue 18)
    assert e(("NoSuchKind",)) == []


def test_api_reference_lists_every_function_with_its_statuses():
    text = (ROOT / "docs" / "api.md").read_text()
    for name in LEGACY:
        assert f"\n### {name}\n" in text, name
    rules = gen_api_docs.status_rules()
    assert len(rules) > 40
    section = text.split("\n### cudnnSetTensor4dDescriptor\n")[1].split("\n### ")[0]
    assert "`CUDNN_STATUS_BAD_PARAM`: a dimension is zero or negative" in section
    assert "**Engines** none" in section
