"""Every legacy function's docstring is its API-reference entry (issue 23 item 5): what it computes,
each parameter with the Python forms it accepts, what it returns and the statuses it raises, from
the one generator (tools/gen_api_docs.py) that also writes docs/api.md and, through
tools/gen_stubs.py, the stub (tests/test_stubs.py checks the stub carries the same text)."""
from __future__ import annotations

import inspect
import pydoc
import re
import sys
from pathlib import Path

import pytest

import cudnn_compat as cc
from cudnn_compat._core.docstrings import DOCS
from cudnn_compat._core.registry import LEGACY

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import gen_api_docs  # noqa: E402


def test_generated_docstrings_are_current():
    assert (ROOT / "cudnn_compat" / "_core" / "docstrings.py").read_text() == gen_api_docs.render_docstrings(), \
        "cudnn_compat/_core/docstrings.py is stale: run python tools/gen_api_docs.py"


def _sections(doc: str) -> dict:
    """numpydoc section title -> its lines (the text before the first title under '')."""
    out, cur = {"": []}, ""
    lines = doc.splitlines()
    for i, ln in enumerate(lines):
        if i + 1 < len(lines) and lines[i + 1] and set(lines[i + 1]) == {"-"} and len(lines[i + 1]) == len(ln):
            cur = ln
            out[cur] = []
        elif not (ln and set(ln) == {"-"}):
            out[cur].append(ln)
    return out


@pytest.mark.parametrize("c_name", sorted(LEGACY))
def test_docstring_says_what_each_parameter_takes_returns_and_raises(c_name):
    fn = LEGACY[c_name]
    doc = fn.__doc__
    assert doc == DOCS[c_name], "the registry attaches the generated text"
    own = inspect.cleandoc(inspect.unwrap(fn).__doc__)
    assert doc.startswith(own), "it starts with what the function computes (its own docstring)"
    s = _sections(doc)
    assert {"Parameters", "Returns", "Raises"} <= set(s), sorted(s)
    params = inspect.signature(inspect.unwrap(fn)).parameters
    described = {}
    for ln in s["Parameters"]:
        m = re.match(r"^(\*{0,2}\w+)(?: = .*?)? : (.+)$", ln)
        if m:
            described[m.group(1).lstrip("*")] = m.group(2)
    assert list(described) == list(params), "each parameter, in order"
    body = "\n".join(s["Parameters"])
    for name in params:  # each parameter has a line of accepted forms under it
        block = body.split(f"\n{name}", 1)[-1] if not body.startswith(name) else body[len(name):]
        assert re.search(r"\n {4}\S", block), name
    returns = " ".join(s["Returns"]).strip()
    assert returns, "Returns is empty"
    raises = "\n".join(s["Raises"])
    assert raises.lstrip().startswith("CuDNNError")
    statuses = re.findall(r"^ {4}CUDNN_STATUS_([A-Z_]+): (.+)$", raises, re.M)
    assert ("BAD_PARAM" in dict(statuses)) and any("CuDNNArgumentError" in r for r in raises.split("\n")), raises


def test_docstrings_carry_the_status_table_and_the_out_parameters():
    """The rows of docs/status_rules.md and the C out-parameters reach the docstrings."""
    rules = gen_api_docs.status_rules()
    assert len(rules) > 40
    for c_name, rows in rules.items():
        flat = " ".join(LEGACY[c_name].__doc__.split())
        for status, rule in rows:
            assert f"CUDNN_STATUS_{status}: {' '.join(rule.split())}" in flat, (c_name, status, rule)
    doc = cc.cudnnGetConvolution2dForwardOutputDim.__doc__
    assert "tuple[int, int, int, int]: the C out-parameters n, c, h, w." in " ".join(doc.split())
    doc = " ".join(cc.cudnnConvolutionForward.__doc__.split())
    assert "y = alpha*conv(x, w) + beta*y (002 §5.2.10)." in doc
    assert "algo : enum cudnnConvolutionFwdAlgo_t" in doc and "CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM" in doc
    assert "workSpaceSizeInBytes : size_t An integer" in doc and "[0, 2^64-1]" in doc
    assert "alpha : scaling factor" in doc and "ctypes.c_void_p(addr)" in doc
    assert "None: the outputs are written in place." in doc


def test_help_shows_the_reference():
    text = pydoc.render_doc(cc.cudnnConvolutionForward, renderer=pydoc.plaintext)
    for part in ("cudnnConvolutionForward(handle, alpha, xDesc", "Parameters", "workSpaceSizeInBytes : size_t",
                 "Returns", "Raises", "CUDNN_STATUS_NOT_SUPPORTED"):
        assert part in text, part
    assert cc.convolutionForward.__doc__ == cc.cudnnConvolutionForward.__doc__  # the CuPy 13 name


def test_api_page_shows_the_same_forms():
    """docs/api.md's table has the Accepts column the docstring's parameter lines have."""
    text = (ROOT / "docs" / "api.md").read_text()
    section = text.split("\n### cudnnSetTensor4dDescriptor\n")[1].split("\n### ")[0]
    assert "`cudnnSetTensor4dDescriptor(tensorDesc, format, dataType, n, c, h, w)`" in section
    assert "| Parameter | C parameter | Kind | Accepts |" in section
    rules = gen_api_docs.status_rules()
    d = gen_api_docs.function_doc("cudnnSetTensor4dDescriptor", rules)
    for name, _, _, accepts in d["params"]:
        assert accepts.replace("|", "\\|") in section, name
        assert " ".join(accepts[1:].split()) in " ".join(cc.cudnnSetTensor4dDescriptor.__doc__.split()), name
