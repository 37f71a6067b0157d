"""One configuration module, engines that register themselves (issue 15, item 5).

* No module of the package reads the process environment except ``cudnn_compat/_backend/config.py``: every
  .py file of ``cudnn_compat/`` and the repository's ``cudnn_compat/_backend/`` is tokenized and any code
  token naming ``environ``/``getenv``/``putenv``/``unsetenv`` (or such a name as a string, as in
  ``getattr(os, "environ")``) fails, outside config.py and the shim's .pth source text.
* ``config.override`` stands in for the environment for a block (replay --engine) and every
  reader honours it: ``get``, ``getter``, ``setting``, ``unset_fast`` and so the planner's cached
  fast path; the environment itself is untouched.
* ``heuristics.ORDER`` and replay's engine list come from the priorities the engines register.
"""
import io
import os
import pathlib
import threading
import tokenize

import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat._backend import config, heuristics, math_policy
from cudnn_compat._backend.engines.base import REGISTRY, Engine, EngineRegistry
from cudnn_compat import misc
from cudnn_compat.tools import replay

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE_DIRS = (ROOT / "cudnn_compat",)  # the graph layer is cudnn_compat/_backend
ALLOWED = {ROOT / "cudnn_compat" / "_backend" / "config.py"}
ENV_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}
# string tokens that mention the environment and are not reads: the shim's .pth line (source text
# written into site-packages, run by site.py at start-up before the package is imported)
ALLOWED_STRINGS = {(ROOT / "cudnn_compat" / "cupy13" / "shim.py", "PTH_LINE")}


def env_reads(source: str) -> list:
    """[(line, token text)] of the code tokens of ``source`` that reach the environment:
    a name in ENV_NAMES, or a string literal that is exactly one of them (getattr) or contains
    ``environ``/``getenv`` as code would (``os.environ``, ``.getenv(``).  Comments never count;
    docstrings and other strings count only in those forms."""
    hits, prev = [], None
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME and tok.string in ENV_NAMES:
            hits.append((tok.start[0], tok.string, prev))
        elif tok.type == tokenize.STRING:
            body = tok.string.strip("'\"bBrRuUfF")
            if body in ENV_NAMES or "os.environ" in body or "os.getenv" in body or "environ.get" in body:
                hits.append((tok.start[0], tok.string[:60], prev))
        if tok.type == tokenize.NAME:
            prev = tok.string
    return hits


def _assigned_name(source: str, line: int) -> "str | None":
    """The name assigned on the statement around ``line`` (``NAME = (...`` a few lines up)."""
    lines = source.splitlines()
    for i in range(line - 1, max(-1, line - 6), -1):
        head = lines[i].split("=", 1)[0].strip()
        if "=" in lines[i] and head.isidentifier():
            return head
    return None


def package_files() -> list:
    files = sorted(p for d in PACKAGE_DIRS for p in d.rglob("*.py") if "__pycache__" not in p.parts)
    assert len(files) > 80, files  # the package is there (cudnn_compat/ and cudnn_compat/_backend/ with its engines)
    return files


def test_only_config_reads_the_environment():
    offenders = []
    files = package_files()
    assert ALLOWED <= set(files)
    for path in files:
        if path in ALLOWED:
            continue
        src = path.read_text()
        for line, text, _ in env_reads(src):
            if (path, _assigned_name(src, line)) in ALLOWED_STRINGS:
                continue
            offenders.append(f"{path.relative_to(ROOT)}:{line}: {text}")
    assert not offenders, "read the environment through cudnn_compat/_backend/config.py (get/getter/unset_fast):\n" + \
        "\n".join(offenders)


PRIVATE = {"_ENV", "_KEYS", "_ENCODE", "_DECODE", "_overrides", "_layers", "_raw_now"}


def private_view_uses(source: str) -> list:
    """[(line, token)] naming config's private view of the environment (``config._ENV``,
    ``getattr(config, "_KEYS")``): the fast paths use ``config.unset_fast`` instead."""
    hits = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME and tok.string in PRIVATE:
            hits.append((tok.start[0], tok.string))
        elif tok.type == tokenize.STRING and tok.string.strip("'\"bBrRuU") in PRIVATE:
            hits.append((tok.start[0], tok.string))
    return hits


def test_no_module_peeks_at_configs_private_view():
    offenders = [f"{p.relative_to(ROOT)}:{ln}: {t}" for p in package_files() if p not in ALLOWED
                 for ln, t in private_view_uses(p.read_text())]
    assert not offenders, "use config.unset_fast / config.getter:\n" + "\n".join(offenders)
    assert private_view_uses('d = getattr(_config, "_ENV", None)\nk = config._KEYS["A"]\n') == \
        [(1, '"_ENV"'), (2, "_KEYS")]


def test_config_itself_is_found_reading_it():
    """The walk would see a reader: config.py has them (it is the one allowed)."""
    assert len(env_reads((ROOT / "cudnn_compat" / "_backend" / "config.py").read_text())) >= 3


@pytest.mark.parametrize("source", [
    "import os\nx = os.environ['CUDNN_COMPAT_ENGINE']\n",
    "import os\nx = os.environ.get('A', '')\n",
    "import os\nx = os.getenv('A')\n",
    "from os import environ\nx = environ.get('A')\n",
    "from os import getenv as g\n",
    "import os as o\no.putenv('A', '1')\n",
    "import os\nos.unsetenv('A')\n",
    "import os\nd = getattr(os, 'environ')\n",
    "import os\nd = os.environb\n",
    "exec('import os; os.environ.get(1)')\n",
    "def f(env=__import__('os').environ):\n    return env\n",
])
def test_the_walk_catches_each_form(source):
    assert env_reads(source), source


@pytest.mark.parametrize("source", [
    "# os.environ's own dict: config's view\nx = 1\n",
    '"""Reads CUDNN_COMPAT_ENGINE through config (the environment variable)."""\n',
    "environment = {}\nx = environment.get('a')\n",
    "from cudnn_compat._backend import config\nx = config.get('CUDNN_COMPAT_ENGINE')\n",
])
def test_the_walk_passes_what_is_not_a_read(source):
    assert env_reads(source) == []


def test_the_shim_string_is_the_only_allowed_mention():
    src = (ROOT / "cudnn_compat" / "cupy13" / "shim.py").read_text()
    hits = env_reads(src)
    assert hits and all(_assigned_name(src, ln) == "PTH_LINE" for ln, _, _ in hits)


# -- config.override and config.unset_fast ----------------------------------------------------------

@pytest.fixture(autouse=True)
def fresh_config():
    config.reload()
    yield
    config.reload()


def test_override_is_honoured_by_every_reader_and_restores(monkeypatch):
    name = "CUDNN_COMPAT_ENGINE"
    read = config.getter(name)
    fast = config.unset_fast(name)
    monkeypatch.setenv(name, "cupy")
    assert read() == config.get(name) == heuristics.forced_engine() == "cupy" and fast() is False
    with config.override(name, "reference"):
        assert read() == config.get(name) == heuristics.forced_engine() == "reference"
        assert config.setting(name).raw == "reference" and fast() is False
        assert os.environ[name] == "cupy"  # the environment is not touched
        with config.override(name, None):  # None: as if unset
            assert read() is None and config.get(name) is None and heuristics.forced_engine() is None
            assert not config.setting(name).is_set
        assert read() == "reference"
    assert read() == config.get(name) == "cupy" and os.environ[name] == "cupy"
    monkeypatch.delenv(name)
    assert read() is None and fast() is True


def test_override_of_a_bad_value_warns_and_uses_the_default():
    with pytest.warns(config.ConfigWarning, match="CUDNN_COMPAT_PLAN_CACHE_SIZE"):
        with config.override("CUDNN_COMPAT_PLAN_CACHE_SIZE", "lots"):
            assert config.get("CUDNN_COMPAT_PLAN_CACHE_SIZE") == 1024
            assert config.setting("CUDNN_COMPAT_PLAN_CACHE_SIZE").understood is False
    with config.override("CUDNN_COMPAT_PLAN_CACHE_SIZE", " 12 "):
        assert config.get("CUDNN_COMPAT_PLAN_CACHE_SIZE") == 12


@pytest.mark.parametrize("bad", [("CUDNN_COMPAT_NOT_DECLARED", "1", KeyError), ("CUDNN_COMPAT_ENGINE", 3, TypeError),
                                 ("CUDNN_COMPAT_ENGINE", b"cupy", TypeError)])
def test_override_rejects_unknown_names_and_non_strings(bad):
    name, value, exc = bad
    with pytest.raises(exc):
        with config.override(name, value):
            pass
    assert config._overrides == {} and config._layers == {}


def test_overlapping_overrides_across_threads_restore_in_any_order():
    name = "CUDNN_COMPAT_ENGINE"
    a, b = config.override(name, "a"), config.override(name, "b")
    a.__enter__()
    assert config.get(name) == "a"
    b.__enter__()
    assert config.get(name) == "b"
    a.__exit__(None, None, None)  # the outer block ends first: the inner value stays in force
    assert config.get(name) == "b"
    b.__exit__(None, None, None)
    assert config.get(name) is None and config._overrides == {}
    seen, errors = [], []

    def worker(i):
        try:
            for _ in range(200):
                with config.override(name, f"e{i}"):
                    seen.append(config.get(name))
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(seen) == 800 and set(seen) <= {f"e{i}" for i in range(4)}
    assert config.get(name) is None and config._overrides == {} and config._layers == {}


@pytest.mark.parametrize("names", [("CUDNN_COMPAT_ENGINE",), ("CUDNN_COMPAT_ENGINE", "CUDNN_COMPAT_CPU_FALLBACK"),
                                   ("CUDNN_COMPAT_ENGINE", "CUDNN_COMPAT_CPU_FALLBACK", "CUDNN_COMPAT_CUPY_GRAPHS")])
def test_unset_fast_is_true_only_while_every_name_is_absent_and_nothing_overridden(names, monkeypatch):
    for n in names:
        monkeypatch.delenv(n, raising=False)
    fast = config.unset_fast(*names)
    env, keys, ov = config.unset_parts(*names)  # the same test in pieces, as the hottest paths inline it

    def test():
        got = fast()
        assert got == (not ov and all(k not in env for k in keys))
        return got
    assert test() is True
    for n in names:  # each name, set (even to an empty string), turns it off
        for raw in ("", "1"):
            monkeypatch.setenv(n, raw)
            assert test() is False, (n, raw)
        monkeypatch.delenv(n)
        assert test() is True
    with config.override("CUDNN_COMPAT_LOG", None):  # any active override: read with get
        assert test() is False
    assert test() is True
    with pytest.raises(KeyError):
        config.unset_fast("CUDNN_COMPAT_ENGINE", "CUDNN_COMPAT_NOT_DECLARED")


def _add(h):
    d = cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensor4dDescriptor(d, 0, 0, 1, 3, 1, 1)
    y = np.ones(3, np.float32)
    cc.cudnnAddTensor(h, 2.0, d, np.full(3, 0.5, np.float32), 1.0, d, y)
    cc.cudnnDestroyTensorDescriptor(d)
    return y


def test_the_planners_cached_path_honours_an_override(monkeypatch):
    """A plan cached with no forced engine is not reused under an override that forces one."""
    monkeypatch.delenv("CUDNN_COMPAT_ENGINE", raising=False)
    h = cc.cudnnCreate("cpu")
    try:
        assert _add(h).tolist() == [2.0] * 3
        assert _add(h).tolist() == [2.0] * 3  # cached
        with config.override("CUDNN_COMPAT_ENGINE", "no_such_engine"):
            with pytest.raises(cc.CuDNNError) as e:
                _add(h)
            assert e.value.status_name == "CUDNN_STATUS_NOT_SUPPORTED" and "no_such_engine" in str(e.value)
        assert _add(h).tolist() == [2.0] * 3
        monkeypatch.setenv("CUDNN_COMPAT_ENGINE", "no_such_engine")
        with config.override("CUDNN_COMPAT_ENGINE", None):  # unset for the block: runs again
            assert _add(h).tolist() == [2.0] * 3
    finally:
        cc.cudnnDestroy(h)


def test_replay_forces_its_engine_without_touching_the_environment(monkeypatch):
    monkeypatch.setenv("CUDNN_COMPAT_ENGINE", "cupy")
    with replay._forced("reference"):
        assert heuristics.forced_engine() == "reference" and os.environ["CUDNN_COMPAT_ENGINE"] == "cupy"
    with replay._forced(None):
        assert heuristics.forced_engine() is None
    assert heuristics.forced_engine() == "cupy"


def test_the_external_variables_go_through_config(monkeypatch, capsys):
    monkeypatch.delenv("NVIDIA_TF32_OVERRIDE", raising=False)
    assert math_policy.allow_tf32("float32", "DEFAULT_MATH") is True
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", " 0 ")
    assert math_policy.tf32_disabled() and math_policy.allow_tf32("float32", "TENSOR_OP_MATH") is False
    with config.override("NVIDIA_TF32_OVERRIDE", "1"):
        assert not math_policy.tf32_disabled()
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "1")
    assert not math_policy.tf32_disabled()
    dbg = misc.CudnnDebug(0, 0, 0, 0, 0.0, 0, 0, 1, 0, 0)
    monkeypatch.delenv("CUDNN_LOGDEST_DBG", raising=False)
    misc._default_sink(misc.ERROR, None, dbg, "silent")
    with config.override("CUDNN_LOGDEST_DBG", "stdout"):
        misc._default_sink(misc.ERROR, None, dbg, "to stdout")
    monkeypatch.setenv("CUDNN_LOGDEST_DBG", "stderr")
    misc._default_sink(misc.WARNING, None, dbg, "to stderr")
    out = capsys.readouterr()
    assert "silent" not in out.out + out.err
    assert "ERROR" in out.out and "to stdout" in out.out and "to stderr" in out.err and "WARNING" in out.err


# -- engines register with a priority ---------------------------------------------------------------

def test_order_is_derived_from_the_registered_priorities():
    assert heuristics.ORDER is REGISTRY.order
    assert heuristics.ORDER == {"gpu": ("cudnn", "cupy", "reference"), "cpu": ("numpy", "reference")}
    for place, names in heuristics.ORDER.items():
        prios = [REGISTRY.priorities[n][place] for n in names]
        assert prios == sorted(prios, reverse=True), (place, prios)
    assert list(REGISTRY.engines)[:4] == ["reference", "cupy", "numpy", "cudnn"]
    assert replay.ENGINES == replay.engines() == ("reference", "cupy", "numpy", "cudnn", "legacy", "default")
    assert [replay._place(None, e) for e in ("reference", "cupy", "numpy", "cudnn", "legacy")] == ["cpu", "gpu", "cpu", "gpu", "gpu"]


class _Eng(Engine):
    def __init__(self, name, places):
        self.name, self.places = name, places


def test_registering_an_engine_places_it_by_priority():
    reg = EngineRegistry()
    reg.register(_Eng("slow", ("cpu", "gpu")), priority={"cpu": 10, "gpu": 10})
    reg.register(_Eng("fast", ("gpu",)), priority={"gpu": 50})
    reg.register(_Eng("mid", ("cpu", "gpu")), priority={"cpu": 20, "gpu": 30})
    reg.register(_Eng("tie", ("gpu",)), priority={"gpu": 30})
    reg.register(_Eng("unplaced", ("cpu",)))  # known by name, in no order
    assert reg.order == {"gpu": ("fast", "mid", "tie", "slow"), "cpu": ("mid", "slow")}
    assert reg.names() == ("slow", "mid", "tie", "fast")
    assert list(reg.engines) == ["slow", "mid", "tie", "fast", "unplaced"]
    reg.register(_Eng("mid", ("cpu", "gpu")), priority={"gpu": 99})  # registered again: new priorities
    assert reg.order == {"gpu": ("mid", "fast", "tie", "slow"), "cpu": ("slow",)}
    with pytest.raises(ValueError, match="'cpu' place"):
        reg.register(_Eng("gpuonly", ("gpu",)), priority={"cpu": 1})
    with pytest.raises(TypeError, match="must be a number"):
        reg.register(_Eng("odd", ("gpu",)), priority={"gpu": "high"})
    assert "gpuonly" not in reg.engines and "odd" not in reg.engines


def test_a_registered_engine_runs_in_its_place(monkeypatch):
    """An engine registered with a top CPU priority is what the heuristics try first there."""
    class Top(_Eng):
        pass
    monkeypatch.setattr(REGISTRY, "engines", dict(REGISTRY.engines))
    monkeypatch.setattr(REGISTRY, "priorities", dict(REGISTRY.priorities))
    monkeypatch.setitem(heuristics.ORDER, "cpu", heuristics.ORDER["cpu"])
    monkeypatch.setitem(heuristics.ORDER, "gpu", heuristics.ORDER["gpu"])
    REGISTRY.register(Top("top", ("cpu",)), priority={"cpu": 1000})
    assert heuristics.ORDER["cpu"] == ("top", "numpy", "reference") and heuristics.ORDER["gpu"][0] == "cudnn"
    assert [e.name for e in heuristics.engine_order("cpu")] == ["top", "numpy", "reference"]
    assert "top" in replay.engines()


from test_host_path import emu  # noqa: E402,F401 - the emulated GPU place fixture


def test_a_lane_is_not_taken_under_an_override(emu, monkeypatch):
    """_call's lanes (the emulated GPU place) test ``config.unset_fast``: under an override that
    forces an engine the call takes the general path (the engine is part of the plan key), after it
    the lane again; the environment was never touched."""
    import test_host_path as hp
    ins, outs, call = hp.case_act_fwd(np.random.default_rng(0))
    h = emu.handle()
    good = hp._f32({**ins, **outs})
    monkeypatch.delenv("CUDNN_COMPAT_ENGINE", raising=False)
    for _ in range(3):  # the memo's key seen; the lane made
        call(h, hp._dev(good), 1.0, 0.0)
    general = hp._count_general(monkeypatch)
    call(h, hp._dev(good), 1.0, 0.0)
    assert general[0] == 0  # the lane
    with config.override("CUDNN_COMPAT_ENGINE", "cupy"):
        call(h, hp._dev(good), 1.0, 0.0)
        assert general[0] == 1 and "CUDNN_COMPAT_ENGINE" not in os.environ
    call(h, hp._dev(good), 1.0, 0.0)
    assert general[0] == 1  # the lane again
