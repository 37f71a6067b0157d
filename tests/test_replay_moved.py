"""Traces recorded before issue 15 item 2 name descriptor classes by their old module paths
(``cudnn_compat.cnn``, ``cudnn_compat.rnn_desc``, ...): replay finds each class where it is defined now
(``tools/replay.py`` ``MOVED_MODULES`` and ``descriptor_class``)."""
import importlib
import importlib.util
import json

import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat._core.descriptor import Descriptor
from cudnn_compat.tools import replay
from conftest import tdesc
from conv_util import cdesc, fdesc, out_shape

XS, WS, PAD = (2, 3, 5, 5), (4, 3, 3, 3), (1, 1)
YS = out_shape(XS, WS, PAD, (1, 1), (1, 1))


@pytest.mark.parametrize("old,new", sorted(replay.MOVED_MODULES.items()))
def test_every_moved_path_is_gone_and_its_new_one_imports(old, new):
    assert importlib.util.find_spec(old) is None, f"{old} still imports: drop it from MOVED_MODULES"
    try:
        importlib.import_module(new)
    except ImportError as e:  # an optional dependency (CuPy) missing, not a wrong path
        assert importlib.util.find_spec(new) is not None, e


@pytest.mark.parametrize("module,name,defined_in", [
    ("cudnn_compat.cnn", "ConvolutionDescriptor", "cudnn_compat.convolution"),
    ("cudnn_compat.rnn_desc", "RNNDescriptor", "cudnn_compat.rnn"),
    ("cudnn_compat.rnn", "RNNDataDescriptor", "cudnn_compat.rnn"),  # imports, but the class is not on it
    ("cudnn_compat.backend_api", "BackendDescriptor", "cudnn_compat.graph_api"),
    ("cudnn_compat._descriptor", "Descriptor", "cudnn_compat._core.descriptor"),
    ("cudnn_compat.tensor", "TensorDescriptor", "cudnn_compat.tensor"),  # never moved
    ("cudnn_compat.no_such_module", "SeqDataDescriptor", "cudnn_compat.attention"),  # found by search
])
def test_old_module_paths_resolve_to_the_class_defined_now(module, name, defined_in):
    cls = replay.descriptor_class(module, name)
    assert cls.__name__ == name and issubclass(cls, Descriptor)
    assert cls.__module__.startswith(defined_in)
    assert getattr(importlib.import_module(cls.__module__), name) is cls


def test_unknown_class_is_unreplayable():
    with pytest.raises(replay.Unreplayable, match="NoSuchDescriptor"):
        replay.descriptor_class("cudnn_compat.cnn", "NoSuchDescriptor")


def test_trace_naming_old_modules_replays(tmp_path, rng, handle, monkeypatch):
    """A convolution recorded now, its descriptors' modules rewritten to the paths of before the move."""
    path = tmp_path / "old.jsonl"
    xd, wd, cd, yd = tdesc(XS), fdesc(WS), cdesc(PAD), tdesc(YS)
    x, w = rng.standard_normal(XS).astype(np.float32), rng.standard_normal(WS).astype(np.float32)
    y = np.zeros(YS, np.float32)
    monkeypatch.setenv("CUDNN_COMPAT_ENGINE", "reference")  # recorded on the engine it replays on
    with cc.trace(str(path), tensors=True):
        cc.cudnnConvolutionForward(handle, 1.0, xd, x, wd, w, cd, 0, None, 0, 0.0, yd, y)
    monkeypatch.delenv("CUDNN_COMPAT_ENGINE")
    # a moved module (MOVED_MODULES), and one that no table knows (found by searching the package)
    old = {"ConvolutionDescriptor": "cudnn_compat.cnn", "FilterDescriptor": "cudnn_compat.split_since"}
    renamed = []

    def rewrite(v):
        if isinstance(v, dict):
            if v.get("descriptor") in old and "module" in v:
                v["module"] = old[v["descriptor"]]
                renamed.append(v["descriptor"])
            for x in v.values():
                rewrite(x)
        elif isinstance(v, list):
            for x in v:
                rewrite(x)

    with open(path) as f:
        lines = [json.loads(s) for s in f]
    rewrite(lines)
    with open(path, "w") as f:
        f.writelines(json.dumps(o) + "\n" for o in lines)
    assert {"ConvolutionDescriptor", "FilterDescriptor"} <= set(renamed)
    (r,) = replay.replay(replay.load(path), "reference")
    assert r.function == "cudnnConvolutionForward" and r.state == "ok", r.note
    for _k, _role, _dtype, cmp, _tol in r.outputs:
        assert cmp["max_abs"] == 0.0
