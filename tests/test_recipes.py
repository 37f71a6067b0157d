"""Steady recipes (cudnn_compat/_core/recipes.py, ``_steady.Site``): a repeated legacy call made
again in C from what its Python path wrote down, and every call it cannot make handed to that
path (its twin) unchanged.

What is checked, on the CPU place and on the emulated GPU place (tests/host_emu.py):
- every family with a recipe replays it: from the fourth call with the same descriptors no frame
  of the Python wrapper runs;
- the numbers of replayed calls equal the reference engine's, call after call, with alpha/beta
  changing between forms that pick other plans (beta 0 / not 0, ints, -0.0);
- the class "a call the recipe cannot make": for each form of argument that must go the Python
  way (keywords, scalars of other forms or out of range, NULL or foreign buffers, an epsilon
  below the minimum, a converted argument, another argument count) the compiled function and
  its Python wrapper give the same outputs or the same error, status and message;
- a recipe goes stale when a descriptor changes, and the numbers follow the new settings;
- a legacy hook (trace) sees every call.
"""
from __future__ import annotations

import ctypes
import subprocess
import sys

import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat._backend import steady as _steady_mod
from cudnn_compat.errors import CuDNNError
from conftest import tdesc
from test_host_path import CASES, _f32, assert_close, emu, native_emu  # noqa: F401 (fixtures)

SITE = getattr(_steady_mod._MODULE, "Site", None)
pytestmark = pytest.mark.skipif(_steady_mod.module() is None, reason="the compiled steady path is not built")

# the families of test_host_path.CASES whose functions have a recipe
RECIPES = ("act_fwd", "act_bwd", "add_tensor", "bn_train", "bn_inf", "bn_bwd", "lrn", "pool_fwd", "pool_bwd",
           "softmax_fwd", "softmax_bwd", "op_tensor", "reduce_tensor")
WITH_RECIPE = ("cudnnActivationForward", "cudnnActivationBackward", "cudnnAddTensor", "cudnnBatchNormalizationForwardTraining",
               "cudnnBatchNormalizationForwardInference", "cudnnBatchNormalizationBackward", "cudnnLRNCrossChannelForward",
               "cudnnPoolingForward", "cudnnPoolingBackward", "cudnnSoftmaxForward", "cudnnSoftmaxBackward",
               "cudnnConvolutionForward", "cudnnConvolutionBackwardData", "cudnnConvolutionBackwardFilter",
               "cudnnConvolutionBiasActivationForward", "cudnnOpTensor", "cudnnReduceTensor", "cudnnDropoutForward",
               "cudnnDropoutBackward", "cudnnRNNForward")


def _wrapper_frames(fn) -> list:
    """The frames of generated legacy wrappers (the Python path's first frame) one call ``fn()`` runs,
    but for queries (reduce_tensor's case asks for its workspace size in the call)."""
    seen = []

    def prof(frame, event, arg):
        name = frame.f_code.co_filename
        if event == "call" and name.startswith("<legacy wrapper") and not name.startswith("<legacy wrapper cudnnGet"):
            seen.append(frame.f_code.co_filename)
    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def test_the_functions_with_a_recipe_are_sites():
    for name in WITH_RECIPE:
        f = cc.LEGACY[name]
        assert type(f) is SITE, name
        assert getattr(cc, name) is f and f.__name__ == name and f.c_name == name
        assert type(f.general).__name__ == "function" and f.general.c_name == name
        # introspection sees the family function's parameters (argument conversion, messages, docs)
        import inspect
        assert list(inspect.signature(f).parameters) == list(inspect.signature(f.general).parameters)


def test_without_the_extension_the_wrappers_stay():
    code = ("import cudnn_compat as cc, types; "
            "assert isinstance(cc.cudnnActivationForward, types.FunctionType); "
            "assert isinstance(cc.LEGACY['cudnnConvolutionForward'], types.FunctionType)")
    import os
    env = dict(os.environ, CUDNN_COMPAT_COMPILED="0")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("case", RECIPES)
def test_every_recipe_family_replays(native_emu, rng, case):
    import host_emu
    h = native_emu.handle()
    ins, outs, call = CASES[case](rng)
    dev = {k: host_emu.EmuArray(v) for k, v in _f32({**ins, **outs}).items()}
    for _ in range(4):  # both keys (beta 0 and not) prepared
        call(h, dev, 1.0, 0.0)
        call(h, dev, 1.0, 0.5)
    assert not _wrapper_frames(lambda: call(h, dev, 1.5, 0.0)), f"{case}: the call ran its Python wrapper"
    assert not _wrapper_frames(lambda: call(h, dev, 2, 0.5)), f"{case}: beta != 0 ran the Python wrapper"


def _conv_calls(rng, h_place: str):
    """The four convolution functions with a recipe, on one 3x3 problem: (ins, outs, call) each."""
    X, Wt = (2, 4, 6, 6), (4, 4, 3, 3)
    F32 = cc.CUDNN_DATA_FLOAT
    xd, yd, bd = tdesc(X), tdesc(X), tdesc((1, 4, 1, 1))
    wd = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(wd, F32, cc.CUDNN_TENSOR_NCHW, *Wt)
    cd = cc.cudnnCreateConvolutionDescriptor()
    cc.cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION, F32)
    ad = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(ad, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    x, w, y = rng.standard_normal(X), rng.standard_normal(Wt), rng.standard_normal(X)
    ws = np.zeros(1 << 16, np.uint8)
    return {
        "conv_fwd": ({"x": x, "w": w, "ws": ws}, {"y": y}, lambda h, b, a, be: cc.cudnnConvolutionForward(
            h, a, xd, b["x"], wd, b["w"], cd, 0, b["ws"], ws.nbytes, be, yd, b["y"])),
        "conv_bwd_data": ({"w": w, "dy": y, "ws": ws}, {"dx": x}, lambda h, b, a, be: cc.cudnnConvolutionBackwardData(
            h, a, wd, b["w"], yd, b["dy"], cd, 0, b["ws"], ws.nbytes, be, xd, b["dx"])),
        "conv_bwd_filter": ({"x": x, "dy": y, "ws": ws}, {"dw": w}, lambda h, b, a, be: cc.cudnnConvolutionBackwardFilter(
            h, a, xd, b["x"], yd, b["dy"], cd, 0, b["ws"], ws.nbytes, be, wd, b["dw"])),
        "conv_bias_act": ({"x": x, "w": w, "z": rng.standard_normal(X), "bias": rng.standard_normal((1, 4, 1, 1)),
                           "ws": ws}, {"y": y},
                          lambda h, b, a, be: cc.cudnnConvolutionBiasActivationForward(
                              h, a, xd, b["x"], wd, b["w"], cd, 1, b["ws"], ws.nbytes, be, yd, b["z"], bd, b["bias"],
                              ad, yd, b["y"])),
    }


@pytest.mark.parametrize("case", ("conv_fwd", "conv_bwd_data", "conv_bwd_filter", "conv_bias_act"))
def test_convolutions_replay(native_emu, rng, case):
    import host_emu
    h = native_emu.handle()
    ins, outs, call = _conv_calls(rng, "gpu")[case]
    dev = {k: host_emu.EmuArray(v) for k, v in _f32({**ins, **outs}).items()}
    dev["ws"] = host_emu.EmuArray(ins["ws"])
    site = cc.LEGACY[_Capture(call).args(h, dev, 1.0, 0.0)[0]]
    site.recipes.clear()  # only this test's call sites
    for _ in range(4):
        call(h, dev, 1.0, 0.0)
        call(h, dev, 1.0, 1.0)
    # the same scalars as before (the native engine's launch replays a graph per set of scalar values)
    assert not _wrapper_frames(lambda: call(h, dev, 1.0, 0.0)), f"{case}: the call ran its Python wrapper"
    assert not _wrapper_frames(lambda: call(h, dev, 1.0, 1.0)), f"{case}: the other key ran its Python wrapper"
    # both keys replay from their Settled (the native plan's Replay launcher), made again after the
    # prepared-call tables were emptied
    first = _settled(site)
    assert len(first) >= 2 and {type(x).__name__ for x in first} == {"Settled"}
    from cudnn_compat._core import call as _call
    _call.clear_prepared()
    for _ in range(3):
        call(h, dev, 1.0, 0.0)
        call(h, dev, 1.0, 1.0)
    assert not _wrapper_frames(lambda: call(h, dev, 1.0, 0.0))
    again = _settled(site)
    assert len(again) >= 2 and not set(map(id, again)) & set(map(id, first)), f"{case}: a stale Settled is still used"


SCALARS = ((1.0, 0.0), (1.5, -0.5), (2, 0), (0.5, 1), (1.0, -0.0), (-1.0, 0.25), (3, 0.0))


@pytest.mark.parametrize("case", ("act_fwd", "add_tensor", "softmax_fwd", "pool_fwd", "bn_train"))
def test_replayed_calls_give_the_reference_numbers(emu, rng, case):
    """Call after call on the same buffers (bn_train's running statistics accumulate on both sides),
    alpha/beta changing between forms (beta 0 and not, ints, -0.0) and so between the recipe's keys."""
    import host_emu
    ins, outs, call = CASES[case](rng)
    hc, h = cc.cudnnCreate("cpu"), emu.handle()
    bufs = _f32({**ins, **outs})
    ref = {k: v.copy() for k, v in bufs.items()}
    dev = {k: host_emu.EmuArray(v) for k, v in bufs.items()}  # views of ``bufs``
    for i, (alpha, beta) in enumerate(SCALARS * 2):
        call(hc, ref, alpha, beta)
        call(h, dev, alpha, beta)
        assert_close({k: ref[k] for k in outs}, {k: bufs[k] for k in outs}, tol=1e-4)
    site = cc.LEGACY[{"act_fwd": "cudnnActivationForward", "add_tensor": "cudnnAddTensor",
                      "softmax_fwd": "cudnnSoftmaxForward", "pool_fwd": "cudnnPoolingForward",
                      "bn_train": "cudnnBatchNormalizationForwardTraining"}[case]]
    assert any(r[1] is not None for r in site.recipes.values()), "no recipe was made"


# -- the calls a recipe cannot make: the compiled function and its Python wrapper agree ------------------

def _outcome(fn, args, kwargs, outs: dict):
    try:
        fn(*args, **kwargs)
    except CuDNNError as e:
        return ("error", type(e).__name__, e.status, str(e))
    except TypeError as e:
        return ("type error", str(e))
    return ("ok", {k: np.array(v, copy=True) for k, v in outs.items()})


def _same(a, b):
    assert a[0] == b[0], (a, b)
    if a[0] != "ok":
        assert a == b
    else:
        for k in a[1]:
            np.testing.assert_array_equal(a[1][k], b[1][k], err_msg=k)


class _Capture:
    """A case's call with its arguments captured (the lambda's cc.<function> call)."""

    def __init__(self, call):
        self.call = call

    def args(self, h, bufs, alpha, beta):
        got = {}

        def hook(proceed, c_name, args, kwargs):
            got["c"] = (c_name, args)  # the last call (a case may query a size first)
            return proceed(args, kwargs)
        from cudnn_compat._core import registry
        registry.HOOKS.append(hook)
        try:
            self.call(h, bufs, alpha, beta)
        finally:
            registry.HOOKS.remove(hook)
        return got["c"]


def _mutations(c_name: str, args: tuple, fn) -> list:
    """(label, args, kwargs) forms of one call that the recipe hands to the Python path."""
    import inspect
    params = list(inspect.signature(fn).parameters)
    out = [("keywords", args[:-1], {params[-1]: args[-1]}), ("one argument short", args[:-1], {}),
           ("one argument more", args + (0,), {})]
    for name in ("alpha", "beta", "alpha1", "alpha2", "alphaDataDiff", "betaParamDiff"):
        if name in params:
            i = params.index(name)
            for label, v in (("np.float32", np.float32(0.75)), ("np.float64", np.float64(2.0)), ("bool", True),
                             ("c_float pointer", ctypes.pointer(ctypes.c_float(0.5))), ("array", np.array([1.25])),
                             ("huge int", 2 ** 40), ("None", None), ("a string", "1.0"), ("int -0", -0)):
                out.append((f"{name} {label}", args[:i] + (v,) + args[i + 1:], {}))
    if "epsilon" in params:
        i = params.index("epsilon")
        for label, v in (("tiny", 1e-12), ("int", 1), ("np", np.float32(1e-3))):
            out.append((f"epsilon {label}", args[:i] + (v,) + args[i + 1:], {}))
    for i, p in enumerate(params):
        if isinstance(args[i], np.ndarray) and args[i].dtype != np.uint8:
            for label, v in (("None", None), ("0", 0), ("a list", [1.0, 2.0]), ("float64", args[i].astype(np.float64)),
                             ("strided", np.repeat(args[i], 2)[::2].reshape(args[i].shape))):
                out.append((f"{p} {label}", args[:i] + (v,) + args[i + 1:], {}))
    for name in ("mode", "algo", "algorithm", "lrnMode"):
        if name in params:
            i = params.index(name)
            out.append((f"{name} np.int32", args[:i] + (np.int32(args[i]),) + args[i + 1:], {}))
            out.append((f"{name} float", args[:i] + (float(args[i]),) + args[i + 1:], {}))
    return out


@pytest.mark.parametrize("case", RECIPES + ("conv_fwd", "conv_bwd_data", "conv_bwd_filter", "conv_bias_act"))
def test_calls_the_recipe_cannot_make_go_the_python_way(rng, case):
    """On the CPU place: each mutated form of an armed call, through the compiled function and
    through its Python wrapper, on identical fresh buffers: the same outputs or the same error."""
    h = cc.cudnnCreate("cpu")
    ins, outs, call = (_conv_calls(rng, "cpu")[case] if case.startswith("conv") else CASES[case](rng))
    base = _f32({**ins, **outs})
    if "ws" in ins:
        base["ws"] = ins["ws"]
    work = {k: v.copy() for k, v in base.items()}
    for _ in range(4):
        call(h, work, 1.0, 0.0)
    c_name, args = _Capture(call).args(h, work, 1.0, 0.0)
    site = cc.LEGACY[c_name]
    assert type(site) is SITE
    assert any(r[1] is not None for r in site.recipes.values()), "armed"
    names = {id(v): k for k, v in work.items()}
    held = list(site.recipes.values())  # what every path below meets: no reference may stay behind
    counts = [sys.getrefcount(r) for r in held]
    for label, margs, kwargs in _mutations(c_name, args, site.general):
        results = []
        for fn in (site, site.general):
            fresh = {k: v.copy() for k, v in base.items()}
            swapped = tuple(fresh[names[id(a)]] if id(a) in names else a for a in margs)
            results.append(_outcome(fn, swapped, kwargs, {k: fresh[k] for k in outs}))
        try:
            _same(*results)
        except AssertionError as e:
            raise AssertionError(f"{case}: {label}: {e}") from None
    assert [sys.getrefcount(r) for r in held] == counts, "a reference to a recipe leaked"
    handles = [sys.getrefcount(r[1]) for r in held]  # (the Python path's caches may hold the handle once more)
    for _ in range(20):  # replayed calls
        call(h, work, 1.0, 0.0)
    assert [sys.getrefcount(r[1]) for r in held] == handles, "a reference to the handle leaked"


def test_a_stale_recipe_follows_the_new_settings(emu, rng):
    """An activation's mode changed after its recipe was made: the next call re-resolves (tanh)."""
    import host_emu
    S = (2, 3, 4, 5)
    xd, ad = tdesc(S), cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(ad, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    x, y = rng.standard_normal(S).astype(np.float32), np.zeros(S, np.float32)
    h = emu.handle()
    dx, dy = host_emu.EmuArray(x), host_emu.EmuArray(y)
    for _ in range(4):
        cc.cudnnActivationForward(h, ad, 1.0, xd, dx, 0.0, xd, dy)
    np.testing.assert_allclose(y, np.maximum(x, 0), rtol=1e-6)
    cc.cudnnSetActivationDescriptor(ad, cc.CUDNN_ACTIVATION_TANH, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    cc.cudnnActivationForward(h, ad, 1.0, xd, dx, 0.0, xd, dy)
    np.testing.assert_allclose(y, np.tanh(x), rtol=1e-5, atol=1e-6)
    for _ in range(3):
        cc.cudnnActivationForward(h, ad, 2.0, xd, dx, 0.0, xd, dy)
    np.testing.assert_allclose(y, 2 * np.tanh(x), rtol=1e-5, atol=1e-6)
    cc.cudnnDestroyActivationDescriptor(ad)
    with pytest.raises(CuDNNError, match="activationDesc"):
        cc.cudnnActivationForward(h, ad, 1.0, xd, dx, 0.0, xd, dy)



# -- the replay's resolved prepared call (_steady.c Settled) follows every change ----------------------

_SITE_OF = {"act_fwd": "cudnnActivationForward", "add_tensor": "cudnnAddTensor", "bn_train":
            "cudnnBatchNormalizationForwardTraining", "pool_bwd": "cudnnPoolingBackward", "op_tensor": "cudnnOpTensor",
            "softmax_fwd": "cudnnSoftmaxForward"}


def _settled(site) -> list:
    """The Settled objects of ``site``'s recipes (each recipe's last item: one slot per key)."""
    return [x for r in site.recipes.values() if len(r) == 13 for x in r[12] if x is not None]


@pytest.mark.parametrize("case", sorted(_SITE_OF))
def test_a_settled_replay_follows_every_change(emu, rng, case):
    """From its third call a replay runs its key's Settled (no dicts, no lookup of the prepared call).
    Call after call against the reference engine on the CPU place, through each change a Settled must
    see: other buffers, the prepared-call tables emptied (``bump``), the plans retired (plan cache
    cleared), an override and an environment setting in force (the Python path runs then), an output
    of another dtype in a new array (likely at the freed array's address: the same error as the
    Python wrapper's, nothing written)."""
    import host_emu
    from cudnn_compat._backend import config as _config
    from cudnn_compat._backend.plan_cache import CACHE
    from cudnn_compat._core import call as _call
    ins, outs, call = CASES[case](rng)
    hc, h = cc.cudnnCreate("cpu"), emu.handle()
    site = cc.LEGACY[_SITE_OF[case]]
    site.recipes.clear()  # only this test's call sites (earlier tests' recipes keep their own Settled)
    host = _f32({**ins, **outs})
    ref = {k: v.copy() for k, v in host.items()}
    dev = {k: host_emu.EmuArray(v) for k, v in host.items()}

    def both(alpha, beta):
        call(hc, ref, alpha, beta)
        call(h, dev, alpha, beta)
        assert_close({k: ref[k] for k in outs}, {k: host[k] for k in outs}, tol=1e-4)

    for _ in range(4):
        both(1.0, 0.0)
        both(1.5, 0.5)
    first = _settled(site)
    assert first and {type(x).__name__ for x in first} == {"Settled"}
    assert not _wrapper_frames(lambda: call(h, dev, 1.0, 0.0))
    call(hc, ref, 1.0, 0.0)

    def new_buffers():
        host.update({k: v.copy() for k, v in host.items()})
        dev.update({k: host_emu.EmuArray(v) for k, v in host.items()})

    changes = (("other buffers", new_buffers, None), ("tables emptied", _call.clear_prepared, None),
               ("plans retired", CACHE.clear, None),
               ("an override", None, lambda: _config.override("CUDNN_COMPAT_CPU_FALLBACK", "0")),
               ("an environment setting", None, lambda: pytest.MonkeyPatch.context()))
    for label, change, ctx in changes:
        before = _settled(site)
        if change is not None:
            change()
        for alpha, beta in ((2.0, 0.0), (0.5, 0.25), (1.0, 0.0), (3, 1)) * 2:
            if ctx is None:
                both(alpha, beta)
                continue
            with ctx() as mp:
                if mp is not None:
                    mp.setenv("CUDNN_COMPAT_ENGINE", "cupy")
                assert _wrapper_frames(lambda: call(h, dev, alpha, beta)), f"{label}: the Python path did not run"
            call(hc, ref, alpha, beta)
            assert_close({k: ref[k] for k in outs}, {k: host[k] for k in outs}, tol=1e-4)
        both(1.0, 0.0)
        assert not _wrapper_frames(lambda: call(h, dev, 1.0, 0.0)), f"{case}: {label}: not replayed after"
        call(hc, ref, 1.0, 0.0)
        if label in ("tables emptied", "plans retired"):  # each key's Settled was made again
            assert not set(map(id, _settled(site))) & set(map(id, before)), f"{label}: a stale Settled is still used"
    for _ in range(3):  # both keys replayed again: each slot holds a Settled made after the changes
        both(1.0, 0.0)
        both(0.5, 0.25)
    assert not set(map(id, _settled(site))) & set(map(id, first)), "a Settled of before the changes is still used"
    # an output of another dtype in a new array (the memo's weak reference tells it from the freed one)
    out = next(iter(outs))
    for _ in range(3):
        del dev[out]
        wrong = host_emu.EmuArray(host[out].astype(np.float64))
        dev[out] = wrong
        before = host[out].copy()
        got = _outcome(lambda *a: call(h, dev, 1.0, 0.0), (), {}, {})
        dev[out] = host_emu.EmuArray(host[out])
        assert got[0] == "error" and got[2] == cc.CUDNN_STATUS_BAD_PARAM, (case, got)
        np.testing.assert_array_equal(host[out], before)
        both(1.0, 0.0)

def test_in_place_with_other_strides_has_no_recipe(rng):
    """x == y with different strides is checked per call (BAD_PARAM): such a site gets no recipe, and
    every call still raises."""
    h = cc.cudnnCreate("cpu")
    S = (1, 2, 3, 3)
    xd, yd = tdesc(S), cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensor4dDescriptor(yd, cc.CUDNN_TENSOR_NHWC, cc.CUDNN_DATA_FLOAT, *S)
    ad = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(ad, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    x, y = rng.standard_normal(S).astype(np.float32), np.zeros(S, np.float32)
    for _ in range(4):
        cc.cudnnActivationForward(h, ad, 1.0, xd, x, 0.0, yd, y)
    for _ in range(3):
        with pytest.raises(CuDNNError, match="in-place"):
            cc.cudnnActivationForward(h, ad, 1.0, xd, x, 0.0, yd, x)
    recipes = cc.cudnnActivationForward.recipes
    assert recipes and all(r[1] is None for k, r in recipes.items() if k[3] is yd)
    # a call that meets such a site's entry holds no reference after it (each call had leaked one)
    (r,) = [r for k, r in recipes.items() if k[3] is yd]
    before = sys.getrefcount(r)
    for _ in range(50):
        cc.cudnnActivationForward(h, ad, 1.0, xd, x, 0.0, yd, y)
    assert sys.getrefcount(r) == before


def test_a_trace_sees_replayable_calls(tmp_path, rng):
    """A legacy hook (the tracer) is in front of every call: a site with a recipe hands it over."""
    h = cc.cudnnCreate("cpu")
    ins, outs, call = CASES["act_fwd"](rng)
    bufs = _f32({**ins, **outs})
    for _ in range(4):
        call(h, bufs, 1.0, 0.0)
    seen = []
    from cudnn_compat._core import registry

    def hook(proceed, c_name, args, kwargs):
        seen.append(c_name)
        return proceed(args, kwargs)
    registry.HOOKS.append(hook)
    try:
        call(h, bufs, 1.0, 0.0)
    finally:
        registry.HOOKS.remove(hook)
    assert seen == ["cudnnActivationForward"]


def test_a_site_binds_as_a_method_and_is_collected():
    import gc
    import weakref

    class Holder:
        f = cc.cudnnAddTensor
    assert Holder.f is cc.cudnnAddTensor
    mod = _steady_mod.module()
    from cudnn_compat._core import call, registry
    from cudnn_compat._core.descriptor import EPOCH
    seen = []

    def general(*a):
        seen.append(a)
    site = mod.Site(general, registry.HOOKS, EPOCH, 2, (0,), (), lambda *a: None, call.run, 8)
    assert site(1, 2) is None and seen == [(1, 2)]
    site.me = site  # a cycle through its __dict__
    ref = weakref.ref(site)
    del site
    gc.collect()
    assert ref() is None


def test_op_tensor_b_aliasing_c_is_refused_after_its_recipe(native_emu, rng):
    """opTensor's per-call rule (B may not be the output C unless C is A, 002 §3.2.68) on an armed
    site: B a different array object over C's memory is refused as the Python path refuses it."""
    import host_emu
    ins, outs, call = CASES["op_tensor"](rng)
    h = native_emu.handle()
    host = _f32({**ins, **outs})
    dev = {k: host_emu.EmuArray(v) for k, v in host.items()}
    for _ in range(4):
        call(h, dev, 1.0, 0.0)
    assert not _wrapper_frames(lambda: call(h, dev, 1.0, 0.0))
    alias = dict(dev, b=host_emu.EmuArray(host["c"]))  # another object, C's pointer
    assert alias["b"] is not dev["c"] and alias["b"].data.ptr == dev["c"].data.ptr
    with pytest.raises(CuDNNError, match="B may not be the output buffer C"):
        call(h, alias, 1.0, 0.0)
    inplace = dict(dev, a=dev["c"], b=host_emu.EmuArray(host["c"]))  # C is A: allowed
    call(h, inplace, 1.0, 0.0)


@pytest.mark.gpu
@pytest.mark.parametrize("case", RECIPES + ("conv_fwd", "conv_bwd_data", "conv_bwd_filter", "conv_bias_act"))
def test_gpu_replayed_calls_give_the_reference_numbers(case, rng):
    """On the device: the same buffers call after call (from the fourth on through the recipe),
    alpha/beta changing between forms that pick other keys, each call against the reference
    engine on a CPU handle; the Python wrapper ran for none of the last calls."""
    import cupy
    h, hc = cc.cudnnCreate("gpu"), cc.cudnnCreate("cpu")
    ins, outs, call = (_conv_calls(rng, "gpu")[case] if case.startswith("conv") else CASES[case](rng))
    bufs = _f32({**ins, **outs})
    if "ws" in ins:
        bufs["ws"] = ins["ws"]
    ref = {k: v.copy() for k, v in bufs.items()}
    dev = {k: cupy.asarray(v) for k, v in bufs.items()}
    for alpha, beta in SCALARS + SCALARS[:3]:
        if case == "conv_bias_act":
            beta = 0.0 if beta == 0 else 1.0  # alpha2: the cuDNN fused call blends z, y the output
        call(hc, ref, alpha, beta)
        call(h, dev, alpha, beta)
        got = {k: cupy.asnumpy(dev[k]) for k in outs}
        assert_close({k: ref[k] for k in outs}, got, tol=5e-3 if case.startswith("conv") else 1e-4)
    if case == "conv_bias_act":
        return  # its float32 NCHW plan here took no prepared call on the device (0a52c7b..41cb571): the numbers are the check
    for _ in range(3):  # the native engine replays a graph per set of scalar values: these ones, warm
        call(h, dev, 1.0, 0.0)
    cupy.cuda.get_current_stream().synchronize()
    assert not _wrapper_frames(lambda: call(h, dev, 1.0, 0.0)), f"{case}: not replayed"


# -- bound recipes (graphs at byte offsets in the buffers): dropout forward/backward, RNNForward ------------

def _dropout_calls(h, b, S):
    """Dropout forward and backward on ``b`` (x, y, res, dy, dx, states), the descriptor given the
    states once (a restore per call would change the settings every call)."""
    d = tdesc(S)
    res = cc.cudnnDropoutGetReserveSpaceSize(d)
    dd = cc.cudnnCreateDropoutDescriptor()
    cc.cudnnRestoreDropoutDescriptor(dd, h, 0.5, b["states"], 64, 0)
    return {"fwd": lambda bb=b: cc.cudnnDropoutForward(h, dd, d, bb["x"], d, bb["y"], bb["res"], res),
            "bwd": lambda bb=b: cc.cudnnDropoutBackward(h, dd, d, bb["dy"], d, bb["dx"], bb["res"], res)}


def _dropout_buffers(rng, S=(2, 3, 4, 5)):
    n = int(np.prod(S))
    states = np.zeros(64, np.uint8)
    states[:16] = np.array([1234, 0, 0, 0], "<i4").view(np.uint8)
    res = cc.cudnnDropoutGetReserveSpaceSize(tdesc(S))
    return S, {"x": rng.standard_normal(S).astype(np.float32), "y": np.zeros(S, np.float32),
               "res": np.zeros(res, np.uint8), "dy": rng.standard_normal(S).astype(np.float32),
               "dx": np.zeros(S, np.float32), "states": states, "n": n}


def test_dropout_replays_with_the_reference_masks(emu, rng):
    """Forward then backward, call after call on one descriptor (the states advance on both sides):
    y, the mask, dx and the states equal the CPU reference engine's; from the fourth call on neither
    function runs its Python wrapper."""
    import host_emu
    S, host = _dropout_buffers(rng)
    host.pop("n")
    ref = {k: v.copy() for k, v in host.items()}
    calls_ref = _dropout_calls(cc.cudnnCreate("cpu"), ref, S)
    dev = {k: host_emu.EmuArray(v) for k, v in host.items()}
    calls = _dropout_calls(emu.handle(), dev, S)
    for i in range(6):
        for which in ("fwd", "bwd"):
            calls_ref[which]()
            calls[which]()
        for k in ("y", "res", "dx", "states"):
            np.testing.assert_array_equal(host[k], ref[k], err_msg=f"call {i}: {k}")
        assert host["res"].any() and not host["res"].all()
    for which in ("fwd", "bwd"):
        calls_ref[which]()
        assert not _wrapper_frames(calls[which]), f"dropout {which}: the call ran its Python wrapper"
    for k in ("y", "res", "dx", "states"):
        np.testing.assert_array_equal(host[k], ref[k], err_msg=f"the replayed calls: {k}")


def test_a_bound_replay_binds_each_call_its_own_buffers(emu, rng):
    """replay_bound's per-buffer memo (the last array that passed each buffer's checks, by weak
    reference): dropout forward through two buffer sets in turn, then with y replaced by a new array
    (the old one freed), writes each call's own y and reserve space, equal to the CPU reference
    engine's (the states advance on both sides), from the compiled path; the memo holds the arrays."""
    import host_emu
    S, host = _dropout_buffers(rng)
    host.pop("n")
    other = {k: (v if k == "states" else v.copy()) for k, v in host.items()}
    ref = {k: v.copy() for k, v in host.items()}
    ref_other = {k: (ref["states"] if k == "states" else v.copy()) for k, v in other.items()}
    fwd_ref = _dropout_calls(cc.cudnnCreate("cpu"), ref, S)["fwd"]
    dev = {k: host_emu.EmuArray(v) for k, v in host.items()}
    dev_other = {k: (dev["states"] if k == "states" else host_emu.EmuArray(v)) for k, v in other.items()}
    hd = emu.handle()
    fwd = _dropout_calls(hd, dev, S)["fwd"]
    ext = _steady_mod.module()
    for i, which in enumerate("AABABBABAAAAB"):
        (h, r, d, rr) = (host, ref, dev, ref) if which == "A" else (other, ref_other, dev_other, ref_other)
        if i in (6, 9):  # a new y for A (the old array freed; at 9 right after a call of A): bound by its own address
            host["y"] = np.zeros(S, np.float32)
            dev["y"] = host_emu.EmuArray(host["y"])
            ref["y"] = np.zeros(S, np.float32)
        if i == 10:  # new contents in the same x: the stage's Settled binds the same addresses, reads them
            h["x"][...] = rng.standard_normal(S)
            r["x"][...] = h["x"]
        if i == 11:  # every Settled stale: the stage takes the dict path and settles again
            ext.bump()
        h["y"][...] = -1
        fwd_ref(bb=rr)
        frames = _wrapper_frames(lambda: fwd(bb=d))
        assert i < 1 or not frames, f"call {i} ({which}): the call ran its Python wrapper"
        for k in ("y", "res"):
            np.testing.assert_array_equal(h[k], r[k], err_msg=f"call {i} ({which}): {k}")
        np.testing.assert_array_equal(host["states"], ref["states"], err_msg=f"call {i}: states")
    site = cc.LEGACY["cudnnDropoutForward"]
    bound = [r[11] for r in site.recipes.values() if r[1] is hd and r[11] is not None]  # this handle's
    held = [m[0]() for b in bound for m in b[4] if isinstance(m, tuple)]
    assert any(a is dev["res"] or a is dev_other["res"] for a in held), "the memo holds the arrays that passed"
    memos = [st[4] for b in bound for st in b[3]]
    assert memos and all(type(m[3]).__name__ == "Settled" for m in memos), "each stage settled on its last buffers"
    assert all(isinstance(m[4], tuple) for m in memos), "x and y, bound as they are, remembered by weak reference"
    assert not any(a is dev["y"] or a is dev["x"] for m in memos for a in (m[1], m[2])), "no caller's array kept"


def _bound_mutations(args: tuple, params: list, to_dev, to_host) -> list:
    """(label, args) forms of a bound recipe's call that it hands to the Python path: NULL, foreign,
    typed-wrong, too small or strided buffers, sizes of other types or too small, another count.
    ``to_dev``/``to_host``: a NumPy array to the place's device array type and back."""
    out = [("one argument short", args[:-1]), ("one argument more", args + (0,))]
    dev_type = type(to_dev(np.zeros(1, np.float32)))
    for i, (p, a) in enumerate(zip(params, args)):
        if type(a) is dev_type:
            h = to_host(a)
            small = to_dev(h.reshape(-1)[:1].copy())
            strided = to_dev(np.repeat(h.reshape(-1), 2))[::2]
            for label, v in (("None", None), ("0", 0), ("one element", small),  # (a host array: no emulated copy)
                             ("strided", strided), ("float64", to_dev(h.astype(np.float64))),
                             ("a list", [1.0])):
                out.append((f"{p} {label}", args[:i] + (v,) + args[i + 1:]))
        elif type(a) is int and "Size" in p:
            for label, v in (("short by one", a - 1), ("np.int64", np.int64(a)), ("float", float(a)), ("None", None),
                             ("huge", 2 ** 70)):
                out.append((f"{p} {label}", args[:i] + (v,) + args[i + 1:]))
    return out


def test_dropout_calls_the_recipe_cannot_make_go_the_python_way(emu, rng):
    """The class test for a bound recipe, on the emulated GPU place: each mutated form of an armed
    dropout call through the compiled function and through its Python wrapper, from the same buffer
    contents: the same outputs (states included) or the same error, status and message."""
    import host_emu
    S, host = _dropout_buffers(rng)
    host.pop("n")
    base = {k: v.copy() for k, v in host.items()}
    dev = {k: host_emu.EmuArray(v) for k, v in host.items()}
    calls = _dropout_calls(emu.handle(), dev, S)
    for which in ("fwd", "bwd"):
        for _ in range(4):
            calls[which]()
        c_name, args = _Capture(lambda *_: calls[which]()).args(None, None, None, None)
        site = cc.LEGACY[c_name]
        assert any(r[1] is not None for r in site.recipes.values()), "armed"
        import inspect
        params = list(inspect.signature(site.general).parameters)
        for label, margs in _bound_mutations(args, params, host_emu.EmuArray, lambda a: a.host):
            results = []
            for fn in (site, site.general):
                for k, v in base.items():
                    host[k][...] = v
                results.append(_outcome(fn, margs, {}, {k: host[k] for k in ("y", "res", "dx", "states")}))
            try:
                _same(*results)
            except AssertionError as e:
                raise AssertionError(f"dropout {which}: {label}: {e}") from None


# RNNForward's bound recipe: its stages (projection, recurrence per layer) run from C on the device
RNN_CASES = {  # mode, layers, bidirectional, training, dropout, the state buffers given
    "lstm_inference": ("LSTM", 1, False, False, 0.0, ("hx", "hy", "cx", "cy")),
    "gru_bidir_training_dropout": ("GRU", 2, True, True, 0.3, ("hy",)),
    "lstm_two_layers_training": ("LSTM", 2, False, True, 0.0, ("hx", "hy")),
}


def _rnn(h, xp, case: str, host: dict):
    """An RNNForward call of ``case`` on handle ``h``: (call, buffers on the place (xp), outputs);
    ``host`` (filled on the first use) keeps the inputs, so every place gets the same numbers."""
    mode, L, bidir, training, p, given = RNN_CASES[case]
    T, B, I, H = 3, 2, 4, 5
    D = 2 if bidir else 1
    F32 = cc.CUDNN_DATA_FLOAT
    dd = cc.cudnnCreateDropoutDescriptor()
    nst = cc.cudnnDropoutGetStatesSize(h)
    states = xp.zeros(nst, np.uint8)
    cc.cudnnSetDropoutDescriptor(dd, h, p, states if p else None, nst if p else 0, 777)
    rd = cc.cudnnCreateRNNDescriptor()
    cc.cudnnSetRNNDescriptor_v8(rd, cc.CUDNN_RNN_ALGO_STANDARD, getattr(cc, f"CUDNN_{mode}"), cc.CUDNN_RNN_DOUBLE_BIAS,
                                cc.CUDNN_BIDIRECTIONAL if bidir else cc.CUDNN_UNIDIRECTIONAL, cc.CUDNN_LINEAR_INPUT,
                                F32, F32, cc.CUDNN_FMA_MATH, I, H, H, L, dd, cc.CUDNN_RNN_PADDED_IO_ENABLED)  # no TF32
    xd, yd = cc.cudnnCreateRNNDataDescriptor(), cc.cudnnCreateRNNDataDescriptor()
    cc.cudnnSetRNNDataDescriptor(xd, F32, cc.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, T, B, I, [T, 2], None)
    cc.cudnnSetRNNDataDescriptor(yd, F32, cc.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, T, B, D * H, [T, 2], None)
    hd = tdesc((L * D, B, H))
    fmode = cc.CUDNN_FWD_MODE_TRAINING if training else cc.CUDNN_FWD_MODE_INFERENCE
    wsz = cc.cudnnGetRNNWeightSpaceSize(h, rd)
    wss, rss = cc.cudnnGetRNNTempSpaceSizes(h, rd, fmode, xd)
    if not host:
        r = np.random.default_rng(5)
        host.update(x=r.standard_normal(T * B * I).astype(np.float32), w=(r.standard_normal(wsz // 4) * 0.3).astype(np.float32),
                    hx=r.standard_normal(L * D * B * H).astype(np.float32), cx=r.standard_normal(L * D * B * H).astype(np.float32))
    b = {k: xp.asarray(v) for k, v in host.items()}
    b.update(y=xp.zeros(T * B * D * H, np.float32), hy=xp.zeros(L * D * B * H, np.float32),
             cy=xp.zeros(L * D * B * H, np.float32), ws=xp.zeros(max(wss, 1), np.uint8), rs=xp.zeros(max(rss, 1), np.uint8),
             seq=xp.asarray(np.array([T, 2], np.int32)), states=states)  # (the descriptor's: reset with the rest)
    state = {k: (b[k] if k in given else None) for k in ("hx", "hy", "cx", "cy")}
    cd = hd if mode == "LSTM" else None

    def call(bb=b):
        cc.cudnnRNNForward(h, rd, fmode, bb["seq"], xd, bb["x"], yd, bb["y"], hd, state["hx"] if "hx" in given else None,
                           bb["hy"] if "hy" in given else None, cd, bb["cx"] if "cx" in given and cd else None,
                           bb["cy"] if "cy" in given and cd else None, wsz, bb["w"], wss, bb["ws"], rss if training else 0,
                           bb["rs"] if training else None)
    return call, b, ["y"] + [k for k in ("hy", "cy") if k in given and (k == "hy" or cd)]


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(RNN_CASES))
def test_gpu_rnn_forward_replays_with_the_reference_numbers(case):
    """RNNForward call after call on the device against the CPU reference engine (dropout masks
    advancing on both sides); from the fourth call on its Python wrapper does not run."""
    import cupy
    host: dict = {}
    call_ref, ref, outs = _rnn(cc.cudnnCreate("cpu"), np, case, host)
    call, dev, _ = _rnn(cc.cudnnCreate("gpu"), cupy, case, host)
    for i in range(6):
        call_ref()
        call()
        for k in outs:
            np.testing.assert_allclose(cupy.asnumpy(dev[k]), ref[k], rtol=2e-4, atol=2e-5, err_msg=f"call {i}: {k}")
    call_ref()
    cupy.cuda.get_current_stream().synchronize()
    assert not _wrapper_frames(call), f"{case}: not replayed"
    for k in outs:
        np.testing.assert_allclose(cupy.asnumpy(dev[k]), ref[k], rtol=2e-4, atol=2e-5, err_msg=f"replayed: {k}")


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["lstm_inference", "lstm_two_layers_training"])
def test_gpu_rnn_forward_replay_follows_the_buffers(case):
    """Two sets of buffers in turn through one armed RNNForward (replay_bound keeps the last call's
    bindings by address, for the next call with the same addresses): every call writes its own
    outputs, equal to the reference engine's, and the replay path takes both sets."""
    import cupy
    host: dict = {}
    call_ref, ref, outs = _rnn(cc.cudnnCreate("cpu"), np, case, host)
    call, dev, _ = _rnn(cc.cudnnCreate("gpu"), cupy, case, host)
    other = {k: (v if k == "states" else v.copy()) for k, v in dev.items()}
    call_ref()
    for i in range(9):
        bb = other if i % 3 == 2 else dev  # A A B A A B ...
        for k in outs:
            bb[k].fill(0)
        call(bb)
        for k in outs:
            np.testing.assert_allclose(cupy.asnumpy(bb[k]), ref[k], rtol=2e-4, atol=2e-5, err_msg=f"call {i}: {k}")
    for bb in (dev, other):
        assert not _wrapper_frames(lambda bb=bb: call(bb)), f"{case}: not replayed"


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(RNN_CASES))
def test_gpu_rnn_forward_calls_the_recipe_cannot_make_go_the_python_way(case):
    """The class test of RNNForward's bound recipe on the device: each mutated form of an armed
    call through the compiled function and through its Python wrapper, from the same buffer
    contents: the same outputs or the same error, status and message."""
    import cupy
    import inspect
    host: dict = {}
    call, dev, outs = _rnn(cc.cudnnCreate("gpu"), cupy, case, host)
    base = {k: v.copy() for k, v in dev.items()}
    for _ in range(4):
        call()
    c_name, args = _Capture(lambda *_: call()).args(None, None, None, None)
    site = cc.LEGACY[c_name]
    assert any(r[1] is not None for r in site.recipes.values()), "armed"
    params = list(inspect.signature(site.general).parameters)
    for label, margs in _bound_mutations(args, params, cupy.asarray, cupy.asnumpy):
        results = []
        for fn in (site, site.general):
            for k, v in base.items():
                dev[k][...] = v
            got = _outcome(fn, margs, {}, {})
            if got[0] == "ok":
                got = ("ok", {k: cupy.asnumpy(dev[k]) for k in outs})
            results.append(got)
        try:
            _same(*results)
        except AssertionError as e:
            raise AssertionError(f"{case}: {label}: {e}") from None
