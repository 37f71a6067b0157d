"""Check names are a closed set: every name raised is a row of ``cudnn_compat/_backend/rules.py`` (issue 15).

The graph layer raises ``GraphError(check, message, status)`` (directly, or through
``ops._common.fail(index, op, check, message, status)``) and the backend API raises
``backend_ops.fail(status, attribute, check, message)``.  This file walks the source of
``cudnn_compat/`` and ``cudnn_compat/_backend/`` with ``ast`` and fails on:
  * a call site whose check name is a string literal that is not a row of ``RULES``;
  * a call site whose check name is computed, unless it passes on a name checked where it was made
    (``e.check`` of a caught error, the raise helper's own ``check`` parameter) or is one of the
    ``DYNAMIC`` expressions below, each with the names it can take;
  * a call site whose status (when the source says it) is not one its row gives;
  * a row that no call site raises;
and checks that the raise helpers reject an unknown name at run time and that the "Check names"
section of docs/status_rules.md is what tools/gen_status_rules.py makes from the table.
"""
from __future__ import annotations

import ast
import pathlib
import sys
from typing import NamedTuple

import pytest

import cudnn_compat as cc
from cudnn_compat.graph_api import operations as backend_ops
from cudnn_compat._backend import rules
from cudnn_compat._backend.ir import GraphError, Operation, Tensor
from cudnn_compat._backend.ops import validate_op

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import gen_status_rules  # noqa: E402

PACKAGES = ("cudnn_compat",)  # cudnn_compat/_backend: the graph layer
RAISERS = {"GraphError": 0, "fail": 2}  # callee -> position of the check name (keyword ``check``)
STATUS_ALIASES = {"BAD": "BAD_PARAM", "NOT_SUP": "NOT_SUPPORTED"}  # backend_ops' names of the ints

# Computed check names (the expression as ``ast.unparse`` writes it) -> every name it can take.
DYNAMIC = {
    # backend_ops._fin_conv, over CONVOLUTION_{PRE_PADDINGS,POST_PADDINGS,FILTER_STRIDES,DILATIONS}
    "'CONV_' + n.split('_', 1)[1]": {"CONV_PRE_PADDINGS", "CONV_POST_PADDINGS", "CONV_FILTER_STRIDES", "CONV_DILATIONS"},
    # ops/convolution.py, over the attrs pre_padding, post_padding, stride, dilation
    "'CONV_' + name.upper()": {"CONV_PRE_PADDING", "CONV_POST_PADDING", "CONV_STRIDE", "CONV_DILATION"},
    # backend_ops._check_rank_broadcast(..., "POINTWISE"), its only caller
    "check + '_RANK'": {"POINTWISE_RANK"},
    "check + '_BROADCAST'": {"POINTWISE_BROADCAST"},
}


class Site(NamedTuple):
    path: str
    line: int
    name: "str | None"  # the literal check name, None when computed
    expr: str  # the check-name argument as source
    status: "str | None"  # the status the call raises when the source says it
    passthrough: bool  # a name checked where it was made (``e.check``, the helper's own parameter)


def _arg(call: ast.Call, i: int, key: str):
    kw = {k.arg: k.value for k in call.keywords}
    return call.args[i] if len(call.args) > i else kw.get(key)


def _status(call: ast.Call, helper: str, package: str) -> "str | None":
    """GraphError(check, message, status='BAD_PARAM'); _backend's fail(index, op, check, message,
    status='BAD_PARAM'); cudnn_compat's fail(status, attr, check, message) with BAD / NOT_SUP."""
    if helper == "GraphError" or package == "_backend":
        a = _arg(call, 2 if helper == "GraphError" else 4, "status")
        if a is None:
            return "BAD_PARAM"
    else:
        a = _arg(call, 0, "status")
    if isinstance(a, ast.Constant) and isinstance(a.value, str):
        return a.value
    if isinstance(a, ast.Name):
        return STATUS_ALIASES.get(a.id)
    return None


def walk(source: str, path: str = "cudnn_compat/x.py") -> list:
    """Every call of a raise helper in ``source`` as a ``Site``; ``path``'s first folder says
    which ``fail`` it is (``_backend``: ops._common.fail; else backend_ops.fail)."""
    parts = pathlib.PurePosixPath(path).parts
    package = "_backend" if parts[:2] == ("cudnn_compat", "_backend") else parts[0]
    out = []

    def visit(node, func):
        if isinstance(node, ast.Call):
            f = node.func
            helper = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if helper in RAISERS:
                a = _arg(node, RAISERS[helper], "check")
                lit = a.value if isinstance(a, ast.Constant) and isinstance(a.value, str) else None
                params = {p.arg for p in func.args.args + func.args.kwonlyargs} if func is not None else set()
                passthrough = lit is None and (
                    (isinstance(a, ast.Attribute) and a.attr == "check")
                    or (isinstance(a, ast.Name) and a.id in params and func.name in RAISERS))
                out.append(Site(path, node.lineno, lit, ast.unparse(a) if a is not None else "", _status(node, helper, package),
                                passthrough))
        for child in ast.iter_child_nodes(node):
            visit(child, node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else func)

    visit(ast.parse(source), None)
    return out


def problems(sites: list, table: dict) -> list:
    """What is wrong with ``sites`` against ``table``: unknown literal names, undeclared computed
    names, statuses the row does not give."""
    out = []
    for s in sites:
        where = f"{s.path}:{s.line}"
        if s.name is not None:
            if s.name not in table:
                out.append(f"{where}: check name {s.name!r} is not a row of cudnn_compat/_backend/rules.py RULES")
            elif s.status is not None and s.status not in table[s.name].statuses:
                out.append(f"{where}: {s.name} raised with {s.status}, its row gives {table[s.name].statuses}")
        elif not s.passthrough:
            if s.expr not in DYNAMIC:
                out.append(f"{where}: computed check name {s.expr!r}: use a literal name of cudnn_compat/_backend/rules.py "
                           f"(or declare the expression in DYNAMIC of tests/test_rule_names.py)")
            else:
                out += [f"{where}: {s.expr!r} can give {n!r}, not a row of cudnn_compat/_backend/rules.py RULES"
                        for n in sorted(DYNAMIC[s.expr] - set(table))]
    return out


def tree_sites() -> list:
    out = []
    for package in PACKAGES:
        for p in sorted((ROOT / package).rglob("*.py")):
            out += walk(p.read_text(), p.relative_to(ROOT).as_posix())
    return out


@pytest.fixture(scope="module")
def sites():
    found = tree_sites()
    assert len(found) > 150, "the walker found too few raise sites: did the raise helpers change names?"
    return found


# -- the walker itself ---------------------------------------------------------------------------

SYNTHETIC = '''
from .ir import GraphError
from .validate import fail

def _rule(i, op):
    fail(i, op, "CONV_GROUPS", "groups must be >= 1")
    fail(i, op, "CONV_GROUPS_NEW", "a free string")
    fail(i, op, "CONV_MODE", "a status its row does not give", "NOT_SUPPORTED")
    fail(i, op, f"CONV_{i}", "computed")
    raise GraphError("BRAND_NEW_CHECK", "a free string", "NOT_SUPPORTED")

def fail(index, op, check, message, status="BAD_PARAM"):
    raise GraphError(check, message, status)

def rewrap(e):
    raise GraphError(e.check, str(e))
'''


def test_walker_flags_a_new_free_string_check_name():
    found = walk(SYNTHETIC, "cudnn_compat/_backend/validate_new.py")
    assert [(s.line, s.name) for s in found] == [(6, "CONV_GROUPS"), (7, "CONV_GROUPS_NEW"), (8, "CONV_MODE"), (9, None),
                                                 (10, "BRAND_NEW_CHECK"), (13, None), (16, None)]
    assert [s.passthrough for s in found] == [False] * 5 + [True, True]
    assert [s.status for s in found][:5] == ["BAD_PARAM", "BAD_PARAM", "NOT_SUPPORTED", "BAD_PARAM", "NOT_SUPPORTED"]
    got = problems(found, rules.RULES)
    assert got == [
        "cudnn_compat/_backend/validate_new.py:7: check name 'CONV_GROUPS_NEW' is not a row of cudnn_compat/_backend/rules.py RULES",
        "cudnn_compat/_backend/validate_new.py:8: CONV_MODE raised with NOT_SUPPORTED, its row gives ('BAD_PARAM',)",
        "cudnn_compat/_backend/validate_new.py:9: computed check name \"f'CONV_{i}'\": use a literal name of cudnn_compat/_backend/rules.py "
        "(or declare the expression in DYNAMIC of tests/test_rule_names.py)",
        "cudnn_compat/_backend/validate_new.py:10: check name 'BRAND_NEW_CHECK' is not a row of cudnn_compat/_backend/rules.py RULES",
    ]


def test_walker_reads_the_backend_api_helper():
    src = 'def f(d):\n    raise fail(NOT_SUP, "CUDNN_ATTR_X", "TENSOR_VECTOR_COUNT", "m")\n' \
          '    raise fail(BAD, "CUDNN_ATTR_X", "TENSOR_VECTOR_COUNT", "m")\n' \
          '    raise fail(NOT_SUP if d else BAD, "a", e.check, "m")\n'
    found = walk(src, "cudnn_compat/backend_new.py")
    assert [(s.name, s.status, s.passthrough) for s in found] == [
        ("TENSOR_VECTOR_COUNT", "NOT_SUPPORTED", False), ("TENSOR_VECTOR_COUNT", "BAD_PARAM", False), (None, None, True)]
    assert problems(found, rules.RULES) == [
        "cudnn_compat/backend_new.py:3: TENSOR_VECTOR_COUNT raised with BAD_PARAM, its row gives ('NOT_SUPPORTED',)"]


# -- the tree against the table ------------------------------------------------------------------

def test_every_raised_check_name_is_a_row(sites):
    bad = problems(sites, rules.RULES)
    assert not bad, f"{len(bad)} raise site(s) outside the table:\n" + "\n".join(bad)


def test_every_row_is_raised(sites):
    used = {s.name for s in sites if s.name} | {n for s in sites if s.expr in DYNAMIC for n in DYNAMIC[s.expr]}
    unused = sorted(set(rules.RULES) - used)
    assert not unused, f"rows of cudnn_compat/_backend/rules.py that no call site raises: {unused}"
    stale = sorted(set(DYNAMIC) - {s.expr for s in sites})
    assert not stale, f"DYNAMIC expressions no call site has any more: {stale}"


def test_rows_are_well_formed():
    statuses = {k[len("CUDNN_STATUS_"):] for k in cc.STATUS}
    for name, r in rules.RULES.items():
        assert name.isupper() and name.replace("_", "").isalnum(), name
        assert r.statuses and set(r.statuses) <= statuses and len(set(r.statuses)) == len(r.statuses), (name, r)
        assert r.meaning and "\n" not in r.meaning and not r.meaning.endswith("."), (name, r)
        assert r.section == "" or (r.section.startswith("§") and all(p.isdigit() for p in r.section[1:].split("."))), (name, r)


# -- the raise helpers at run time ---------------------------------------------------------------

def test_graph_error_rejects_an_unknown_name_or_status():
    assert GraphError("CONV_GROUPS", "m").check == "CONV_GROUPS"
    assert GraphError("TENSOR_DATA_TYPE", "m", "NOT_SUPPORTED").status == "NOT_SUPPORTED"
    with pytest.raises(rules.UnknownRule, match="'NO_SUCH_CHECK' is not a row of cudnn_compat/_backend/rules.py"):
        GraphError("NO_SUCH_CHECK", "m")
    with pytest.raises(rules.UnknownRule, match="CONV_GROUPS raised with status NOT_SUPPORTED"):
        GraphError("CONV_GROUPS", "m", "NOT_SUPPORTED")


def test_backend_fail_rejects_an_unknown_name_or_status():
    e = backend_ops.fail(cc.CUDNN_STATUS_NOT_SUPPORTED, "CUDNN_ATTR_X", "TENSOR_VECTOR_COUNT", "m")
    assert (e.status, e.check) == (cc.CUDNN_STATUS_NOT_SUPPORTED, "TENSOR_VECTOR_COUNT")
    with pytest.raises(rules.UnknownRule, match="'NO_SUCH_CHECK'"):
        backend_ops.fail(cc.CUDNN_STATUS_BAD_PARAM, "CUDNN_ATTR_X", "NO_SUCH_CHECK", "m")
    with pytest.raises(rules.UnknownRule, match="TENSOR_VECTOR_COUNT raised with status BAD_PARAM"):
        backend_ops.fail(cc.CUDNN_STATUS_BAD_PARAM, "CUDNN_ATTR_X", "TENSOR_VECTOR_COUNT", "m")


def _conv_op(**attrs):
    t = {r: Tensor(u, d, (d[1] * 9, 9, 3, 1), "float32") for u, r, d in
         ((1, "x", (1, 2, 3, 3)), (2, "w", (2, 2, 1, 1)), (3, "y", (1, 2, 3, 3)))}
    a = {"mode": "CROSS_CORRELATION", "pre_padding": (0, 0), "post_padding": (0, 0), "stride": (1, 1), **attrs}
    return Operation("ConvolutionForward", {"x": t["x"], "w": t["w"]}, {"y": t["y"]}, a)


@pytest.mark.parametrize("attr, value, check", [("pre_padding", (-1, 0), "CONV_PRE_PADDING"),
                                                ("post_padding", (0, -1), "CONV_POST_PADDING"),
                                                ("stride", (0, 1), "CONV_STRIDE"), ("dilation", (1, 0), "CONV_DILATION")])
def test_computed_graph_check_names_are_rows(attr, value, check):
    validate_op(0, _conv_op())
    with pytest.raises(GraphError) as e:
        validate_op(0, _conv_op(**{attr: value}))
    assert e.value.check == check and check in DYNAMIC["'CONV_' + name.upper()"]


@pytest.mark.parametrize("attr, check", [("PRE_PADDINGS", "CONV_PRE_PADDINGS"), ("POST_PADDINGS", "CONV_POST_PADDINGS"),
                                         ("FILTER_STRIDES", "CONV_FILTER_STRIDES"), ("DILATIONS", "CONV_DILATIONS")])
def test_computed_backend_check_names_are_rows(attr, check):
    vals = {"PRE_PADDINGS": [0, 0], "POST_PADDINGS": [0, 0], "FILTER_STRIDES": [1, 1], "DILATIONS": [1, 1]}
    vals[attr] = [-1, 0] if "PADDINGS" in attr else [0, 1]
    d = cc.cudnnBackendCreateDescriptor(cc.CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)
    for name, typ, v in [("COMP_TYPE", "DATA_TYPE", [cc.CUDNN_DATA_FLOAT]), ("CONV_MODE", "CONVOLUTION_MODE", [cc.CUDNN_CROSS_CORRELATION]),
                         ("SPATIAL_DIMS", "INT64", [2])] + [(k, "INT64", v) for k, v in vals.items()]:
        cc.cudnnBackendSetAttribute(d, getattr(cc, "CUDNN_ATTR_CONVOLUTION_" + name), getattr(cc, "CUDNN_TYPE_" + typ), len(v), v)
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnBackendFinalize(d)
    assert e.value.check == check and check in DYNAMIC["'CONV_' + n.split('_', 1)[1]"]
    cc.cudnnBackendDestroyDescriptor(d)


# -- docs/status_rules.md ------------------------------------------------------------------------

def test_status_rules_check_names_are_current():
    page = gen_status_rules.PAGE.read_text()
    assert page == gen_status_rules.render(), "docs/status_rules.md is stale: run python tools/gen_status_rules.py"
    for name, r in rules.RULES.items():
        assert f"| `{name}` | {', '.join(r.statuses)} |" in page, name


def test_status_rules_generator_appends_and_replaces():
    bare = "# Page\n\nhand-written\n"
    once = gen_status_rules.render(bare)
    assert once.startswith(bare) and once.endswith(gen_status_rules.END + "\n")
    assert gen_status_rules.render(once) == once
    edited = once.replace("| `CONV_GROUPS` |", "| `CONV_GROUPS_OLD` |") + "\n## After\n"
    assert gen_status_rules.render(edited) == once + "\n## After\n"
