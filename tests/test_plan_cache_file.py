"""``CUDNN_COMPAT_PLAN_CACHE_FILE`` (issue 5): a config chosen by timing persists, so a new process
skips the timing.  CPU tests with a fake engine that autotunes the way the cudnn engine does
(``chosen_config`` first, else time every candidate and ``remember_config``); the GPU test of
the cudnn engine itself is in tests/test_cudnn_engine.py.  Also: a missing, corrupt, foreign
or unwritable file is ignored with a warning, writes are atomic, concurrent writers keep
each other's entries."""
import json
import os
import subprocess
import sys
import textwrap
import types
import warnings

import pytest

from cudnn_compat._backend import planner, plan_cache
from cudnn_compat._backend.engines.base import REGISTRY
from cudnn_compat._backend.ir import Operation, OperationGraph, Tensor, packed_strides
from cudnn_compat._backend.plan_cache import CONFIG_FILE, FILE_ENV, PlanCacheFileWarning, chosen_config, remember_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FAKE_ENGINE = '''
from cudnn_compat._backend.engines.base import REGISTRY, Engine, EngineConfig, ExecutionPlan
from cudnn_compat._backend.plan_cache import chosen_config, remember_config


class TuningEngine(Engine):
    """Candidates (index, knob): 'timing' makes index 7 fastest.  Counts its timing runs."""
    name, places = "tuning", ("cpu",)
    SPEED = {3: 2.0, 7: 0.5, 11: 1.0}

    def __init__(self):
        self.timed = 0
        self.memo = {}

    def candidates(self):
        return [EngineConfig(self.name, (("TILE_SIZE", i % 4),), frozenset({"DETERMINISTIC"}), i) for i in (3, 7, 11)]

    def configs(self, graph, place, mode):
        cands = self.candidates()
        sig = repr((graph.describe(), [str(c) for c in cands]))
        best = self.memo.get(sig) or chosen_config(self.name, sig, cands)
        if best is None:
            self.timed += len(cands)
            best = min(cands, key=lambda c: self.SPEED[c.index])
            remember_config(self.name, sig, best, ms=self.SPEED[best.index])
        self.memo[sig] = best
        return [best] + [c for c in cands if c != best]

    def build(self, graph, config):
        class Plan(ExecutionPlan):
            def execute(self, pack, stream=None):
                pass
        return Plan(graph, config)
'''
_NS: dict = {}
exec(FAKE_ENGINE, _NS)  # noqa: S102 - the same engine source runs in the child processes below
TuningEngine = _NS["TuningEngine"]


def graph(n=4):
    x, y = (Tensor(u, (2, n), packed_strides((2, n)), "float32") for u in (1, 2))
    return OperationGraph([Operation("Pointwise", {"x": x}, {"y": y}, {"mode": "IDENTITY"})])


@pytest.fixture
def engine(monkeypatch, tmp_path):
    eng = TuningEngine()
    monkeypatch.setitem(REGISTRY.engines, eng.name, eng)
    monkeypatch.setenv(FILE_ENV, str(tmp_path / "plans.json"))
    CONFIG_FILE.forget()
    yield eng
    CONFIG_FILE.forget()


def plan_of(g):
    return planner.make_plan(g, "cpu", forced="tuning")


def new_process(eng):
    """What a new process has: no memo in the engine, nothing read from the file."""
    eng.memo.clear()
    CONFIG_FILE.forget()


def test_a_new_process_skips_the_timing_and_gets_the_same_config(engine, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a missing file is not worth a warning
        first = plan_of(graph())
    assert engine.timed == 3 and first.config.index == 7
    doc = json.loads((tmp_path / "plans.json").read_text())
    assert doc["format"] == "cudnn-compat-plan-cache" and doc["version"] == 1
    (entry,) = doc["entries"]["tuning"].values()
    assert entry["index"] == 7 and entry["knobs"] == [["TILE_SIZE", 3]] and entry["ms"] == 0.5
    new_process(engine)
    again = plan_of(graph())
    assert engine.timed == 3 and again.config == first.config  # no timing run
    other = plan_of(graph(n=8))  # another signature is tuned, and kept beside the first
    assert engine.timed == 6 and other.config.index == 7
    assert len(json.loads((tmp_path / "plans.json").read_text())["entries"]["tuning"]) == 2
    assert sorted(os.listdir(tmp_path)) == ["plans.json", "plans.json.lock"]  # no temporary file left


def _child(path, n) -> dict:
    code = FAKE_ENGINE + textwrap.dedent(f'''
        import json
        from cudnn_compat._backend import planner
        from cudnn_compat._backend.ir import Operation, OperationGraph, Tensor, packed_strides
        eng = REGISTRY.register(TuningEngine())
        x, y = (Tensor(u, (2, {n}), packed_strides((2, {n})), "float32") for u in (1, 2))
        g = OperationGraph([Operation("Pointwise", {{"x": x}}, {{"y": y}}, {{"mode": "IDENTITY"}})])
        plan = planner.make_plan(g, "cpu", forced="tuning")
        print(json.dumps({{"timed": eng.timed, "config": str(plan.config)}}))
    ''')
    env = dict(os.environ, PYTHONPATH=ROOT, **{FILE_ENV: str(path)})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_two_real_processes(tmp_path):
    path = tmp_path / "sub" / "plans.json"
    path.parent.mkdir()
    first, second = _child(path, 4), _child(path, 4)
    assert first["timed"] == 3 and second["timed"] == 0 and first["config"] == second["config"]


@pytest.mark.parametrize("content", ["{not json", '["a list"]', '{"format": "other", "version": 1, "entries": {}}',
                                     '{"format": "cudnn-compat-plan-cache", "version": 99, "entries": {}}'])
def test_a_corrupt_or_foreign_file_is_ignored_with_a_warning_and_replaced(engine, tmp_path, content):
    (tmp_path / "plans.json").write_text(content)
    with pytest.warns(PlanCacheFileWarning, match=FILE_ENV):
        plan = plan_of(graph())
    assert engine.timed == 3 and plan.config.index == 7
    doc = json.loads((tmp_path / "plans.json").read_text())  # rewritten whole and valid
    assert len(doc["entries"]["tuning"]) == 1
    new_process(engine)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan_of(graph())
    assert engine.timed == 3


def test_stale_or_malformed_entries_are_not_used(engine, tmp_path):
    cands = engine.candidates()
    assert remember_config("tuning", "sig", cands[0])
    assert chosen_config("tuning", "sig", cands) == cands[0]
    assert chosen_config("tuning", "sig", cands[1:]) is None  # the recorded config is no candidate now
    assert chosen_config("tuning", "other", cands) is None
    doc = json.loads((tmp_path / "plans.json").read_text())
    for key in doc["entries"]["tuning"]:
        doc["entries"]["tuning"][key] = {"index": "x"}
    (tmp_path / "plans.json").write_text(json.dumps(doc))
    CONFIG_FILE.forget()
    assert chosen_config("tuning", "sig", cands) is None


def test_an_unwritable_location_warns_and_nothing_breaks(engine, monkeypatch, tmp_path):
    monkeypatch.setenv(FILE_ENV, str(tmp_path / "missing_dir" / "plans.json"))
    with pytest.warns(PlanCacheFileWarning, match="cannot write"):
        plan = plan_of(graph())
    assert plan.config.index == 7 and not (tmp_path / "missing_dir").exists()


def test_unset_means_nothing_persists(engine, monkeypatch, tmp_path):
    monkeypatch.delenv(FILE_ENV)
    assert not remember_config("tuning", "sig", engine.candidates()[0])
    assert chosen_config("tuning", "sig", engine.candidates()) is None
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("without_filelock", [(), (0, 1, 2, 3), (1, 3)], ids=["filelock", "flock", "mixed"])
def test_concurrent_writers_keep_every_entry(tmp_path, without_filelock):
    """Four processes writing at once: with filelock (issue 23 item 10), with POSIX flock alone
    (filelock not installed), and both at once (the two take the same lock)."""
    pytest.importorskip("filelock")
    path = tmp_path / "plans.json"
    code = textwrap.dedent('''
        import sys
        w = int(sys.argv[1])
        if sys.argv[2] == "1":
            sys.modules["filelock"] = None  # as if not installed
        from cudnn_compat._backend.engines.base import EngineConfig
        from cudnn_compat._backend import plan_cache
        from cudnn_compat._backend.plan_cache import remember_config
        assert (plan_cache.filelock is None) == (sys.argv[2] == "1")
        for i in range(25):
            assert remember_config("tuning", f"writer {w} entry {i}", EngineConfig("tuning", (), frozenset(), i))
    ''')
    env = dict(os.environ, PYTHONPATH=ROOT, **{FILE_ENV: str(path)})
    procs = [subprocess.Popen([sys.executable, "-c", code, str(w), str(int(w in without_filelock))], env=env,
                              cwd=ROOT, stderr=subprocess.PIPE) for w in range(4)]
    for p in procs:
        assert p.wait(timeout=60) == 0, p.stderr.read().decode()
    doc = json.loads(path.read_text())
    assert len(doc["entries"]["tuning"]) == 100
    assert sorted(os.listdir(tmp_path)) == ["plans.json", "plans.json.lock"]
    CONFIG_FILE.forget()


def test_the_lock_is_filelocks_where_installed_else_flock(tmp_path, monkeypatch):
    taken = []

    class FakeLock:
        def __init__(self, path):
            self.path = path

        def acquire(self):
            taken.append(("acquire", self.path))

        def release(self):
            taken.append(("release", self.path))
    monkeypatch.setattr(plan_cache, "filelock", types.SimpleNamespace(FileLock=FakeLock))
    lock_path = str(tmp_path / "p.json.lock")
    with plan_cache._FileLock(lock_path):
        assert taken == [("acquire", lock_path)]
    assert taken == [("acquire", lock_path), ("release", lock_path)]
    monkeypatch.setattr(plan_cache, "filelock", None)
    if plan_cache.fcntl is None:
        pytest.skip("no POSIX flock here")
    with plan_cache._FileLock(lock_path) as lk:
        assert lk.fd is not None and lk.lock is None
        import fcntl
        other = os.open(lock_path, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):  # held: another open file cannot take it
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
    assert lk.fd is None


def test_plan_cache_module_documents_the_variable():
    assert FILE_ENV == "CUDNN_COMPAT_PLAN_CACHE_FILE" and FILE_ENV in plan_cache.__doc__
