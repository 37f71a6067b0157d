"""The benchmark scripts on a CPU machine (issue 16 item 4): each one imports and parses its
arguments (``--help`` in a child interpreter, so a broken import or argparse fails CI though the
benchmarks themselves need a GPU); without CuPy each GPU script says so in one line and exits 2;
their shared timing and JSON code (benchmarks/_common.py); ``cudnn-compat bench`` reaches every
one of them and says clearly when it cannot run them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cudnn_compat.tools import cli

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if p.name != "_common.py")
NOT_BENCHMARKS = {"fuzz_nightly.py"}  # the nightly fuzz runner: not timed, not under `cudnn-compat bench`
GPU_SCRIPTS = sorted(b.script for b in cli.BENCHMARKS if b.cpu is None)


def _load_common():
    import importlib.util
    spec = importlib.util.spec_from_file_location("benchmarks_common", BENCH / "_common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_common = _load_common()


def _child(args, fake_cupy_absent=False, tmp_path=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDNN_COMPAT_")}
    path = [str(ROOT)]
    if fake_cupy_absent:  # a cupy whose import fails as a missing module does (also where CuPy is installed)
        (tmp_path / "fake" / "cupy").mkdir(parents=True, exist_ok=True)
        (tmp_path / "fake" / "cupy" / "__init__.py").write_text(
            'raise ModuleNotFoundError("No module named \'cupy\'", name="cupy")\n')
        path.insert(0, str(tmp_path / "fake"))
    env["PYTHONPATH"] = os.pathsep.join(path)
    return subprocess.run([sys.executable] + args, cwd=tmp_path or ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_imports_the_module_and_parses(script, tmp_path):
    p = _child([str(BENCH / script), "--help"], tmp_path=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"usage: {script}"), p.stdout[:200]


@pytest.mark.parametrize("script", GPU_SCRIPTS)
def test_gpu_script_without_cupy_is_one_line_and_status_2(script, tmp_path):
    p = _child([str(BENCH / script)], fake_cupy_absent=True, tmp_path=tmp_path)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{script}: needs a CUDA GPU with CuPy"), p.stderr


def test_every_benchmark_script_is_reachable_from_the_command():
    listed = {b.script for b in cli.BENCHMARKS}
    assert listed == set(SCRIPTS) - NOT_BENCHMARKS
    assert {"bench_rnn.py", "host_overhead.py", "bench_programs.py", "launch_paths.py"} <= listed


# -- _common: the shared timing and JSON code -------------------------------------------------------

class _FakeEvents:
    """CUDA events timed with a counter: each fn() call costs 2 ms, record() reads the clock."""

    def __init__(self):
        self.clock, self.synced = 0.0, []

    def make(self):
        outer = self

        class Event:
            def record(self):
                self.t = outer.clock

            def synchronize(self):
                pass
        return Event()

    def events(self, kind):
        return self.make, lambda: self.synced.append("device"), lambda a, b: b.t - a.t


def test_cuda_time_median_per_call(monkeypatch):
    fake = _FakeEvents()
    monkeypatch.setattr(_common, "_events", fake.events)
    calls = []

    def fn():
        calls.append(1)
        fake.clock += 2.0 if len(calls) % 3 else 5.0  # every third call is slow
    r = _common.cuda_time(fn, iters=3, reps=4, warm=2, before=lambda: fake.synced.append("torch"))
    assert len(calls) == 2 + 3 * 4
    assert fake.synced == ["device", "torch"]
    assert len(r["reps_ms"]) == 4 and r["ms"] == pytest.approx(3.0) and r["min_ms"] == pytest.approx(3.0)


def test_write_json_names_the_file_after_the_device(tmp_path):
    path = _common.write_json("bench_x", {"a": 1, "v": _common.statistics.median([1, 2, 3])}, str(tmp_path),
                              device="NVIDIA H100 80GB HBM3")
    assert path == str(tmp_path / "bench_x_NVIDIA_H100_80GB_HBM3.json")
    doc = json.loads(Path(path).read_text())
    run = doc.pop("run")
    assert doc == {"a": 1, "v": 2}
    assert set(run) == {"git_commit", "utc"} and run["utc"].endswith("Z")
    nested = tmp_path / "new" / "folder" / "out.json"
    assert _common.write_json_file(str(nested), {"b": [1, 2]}) == str(nested)
    doc = json.loads(nested.read_text())
    assert doc["b"] == [1, 2] and doc["run"] == run and not list(nested.parent.glob("*.tmp"))


def test_every_json_records_the_commit_and_the_utc_time(tmp_path, monkeypatch):
    """issue 23 item 8: one stamp for every benchmark JSON (all go through write_json_file)."""
    import datetime
    import subprocess as sp
    sha = sp.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    if sha:
        assert _common.git_commit().split("-")[0] == sha
    monkeypatch.setenv("BENCH_GIT_COMMIT", "abc123")
    assert _common.git_commit(str(tmp_path)) == "abc123"  # a tree without .git
    monkeypatch.delenv("BENCH_GIT_COMMIT")
    assert _common.git_commit(str(tmp_path)) == "unknown"
    # a copy whose own .git names an older commit than the files that run (the device tool's copy):
    # BENCH_GIT_COMMIT read there names that commit, and the stamp says the files are not it
    repo = tmp_path / "copy"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    if sp.run(git + ["init", "-q"], capture_output=True).returncode == 0:
        (repo / "f.py").write_text("a = 1\n")
        sp.run(git + ["add", "f.py"], capture_output=True)
        sp.run(git + ["commit", "-qm", "c"], capture_output=True)
        head = sp.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        monkeypatch.setenv("BENCH_GIT_COMMIT", head[:7])
        assert _common.git_commit(str(repo)) == head[:7]  # the files are that commit's
        (repo / "f.py").write_text("a = 2\n")
        assert _common.git_commit(str(repo)) == head[:7] + "-dirty"
        monkeypatch.setenv("BENCH_GIT_COMMIT", "abc123")  # named where the tree was copied from: as given
        assert _common.git_commit(str(repo)) == "abc123"
        monkeypatch.delenv("BENCH_GIT_COMMIT")
        assert _common.git_commit(str(repo)) == head + "-dirty"
    utc = datetime.datetime.strptime(_common.run_stamp()["utc"], "%Y-%m-%dT%H:%M:%SZ")
    assert abs((datetime.datetime.utcnow() - utc).total_seconds()) < 24 * 3600
    for script in set(SCRIPTS) - NOT_BENCHMARKS:  # none writes JSON another way
        text = (BENCH / script).read_text()
        assert "json.dump(" not in text and ("write_json" in text or ".json" not in text), script


def test_scripts_use_the_shared_helpers():
    """No script keeps its own CUDA-event loop, device-name lookup or JSON file writing."""
    for script in set(SCRIPTS) - NOT_BENCHMARKS:
        text = (BENCH / script).read_text()
        assert "from _common import" in text, script
        assert "getDeviceProperties" not in text, script
        assert "json.dump(" not in text, script


# -- cudnn-compat bench ----------------------------------------------------------------------------

def test_bench_list(capsys):
    assert cli.main(["bench", "--list"]) == 0
    out = capsys.readouterr().out
    for b in cli.BENCHMARKS:
        assert b.name in out and b.script in out
    assert "(missing)" not in out


def test_bench_outside_a_checkout_says_so(monkeypatch, tmp_path, capsys):
    fake = tmp_path / "site-packages" / "cudnn_compat" / "tools" / "cli.py"
    monkeypatch.setattr(cli, "__file__", str(fake))
    monkeypatch.setattr(cli, "_installed_from", lambda: None)
    monkeypatch.chdir(tmp_path)
    for argv in (["bench", "conv"], ["bench", "--list"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "not installed with the package" in err and "--dir" in err
        assert str(tmp_path / "benchmarks") in err  # where it looked
    assert cli.main(["bench", "--dir", str(BENCH), "--list"]) == 0  # pointed at a checkout's folder
    assert f"benchmarks under {BENCH}:" in capsys.readouterr().out


def test_bench_finds_the_benchmarks_wherever_the_user_has_them(monkeypatch, tmp_path, capsys):
    """Installed with ``pip install .`` (the package in site-packages): the checkout it came from
    (PEP 610 direct_url.json), the current directory's benchmarks/, --dir relative or absolute."""
    fake = tmp_path / "site-packages" / "cudnn_compat" / "tools" / "cli.py"
    monkeypatch.setattr(cli, "__file__", str(fake))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(cli, "_installed_from", lambda: str(ROOT))  # pip install /path/to/checkout
    assert cli.bench_dir() == str(BENCH)
    monkeypatch.setattr(cli, "_installed_from", lambda: None)
    assert cli.bench_dir() is None
    monkeypatch.chdir(ROOT)  # the current directory's benchmarks/
    assert cli.bench_dir() == str(BENCH)
    monkeypatch.chdir(elsewhere)
    rel = os.path.relpath(BENCH, elsewhere)
    assert cli.bench_dir(rel) == str(BENCH) and cli.bench_dir(str(BENCH)) == str(BENCH)
    assert cli.bench_dir("benchmarks") is None  # relative to the current directory, which has none


def test_bench_relative_dir_runs_the_scripts_from_the_checkout(monkeypatch, calls):
    monkeypatch.setattr("cudnn_compat._core.place.gpu_reason", lambda: None)
    monkeypatch.chdir(ROOT)
    assert cli.main(["bench", "--dir", "benchmarks", "rnn"]) == 0
    assert calls == [([sys.executable, str(BENCH / "bench_rnn.py")], str(ROOT))]


def test_installed_from_reads_pep_610(monkeypatch, tmp_path):
    from importlib import metadata

    class Dist:
        def __init__(self, text):
            self.text = text

        def read_text(self, name):
            assert name == "direct_url.json"
            return self.text
    for text, want in ((json.dumps({"url": (tmp_path / "a b").as_uri(), "dir_info": {}}), str(tmp_path / "a b")),
                       (json.dumps({"url": "https://x/y.whl", "archive_info": {}}), None),
                       (json.dumps({"url": (tmp_path / "w.whl").as_uri(), "archive_info": {}}), None),
                       (None, None), ("{not json", None)):
        monkeypatch.setattr(metadata, "distribution", lambda name, t=text: Dist(t))
        assert cli._installed_from() == want, text


@pytest.fixture
def calls(monkeypatch):
    import subprocess as sp
    got = []
    monkeypatch.setattr(sp, "call", lambda cmd, cwd=None: got.append((cmd, cwd)) or 0)
    return got


def test_bench_runs_every_benchmark_on_a_gpu(monkeypatch, calls, capsys):
    monkeypatch.setattr("cudnn_compat._core.place.gpu_reason", lambda: None)
    assert cli.main(["bench", "--quick"]) == 0
    assert [Path(c[0][1]).name for c in calls] == [b.script for b in cli.BENCHMARKS]
    for cmd, cwd in calls:
        assert cmd[0] == sys.executable and Path(cmd[1]).parent == BENCH and cwd == str(ROOT)
    by = {Path(c[0][1]).name: c[0][2:] for c in calls}
    assert by["bench_rnn.py"] == ["--quick"] and by["host_overhead.py"] == ["--place", "gpu", "--calls", "2000"]
    assert by["launch_paths.py"] == ["--calls", "2000"]


def test_bench_names_and_scripts(monkeypatch, calls):
    monkeypatch.setattr("cudnn_compat._core.place.gpu_reason", lambda: None)
    assert cli.main(["bench", "rnn", "bench_programs", "host_overhead.py"]) == 0
    assert [Path(c[0][1]).name for c in calls] == ["bench_rnn.py", "bench_programs.py", "host_overhead.py"]
    assert cli.main(["bench", "bench_nothing"]) == 2


def test_bench_without_a_gpu(monkeypatch, calls, capsys):
    monkeypatch.setattr("cudnn_compat._core.place.gpu_reason", lambda: "no CUDA device (test)")
    assert cli.main(["bench"]) == 2 and cli.main(["bench", "rnn", "host_overhead"]) == 2
    err = capsys.readouterr().err
    assert "no CUDA device (test)" in err and "runs on the CPU: host_overhead" in err
    assert not calls
    assert cli.main(["bench", "host_overhead"]) == 0  # the one that runs on the CPU
    assert [c[0][2:] for c in calls] == [["--place", "cpu"]]


def test_bench_reports_a_failing_script(monkeypatch, capsys):
    import subprocess as sp
    monkeypatch.setattr("cudnn_compat._core.place.gpu_reason", lambda: None)
    monkeypatch.setattr(sp, "call", lambda cmd, cwd=None: 3)
    assert cli.main(["bench", "fusion"]) == 1
    assert "fusion exited with 3" in capsys.readouterr().err


@pytest.mark.parametrize("part, suite_rc, fuzz_rc, want", [("1", 0, 0, 0), ("1", 1, 0, 1), ("1", 2, 0, 2), ("1", 0, 1, 0),
                                                         ("2", 1, 0, 0), ("2", 0, 1, 1)])
def test_device_check_exits_non_zero_when_the_suite_fails(tmp_path, part, suite_rc, fuzz_rc, want):
    """benchmarks/device_check.sh with stand-ins for python3 and nvidia-smi: PART=1 runs the GPU
    suite, then host_overhead, bench_programs and step_split, and its status is the suite's; PART=2
    runs no suite and the other benchmarks (the fuzz run among them), its status the fuzz run's; the
    optional steps skip when the budget has no room; only JSON newer than the run's start is
    collected (issue 23 items 8, 11)."""
    import shutil
    import tarfile
    if shutil.which("bash") is None or shutil.which("timeout") is None:
        pytest.skip("needs bash and timeout")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA Test GPU, 1.0'\n")
    (fake / "python3").write_text(
        "#!/bin/sh\ncase \"$*\" in\n"
        f"  *pytest*) echo '1 passed'; exit {suite_rc};;\n"
        f"  *fuzz_nightly*) exit {fuzz_rc};;\n"
        "  *) echo \"ran $*\"; exit 0;;\nesac\n")
    for f in fake.iterdir():
        f.chmod(0o755)
    work = tmp_path / "tree"
    (work / "benchmarks" / "results").mkdir(parents=True)
    stale = work / "benchmarks" / "results" / "host_overhead_NVIDIA_Test_GPU.json"
    stale.write_text("{}")
    os.utime(stale, (1, 1))  # older than any run
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", OUT=str(tmp_path / "out"), BUDGET_S="100", PART=part)
    p = subprocess.run(["bash", str(BENCH / "device_check.sh")], cwd=work, env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == want, p.stdout + p.stderr
    with tarfile.open(tmp_path / "out" / "device_check.tgz") as t:
        names = [os.path.basename(n) for n in t.getnames()]
    assert "host_overhead_NVIDIA_Test_GPU.json" not in names and ".started" not in names
    if part == "1":
        assert "pytest_gpu.log" in names
        for step in ("host_overhead", "bench_programs", "step_split"):
            assert f"{step} rc=0" in p.stdout, p.stdout
        assert "fuzz_gpu" not in p.stdout and "bench_conv " not in p.stdout
    else:
        assert "pytest_gpu.log" not in names and "pytest rc" not in p.stdout
        assert "fuzz_gpu rc=" in p.stdout and "host_overhead rc" not in p.stdout
        assert "bench_conv skipped" in p.stdout or "bench_conv rc=0" in p.stdout


def _load(name):
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_host_overhead_mixed_calls_each_case_once_per_round():
    """``mixed``: every case once per round, in turn (ours, then the legacy columns, then ours on the
    legacy's cases); the figure is per call, not per round."""
    ho = _load("host_overhead")
    order = []

    def case(name, legacy=True):
        def f():
            order.append(name)
        f.legacy = (lambda: order.append(name + "'")) if legacy else None
        return f
    fns = {"a": case("a"), "b": case("b", legacy=False), "c": case("c")}
    out = ho.mixed(fns, rounds=7)
    assert out["cases"] == 3 and out["legacy_cases"] == 2 and out["rounds"] == 7
    ours_rounds = order[:3 * (5 + 7)]
    assert ours_rounds == ["a", "b", "c"] * 12  # 5 warm-up rounds, then 7 timed
    assert order[36:36 + 2 * 12] == ["a'", "c'"] * 12
    assert order[60:] == ["a", "c"] * 12
    assert 0 < out["ours_us"] < 1e4 and 0 < out["legacy_us"] < 1e4
