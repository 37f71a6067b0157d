"""cuDNN 8's logging variables (issue 16 item 4; cudnn_compat/_core/log.py; 002 §3.2.79
cudnnSetCallback: the built-in callback writes to CUDNN_LOGDEST_DBG):
CUDNN_LOGINFO_DBG / CUDNN_LOGWARN_DBG / CUDNN_LOGERR_DBG = 1 enable API calls (INFO, with their
status), the library's warnings and failed calls' messages (ERROR), written to CUDNN_LOGDEST_DBG
(stdout, stderr or a file).  Each case runs a child interpreter with the variables set.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat._core import log as _logging
from cudnn_compat._backend import config

VARS = ("CUDNN_LOGINFO_DBG", "CUDNN_LOGWARN_DBG", "CUDNN_LOGERR_DBG", "CUDNN_LOGDEST_DBG")

# one successful compute call, one failed one (float64 output for a FLOAT descriptor), one library
# warning; prints a JSON line with the error message, GetCallback and whether the hook is on
PROGRAM = textwrap.dedent("""
    import json, logging, numpy as np, cudnn_compat as cc
    from cudnn_compat._core import log as _logging
    h = cc.cudnnCreate("cpu")
    d = cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensor4dDescriptor(d, cc.CUDNN_TENSOR_NCHW, cc.CUDNN_DATA_FLOAT, 1, 2, 2, 2)
    x = np.ones((1, 2, 2, 2), np.float32)
    cc.cudnnAddTensor(h, 1.0, d, x, 1.0, d, x)
    try:
        cc.cudnnAddTensor(h, 1.0, d, x, 0.0, d, np.zeros(8, np.float64))
        message = None
    except cc.CuDNNError as e:
        message = str(e)
    logging.getLogger("cudnn_compat").warning("engine x declined at execute (test warning)")
    mask, udata, fptr = cc.cudnnGetCallback()
    print("RESULT " + json.dumps({"message": message, "mask": mask, "fptr": fptr is None,
                                  "hook": _logging.api_logging(), "x": x.ravel().tolist()}))
""")


def _run(tmp_path, code=PROGRAM, **env_vars):
    env = {k: v for k, v in os.environ.items() if k not in VARS and not k.startswith("CUDNN_COMPAT_")}
    env.update(env_vars)
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    result = json.loads(next(line for line in p.stdout.splitlines() if line.startswith("RESULT "))[7:])
    out = "\n".join(line for line in p.stdout.splitlines() if not line.startswith("RESULT "))
    return result, out, p.stderr


INFO_OK = "function cudnnAddTensor() called: CUDNN_STATUS_SUCCESS"
INFO_FAIL = "function cudnnAddTensor() called: CUDNN_STATUS_BAD_PARAM"
WARN = "engine x declined at execute (test warning)"


def _lines(text, level):
    return [line for line in text.splitlines() if line.startswith(f"cudnn_compat {level} ")]


def test_all_levels_to_a_file(tmp_path):
    log = tmp_path / "cudnn.log"
    r, out, err = _run(tmp_path, CUDNN_LOGINFO_DBG="1", CUDNN_LOGWARN_DBG="1", CUDNN_LOGERR_DBG="1",
                       CUDNN_LOGDEST_DBG=str(log))
    text = log.read_text()
    info, warn, error = _lines(text, "INFO"), _lines(text, "WARNING"), _lines(text, "ERROR")
    for name in ("cudnnCreate", "cudnnCreateTensorDescriptor", "cudnnSetTensor4dDescriptor", "cudnnGetCallback"):
        assert any(f"function {name}() called: CUDNN_STATUS_SUCCESS" in line for line in info), name
    assert sum(INFO_OK in line for line in info) == 1
    assert sum(INFO_FAIL in line for line in info) == 1
    assert len(error) == 1 and error[0].endswith(f"function cudnnAddTensor() failed: {r['message']}")
    assert r["message"].startswith("CUDNN_STATUS_BAD_PARAM: cudnnAddTensor: C: array dtype float64")
    assert len(warn) == 1 and warn[0].endswith(WARN)
    assert r["mask"] == cc.CUDNN_SEV_INFO_EN | cc.CUDNN_SEV_WARNING_EN | cc.CUDNN_SEV_ERROR_EN and r["fptr"]
    assert r["hook"] and r["x"] == [2.0] * 8  # the logged program still computes
    assert "cudnn_compat" not in out and "cudnn_compat" not in err  # the file only


@pytest.mark.parametrize("dest", ["stdout", "stderr"])
def test_info_to_a_stream(tmp_path, dest):
    r, out, err = _run(tmp_path, CUDNN_LOGINFO_DBG="1", CUDNN_LOGDEST_DBG=dest)
    stream, other = (out, err) if dest == "stdout" else (err, out)
    assert INFO_OK in stream and INFO_FAIL in stream
    assert not _lines(stream, "ERROR") and not _lines(stream, "WARNING")  # levels not enabled
    assert "cudnn_compat" not in other
    assert r["mask"] == cc.CUDNN_SEV_INFO_EN


def test_errors_only(tmp_path):
    log = tmp_path / "err.log"
    r, out, err = _run(tmp_path, CUDNN_LOGERR_DBG="1", CUDNN_LOGDEST_DBG=str(log))
    text = log.read_text()
    assert not _lines(text, "INFO") and not _lines(text, "WARNING")
    assert [line.split(": ", 1)[1] for line in _lines(text, "ERROR")] == [f"function cudnnAddTensor() failed: {r['message']}"]
    assert r["mask"] == cc.CUDNN_SEV_ERROR_EN and r["hook"]
    assert r["message"] not in err  # not printed by logging's last resort either


def test_warnings_only(tmp_path):
    log = tmp_path / "warn.log"
    r, out, err = _run(tmp_path, CUDNN_LOGWARN_DBG="1", CUDNN_LOGDEST_DBG=str(log))
    text = log.read_text()
    assert len(_lines(text, "WARNING")) == 1 and not _lines(text, "INFO") and not _lines(text, "ERROR")
    assert r["mask"] == cc.CUDNN_SEV_WARNING_EN and not r["hook"]  # no per-call hook for warnings


@pytest.mark.parametrize("env", [{"CUDNN_LOGINFO_DBG": "1", "CUDNN_LOGERR_DBG": "1"},  # no destination: silent
                                 {"CUDNN_LOGINFO_DBG": "0", "CUDNN_LOGDEST_DBG": "stdout"},
                                 {"CUDNN_LOGDEST_DBG": "stdout"}])
def test_nothing_without_a_level_and_a_destination(tmp_path, env):
    r, out, err = _run(tmp_path, **env)
    assert "function cudnn" not in out + err
    assert r["mask"] == 0 and not r["hook"]  # and the call path pays nothing


def test_a_value_not_understood_warns_and_is_off(tmp_path):
    r, out, err = _run(tmp_path, CUDNN_LOGINFO_DBG="maybe", CUDNN_LOGDEST_DBG="stdout")
    assert "CUDNN_LOGINFO_DBG='maybe' is not understood" in err and "ConfigWarning" in err
    assert INFO_OK not in out and r["mask"] == 0


SET_CALLBACK = textwrap.dedent("""
    import json, numpy as np, cudnn_compat as cc
    from cudnn_compat._core import log as _logging
    got = []
    before = cc.cudnnGetCallback()[0]
    cc.cudnnCreateTensorDescriptor()                      # logged by the variables
    cc.cudnnSetCallback(cc.CUDNN_SEV_INFO_EN, "u", lambda sev, udata, dbg, msg: got.append((sev, udata, dbg.cudnnStatus, dbg.handle, msg)))
    h = cc.cudnnCreate("cpu")                             # to the user callback only
    try:
        cc.cudnnDestroyTensorDescriptor(h)
    except cc.CuDNNError:
        pass
    cc.cudnnSetCallback(0, None, None)                    # all off, variables included
    cc.cudnnCreateTensorDescriptor()
    print("RESULT " + json.dumps({"before": before, "hook": _logging.api_logging(), "handle": int(h),
                                  "got": [list(g) for g in got if "function" in g[4]]}))
""")


def test_set_callback_replaces_the_variables(tmp_path):
    log = tmp_path / "cb.log"
    r, out, err = _run(tmp_path, SET_CALLBACK, CUDNN_LOGINFO_DBG="1", CUDNN_LOGDEST_DBG=str(log))
    text = log.read_text()
    assert r["before"] == cc.CUDNN_SEV_INFO_EN
    assert sum("function cudnnCreateTensorDescriptor() called" in line for line in _lines(text, "INFO")) == 1
    assert "cudnnCreate()" not in text and "cudnnDestroyTensorDescriptor" not in text
    info = cc.CUDNN_SEV_INFO
    assert r["got"][0] == [info, "u", 0, 0, "function cudnnSetCallback() called: CUDNN_STATUS_SUCCESS"]
    assert r["got"][1] == [info, "u", 0, r["handle"], "function cudnnCreate() called: CUDNN_STATUS_SUCCESS"]
    assert r["got"][2] == [info, "u", cc.CUDNN_STATUS_BAD_PARAM, r["handle"],
                           "function cudnnDestroyTensorDescriptor() called: CUDNN_STATUS_BAD_PARAM"]
    assert len(r["got"]) == 3  # SetCallback(0) removed the callback before its own call returned
    assert not r["hook"]


# -- in process: the Python logger is the interface ----------------------------------------------------------

class _Catch(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def api_records():
    log = logging.getLogger(_logging.API_LOGGER)
    catch, level = _Catch(), log.level
    log.addHandler(catch)
    log.setLevel(logging.INFO)
    _logging.log_api_calls(True)
    try:
        yield catch.records
    finally:
        _logging.log_api_calls(False)
        log.removeHandler(catch)
        log.setLevel(level)


def test_log_api_calls_through_the_python_logger(handle, api_records):
    d = cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensor4dDescriptor(d, cc.CUDNN_TENSOR_NCHW, cc.CUDNN_DATA_FLOAT, 1, 1, 2, 2)
    x = np.full((1, 1, 2, 2), 3.0, np.float32)
    cc.addTensor(handle, 2.0, d, x, 1.0, d, x)  # CuPy 13 spelling: the same function
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnSetTensor4dDescriptor(d, cc.CUDNN_TENSOR_NCHW, cc.CUDNN_DATA_FLOAT, 0, 1, 2, 2)
    got = [(r.levelname, r.getMessage(), r.cudnn_status) for r in api_records]
    assert got == [("INFO", "function cudnnCreateTensorDescriptor() called: CUDNN_STATUS_SUCCESS", 0),
                   ("INFO", "function cudnnSetTensor4dDescriptor() called: CUDNN_STATUS_SUCCESS", 0),
                   ("INFO", "function cudnnAddTensor() called: CUDNN_STATUS_SUCCESS", 0),
                   ("INFO", "function cudnnSetTensor4dDescriptor() called: CUDNN_STATUS_BAD_PARAM", e.value.status),
                   ("ERROR", f"function cudnnSetTensor4dDescriptor() failed: {e.value}", e.value.status)]
    assert api_records[2].handle == int(handle)
    np.testing.assert_array_equal(x, 9.0)


@pytest.mark.parametrize("call", [
    lambda d: cc.cudnnSetTensor4dDescriptor(d, cc.CUDNN_TENSOR_NCHW, 0.5, 1, 1, 2, 2),  # enum, a float
    lambda d: cc.cudnnSetTensor4dDescriptor(d, cc.CUDNN_TENSOR_NCHW, cc.CUDNN_DATA_FLOAT, 1, "2", 2, 2),  # int, str
    lambda d: cc.cudnnSetTensorNdDescriptor(d, cc.CUDNN_DATA_FLOAT, 4, [1, 1, 2, 2.5], [4, 4, 2, 1]),  # int[]
    lambda d: cc.cudnnGetTensorNdDescriptor(d, None),  # int, None
])
def test_calls_refused_while_converting_arguments_are_logged(api_records, call):
    d = cc.cudnnCreateTensorDescriptor()
    del api_records[:]
    with pytest.raises(cc.CuDNNError) as e:
        call(d)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM
    name = e.value.function
    assert [(r.levelname, r.getMessage()) for r in api_records] == [
        ("INFO", f"function {name}() called: CUDNN_STATUS_BAD_PARAM"),
        ("ERROR", f"function {name}() failed: {e.value}")]


def test_a_legacy_function_calling_another_is_one_api_call(api_records):
    rnn, drop = cc.cudnnCreateRNNDescriptor(), cc.cudnnCreateDropoutDescriptor()
    with pytest.raises(cc.CuDNNError):  # the v5 form, with hiddenSize 0: rejected by cudnnSetRNNDescriptor_v5
        cc.cudnnSetRNNDescriptor(rnn, 0, 1, drop, cc.CUDNN_LINEAR_INPUT, cc.CUDNN_UNIDIRECTIONAL, cc.CUDNN_LSTM,
                                 cc.CUDNN_DATA_FLOAT)
    names = [r.getMessage().split("(")[0] for r in api_records]
    assert names[-2:] == ["function cudnnSetRNNDescriptor", "function cudnnSetRNNDescriptor"]
    assert not any("_v5" in n for n in names)


def test_hook_follows_the_mask(monkeypatch):
    monkeypatch.delenv("CUDNN_LOGDEST_DBG", raising=False)
    saved = cc.cudnnGetCallback()
    try:
        for mask, on in ((cc.CUDNN_SEV_WARNING_EN, False), (cc.CUDNN_SEV_ERROR_EN, True), (0, False),
                         (cc.CUDNN_SEV_INFO_EN, True)):
            cc.cudnnSetCallback(mask, None, None)
            assert _logging.api_logging() is on, mask
    finally:
        cc.cudnnSetCallback(*saved)
    assert _logging.api_logging() is bool(saved[0] & (cc.CUDNN_SEV_INFO_EN | cc.CUDNN_SEV_ERROR_EN))


def test_variables_are_declared():
    for name in VARS:
        assert config.TABLE[name].scope == config.EXTERNAL
    for name in VARS[:3]:
        assert config.TABLE[name].parse("1") is True and config.TABLE[name].parse("0") is False


# -- issue 23 item 3: only where asked; %i; cuDNN 9's CUDNN_LOGLEVEL_DBG ---------------------------------------

CAUGHT = textwrap.dedent("""
    import json, logging, sys, cudnn_compat as cc
    if len(sys.argv) > 1:                                 # an application with its own handler on the root
        logging.basicConfig(stream=sys.stdout, format="APP %(levelname)s %(name)s: %(message)s")
    d = cc.cudnnCreateTensorDescriptor()
    try:
        cc.cudnnSetTensor4dDescriptor(d, cc.CUDNN_TENSOR_NCHW, cc.CUDNN_DATA_FLOAT, -1, 2, 2, 2)
    except cc.CuDNNError as e:
        message = str(e)
    logging.getLogger("cudnn_compat").warning("engine x declined at execute (test warning)")
    print("RESULT " + json.dumps({"message": message, "mask": cc.cudnnGetCallback()[0]}))
""")
FAILED = "function cudnnSetTensor4dDescriptor() failed: "


def _caught(tmp_path, *argv, **env_vars):
    env = {k: v for k, v in os.environ.items() if k not in VARS + ("CUDNN_LOGLEVEL_DBG",)
           and not k.startswith("CUDNN_COMPAT_")}
    env.update(env_vars)
    p = subprocess.run([sys.executable, "-c", CAUGHT, *argv], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    result = json.loads(next(line for line in p.stdout.splitlines() if line.startswith("RESULT "))[7:])
    return result, "\n".join(ln for ln in p.stdout.splitlines() if not ln.startswith("RESULT ")), p.stderr


@pytest.mark.parametrize("env", [{"CUDNN_LOGINFO_DBG": "1"}, {"CUDNN_LOGINFO_DBG": "1", "CUDNN_LOGERR_DBG": "1"},
                                 {"CUDNN_LOGLEVEL_DBG": "3"}, {"CUDNN_LOGWARN_DBG": "1"}, {}])
def test_a_caught_failure_is_written_only_to_the_destination(tmp_path, env):
    """The issue's case: INFO to a file, a failed call caught by the program: nothing on stderr
    (the ERROR record used to reach logging's last-resort printer), the file has the records of
    the levels enabled."""
    log = tmp_path / "cudnn.log"
    r, out, err = _caught(tmp_path, **env, CUDNN_LOGDEST_DBG=str(log))
    assert err == "" and out == ""
    text = log.read_text() if log.exists() else ""
    info = "function cudnnSetTensor4dDescriptor() called: CUDNN_STATUS_BAD_PARAM"
    assert (info in text) is bool(r["mask"] & cc.CUDNN_SEV_INFO_EN)
    assert (FAILED + r["message"] in text) is bool(r["mask"] & cc.CUDNN_SEV_ERROR_EN)
    assert (WARN in text) is bool(r["mask"] & cc.CUDNN_SEV_WARNING_EN)
    assert r["message"].startswith("CUDNN_STATUS_BAD_PARAM: cudnnSetTensor4dDescriptor")


def test_no_variables_no_output(tmp_path):
    r, out, err = _caught(tmp_path)
    assert (out, err, r["mask"]) == ("", "", 0)


def test_the_application_handlers_still_see_what_they_saw(tmp_path):
    """An application that configured logging keeps its records at its own level (WARNING and up),
    beside the destination, which gets the INFO records too."""
    log = tmp_path / "cudnn.log"
    r, out, err = _caught(tmp_path, "app", CUDNN_LOGLEVEL_DBG="3", CUDNN_LOGDEST_DBG=str(log))
    assert err == ""
    assert out.splitlines() == [f"APP ERROR cudnn_compat.api: {FAILED}{r['message']}",
                                f"APP WARNING cudnn_compat: {WARN}"]
    assert "called: CUDNN_STATUS_BAD_PARAM" in log.read_text() and FAILED in log.read_text()


def test_percent_i_in_the_destination_is_the_process_id(tmp_path):
    code = CAUGHT.replace('print("RESULT "', 'import os; print("PID", os.getpid()); print("RESULT "')
    env = {k: v for k, v in os.environ.items() if k not in VARS and not k.startswith("CUDNN_COMPAT_")}
    env.update(CUDNN_LOGERR_DBG="1", CUDNN_LOGDEST_DBG=str(tmp_path / "cudnn_%i.log"))
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    pid = next(line.split()[1] for line in p.stdout.splitlines() if line.startswith("PID "))
    assert [f.name for f in tmp_path.iterdir()] == [f"cudnn_{pid}.log"]
    assert FAILED in (tmp_path / f"cudnn_{pid}.log").read_text()


ERR, WARN_EN, INFO_EN = cc.CUDNN_SEV_ERROR_EN, cc.CUDNN_SEV_WARNING_EN, cc.CUDNN_SEV_INFO_EN


@pytest.mark.parametrize("level, legacy, mask", [
    ("0", {}, 0), ("1", {}, ERR), ("2", {}, ERR | WARN_EN), ("3", {}, ERR | WARN_EN | INFO_EN),
    ("-4", {}, 0), ("9", {}, ERR | WARN_EN | INFO_EN),                       # clipped to 0..3, as cuDNN 9 does
    ("0", {"CUDNN_LOGINFO_DBG": "1"}, 0),                                     # set, it replaces cuDNN 8's variables
    ("1", {"CUDNN_LOGINFO_DBG": "1", "CUDNN_LOGWARN_DBG": "1"}, ERR),
    (None, {"CUDNN_LOGINFO_DBG": "1", "CUDNN_LOGWARN_DBG": "1"}, WARN_EN | INFO_EN),  # unset: cuDNN 8's
])
def test_each_log_level(tmp_path, level, legacy, mask):
    log = tmp_path / "cudnn.log"
    env = dict(legacy, CUDNN_LOGDEST_DBG=str(log), **({} if level is None else {"CUDNN_LOGLEVEL_DBG": level}))
    r, out, err = _caught(tmp_path, **env)
    assert r["mask"] == mask and err == ""
    text = log.read_text() if log.exists() else ""
    assert bool(_lines(text, "ERROR")) is bool(mask & ERR)
    assert bool(_lines(text, "WARNING")) is bool(mask & WARN_EN)
    assert bool(_lines(text, "INFO")) is bool(mask & INFO_EN)


def test_a_log_level_not_understood_warns_and_the_legacy_variables_decide(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in VARS and not k.startswith("CUDNN_COMPAT_")}
    env.update(CUDNN_LOGLEVEL_DBG="high", CUDNN_LOGERR_DBG="1", CUDNN_LOGDEST_DBG="stdout")
    p = subprocess.run([sys.executable, "-c", CAUGHT], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert "CUDNN_LOGLEVEL_DBG='high' is not understood" in p.stderr
    assert FAILED in p.stdout and '"mask": 2' in p.stdout


def test_log_level_parser():
    parse = config.TABLE["CUDNN_LOGLEVEL_DBG"].parse
    assert [parse(v) for v in ("0", "1", "2", "3", "-1", "42")] == [0, 1, 2, 3, 0, 3]
    with pytest.raises(ValueError, match="integer"):
        parse("info")
