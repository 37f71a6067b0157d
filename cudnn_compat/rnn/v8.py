"""The v8 RNN compute calls (002 §7.2.36 cudnnRNNForward, §8.2.18 cudnnRNNBackwardData_v8,
§8.2.21 cudnnRNNBackwardWeights_v8, §7.2.30 cudnnGetRNNTempSpaceSizes), and the checks and
the dispatch into rnn/core.py that the legacy calls (rnn/legacy.py) share.

Every rule below is checked before the first graph runs; the message names the argument.
BAD_PARAM: NULL descriptors or data, settings that disagree between rnnDesc, xDesc, yDesc,
hDesc and cDesc, unpacked layouts without CUDNN_RNN_PADDED_IO_ENABLED, unsorted packed
batches, buffers smaller than the size queries say.  NOT_SUPPORTED: variable sequence lengths
or DOUBLE data with a persistent algo (002 lists both).
"""
from __future__ import annotations

from cudnn_compat._backend import dtypes
from cudnn_compat._backend.ir import packed_strides
from .._core import bound_graph as bg
from .._core.data import unread
from .._core.memo import Memo, call_site
from .._core.recipes import Bound, Recipe, steady
from .._core.registry import legacy
from ..dropout import require_states
from ..enums import ENUMS
from ..errors import check, not_supported
from ..handle import get_handle
from .core import LAYOUTS, Call, Geometry, config_of, prepare_stages, run, spaces, weight_space_size
from .desc import E, PADDED_IO, PERSIST, check_call_types, rnn_data_desc, rnn_desc
from ..tensor import tensor_desc

FWD_TRAINING = ENUMS["cudnnForwardMode_t"]["CUDNN_FWD_MODE_TRAINING"]
FWD_INFERENCE = ENUMS["cudnnForwardMode_t"]["CUDNN_FWD_MODE_INFERENCE"]
WGRAD_ADD = ENUMS["cudnnWgradMode_t"]["CUDNN_WGRAD_MODE_ADD"]


def rnn_for_call(rnnDesc):
    d = rnn_desc(rnnDesc)
    check(d.api == "v8", "rnnDesc", "was configured with cudnnSetRNNDescriptor_v6; the v8 calls need "
          "cudnnSetRNNDescriptor_v8 (its inputSize and dataType)")
    return d


# -- checks shared by both generations -----------------------------------------------------------

def check_algo(d, geo, cfg) -> None:
    if d.algo in PERSIST and not geo.uniform:
        raise not_supported("rnnDesc", "variable sequence lengths are not supported with a persistent algo")
    if d.algo == E["CUDNN_RNN_ALGO_PERSIST_STATIC"] and cfg.dtype == "float64":
        raise not_supported("rnnDesc", "DOUBLE data is not supported with CUDNN_RNN_ALGO_PERSIST_STATIC")


def data_geometry(d, xd, argname="xDesc") -> Geometry:
    """Geometry of an RNN data descriptor, with the layout rules of 002 §7.2.47/§7.2.36."""
    layout = LAYOUTS[xd.layout]
    if layout != "PACKED":
        check(d.auxFlags & PADDED_IO, argname, "unpacked (padded) layouts need CUDNN_RNN_PADDED_IO_ENABLED in rnnDesc "
              "(auxFlags or cudnnSetRNNPaddingMode)")
    lengths = tuple(xd.seqLengthArray)
    if layout == "PACKED":
        check(all(a >= b for a, b in zip(lengths, lengths[1:])), argname,
              "the packed layout needs sequences sorted by decreasing length")
        check(max(lengths) in (0, xd.maxSeqLength), argname,
              f"maxSeqLength {xd.maxSeqLength} must equal the longest sequence ({max(lengths)}) in the packed layout")
    return Geometry(layout, xd.maxSeqLength, xd.batchSize, lengths)


def check_same_data(xd, yd, xn, yn) -> None:
    for attr in ("dataType", "layout", "maxSeqLength", "batchSize", "seqLengthArray"):
        check(getattr(xd, attr) == getattr(yd, attr), yn, f"{attr} must equal {xn}'s")


def check_state_desc(desc, argname, cfg, B, width, used: bool):
    """hDesc/cDesc: NULL only when none of its buffers is given; else [L*dirs, batch, width], packed."""
    if bg.is_null(desc):
        check(not used, argname, "is NULL but a buffer it describes is not")
        return None
    sd = tensor_desc(desc, argname)
    want = (cfg.pseudo_layers, B, width)
    check(tuple(sd.dims) == want, argname, f"dims must be [numLayers*dirs, batch, width] = {list(want)}, got {list(sd.dims)}")
    check(tuple(sd.strides) == packed_strides(sd.dims), argname, "must be fully packed")
    check(sd.dtype == cfg.dtype, argname, f"data type {sd.dtype} must be the RNN's {cfg.dtype}")
    return sd


def check_sizes(cfg, geo, training, weightSpaceSize, workSpaceSize, reserveSpaceSize, wname="weightSpaceSize",
                need_reserve=None) -> None:
    check_given_sizes(weight_space_size(cfg), spaces(cfg, geo), training if need_reserve is None else need_reserve,
                      weightSpaceSize, workSpaceSize, reserveSpaceSize, wname)


def check_given_sizes(need_w: int, sp, need_reserve: bool, weightSpaceSize, workSpaceSize, reserveSpaceSize,
                      wname="weightSpaceSize") -> None:
    """``check_sizes`` with the weight space size and the spaces already worked out (a call site's)."""
    # each message is made only when its check fails (a per-call path)
    if int(weightSpaceSize) < need_w:
        check(False, wname, f"{weightSpaceSize} is less than the weight space size {need_w}")
    if int(workSpaceSize) < sp.ws_size:
        check(False, "workSpaceSize", f"{workSpaceSize} is less than the {sp.ws_size} bytes needed")
    if need_reserve and int(reserveSpaceSize) < sp.rs_size:
        check(False, "reserveSpaceSize", f"{reserveSpaceSize} is less than the {sp.rs_size} bytes training needs")


def dropout_in_effect(d, cfg, training: bool) -> float:
    dd = d.dropoutDesc
    if not training or cfg.L < 2 or dd is None or dd.dropout == 0:
        return 0.0
    require_states(dd, "rnnDesc.dropoutDesc")
    return dd.dropout


def values(d) -> dict:
    dd = d.dropoutDesc
    return {"zero": 0.0, "fill": 0.0, "lclip": d.lclip, "rclip": d.rclip, "scale": dd.scale if dd is not None else 1.0}


def buffer_specs(cfg, geo, sp) -> dict:
    """name -> (argname, (dtype or None, bytes needed)) of every buffer of a call: the data,
    state and weight buffers hold the RNN's data type; workspace, reserve space and dropout
    states are untyped."""
    from ..dropout import STATES_SIZE
    isz = dtypes.itemsize(cfg.dtype)
    V = cfg.D * cfg.Hout
    sizes = {"x": geo.N * cfg.I, "dx": geo.N * cfg.I, "y": geo.N * V, "dy": geo.N * V}
    for name in ("hx", "hy", "dhx", "dhy"):
        sizes[name] = cfg.pseudo_layers * geo.B * cfg.Hout
    for name in ("cx", "cy", "dcx", "dcy"):
        sizes[name] = cfg.pseudo_layers * geo.B * cfg.H
    specs = {name: (name, (cfg.dtype, n * isz)) for name, n in sizes.items()}
    specs["w"] = ("weightSpace", (cfg.dtype, weight_space_size(cfg)))
    specs["dw"] = ("dweightSpace", (cfg.dtype, weight_space_size(cfg)))
    specs["ws"] = ("workSpace", (None, sp.ws_size))
    specs["rs"] = ("reserveSpace", (None, sp.rs_size))
    specs["states"] = ("rnnDesc.dropoutDesc.states", (None, STATES_SIZE))
    return specs


STATE_NAMES = frozenset(("hx", "cx", "hy", "cy", "dhy", "dcy", "dhx", "dcx"))


class Dispatch:
    """What a call of ``kind`` fixes once its descriptors and the set of buffers it was given are
    known (built once per call site, rnn/v8.py ``_fwd_site``, or per call): the ``Call``, the
    buffer specs, the scalar values, the dropout probability in effect, the stages (keys and
    graphs, ``core.prepare_stages``, made on first use)."""

    __slots__ = ("call", "kind", "specs", "vals", "p", "staged")

    def __init__(self, d, cfg, geo, kind: str, training: bool, given, fill=None, argnames=None):
        self.specs = buffer_specs(cfg, geo, spaces(cfg, geo))
        for k, name in (argnames or {}).items():
            self.specs[k] = (name, self.specs[k][1])
        self.p = dropout_in_effect(d, cfg, training)
        present = frozenset(k for k in given if k in STATE_NAMES and ("c" not in k or cfg.mode == "LSTM"))
        self.call = Call(cfg, geo, training, present, self.p, fill is not None and kind == "forward")
        self.kind = kind
        self.vals = values(d)
        if fill is not None:
            self.vals["fill"] = fill
        self.staged = None

    def run(self, handle, d, bufs: dict) -> None:
        if self.p > 0:
            bufs["states"] = d.dropoutDesc.states
        staged = self.staged
        if staged is None:
            staged = self.staged = prepare_stages(self.call, self.kind)
        run(handle, self.call, self.kind, bufs, self.vals, self.specs, staged)  # every buffer checked first


def check_spaces_given(bufs: dict, training: bool) -> None:
    """NULL workspace (or reserve space in training) is BAD_PARAM."""
    check(bufs.get("ws") is not None, "workSpace", "is NULL")
    if training:
        check(bufs.get("rs") is not None, "reserveSpace", "is NULL")


def dispatch(handle, d, cfg, geo, kind: str, training: bool, bufs: dict, fill=None, argnames=None) -> None:
    """Run ``kind`` (forward / backward_data / backward_weights) on the checked arguments;
    ``argnames``: buffer -> the caller's parameter name where it is not the v8 one (legacy w, dw)."""
    bufs = {k: v for k, v in bufs.items() if not bg.is_null(v)}
    check_spaces_given(bufs, training)
    Dispatch(d, cfg, geo, kind, training, bufs, fill, argnames).run(handle, d, bufs)


# -- v8 calls ------------------------------------------------------------------------------------

def data_pair(d, xDesc, yDesc, xn="xDesc", yn="yDesc"):
    """Config and geometry of a call from its RNN data descriptors (v6 descriptors take
    dataType and inputSize from xDesc)."""
    xd, yd = rnn_data_desc(xDesc, xn), rnn_data_desc(yDesc, yn)
    check_call_types(d, xd.dataType, xd.vectorSize, xn)
    cfg = config_of(d, xd.dataType, xd.vectorSize)
    check_same_data(xd, yd, xn, yn)
    check(yd.vectorSize == cfg.D * cfg.Hout, yn, f"vectorSize {yd.vectorSize} must be "
          f"{'2 x ' if cfg.D == 2 else ''}{'projSize' if cfg.proj else 'hiddenSize'} = {cfg.D * cfg.Hout}")
    geo = data_geometry(d, xd, xn)
    check_algo(d, geo, cfg)
    return cfg, geo, xd, yd


@legacy("cudnnGetRNNTempSpaceSizes")
def getRNNTempSpaceSizes(handle, rnnDesc, fMode, xDesc) -> tuple:
    """(workSpaceSize, reserveSpaceSize); reserve is 0 for CUDNN_FWD_MODE_INFERENCE."""
    get_handle(handle)
    d = rnn_for_call(rnnDesc)
    check(fMode in (FWD_INFERENCE, FWD_TRAINING), "fMode", f"{fMode!r} is not a cudnnForwardMode_t")
    xd = rnn_data_desc(xDesc, "xDesc")
    check_call_types(d, xd.dataType, xd.vectorSize, "xDesc")
    cfg = config_of(d)
    sp = spaces(cfg, data_geometry(d, xd))
    return sp.ws_size, (sp.rs_size if fMode == FWD_TRAINING else 0)


_FWD_BUFFERS = ("x", "y", "hx", "hy", "cx", "cy", "w", "ws", "rs")  # RNNForward's ``bufs``, in order
_FWD_PARAMS = {"w": "weightSpace", "ws": "workSpace", "rs": "reserveSpace"}  # the others are their own parameter


def _given(values) -> tuple:
    """The names of RNNForward's buffers (``values`` in ``_FWD_BUFFERS`` order) that are not NULL."""
    return tuple(k for k, v in zip(_FWD_BUFFERS, values) if not bg.is_null(v))


@legacy("cudnnRNNForward", cupy="RNNForward")
def RNNForward(handle, rnnDesc, fwdMode, devSeqLengths, xDesc, x, yDesc, y, hDesc, hx, hy, cDesc, cx, cy,
               weightSpaceSize, weightSpace, workSpaceSize, workSpace, reserveSpaceSize, reserveSpace) -> None:
    """v8 RNN forward, inference or training (fwdMode), over RNN data descriptors (002 §7.2.36)."""
    # the descriptor checks and everything they fix (config, geometry, sizes, the stages' graphs) are
    # worked out once per call site (``_fwd_site``); every call checks its data
    bufs = dict(zip(_FWD_BUFFERS, (x, y, hx, hy, cx, cy, weightSpace, workSpace, reserveSpace)))
    given = _given(bufs.values())
    sk = (handle, rnnDesc, fwdMode, xDesc, yDesc, hDesc, cDesc, given)
    h, d, cfg, geo, training, (need_w, sp), parts = _fwd_site(sk, handle, rnnDesc, fwdMode, devSeqLengths, xDesc,
                                                             yDesc, hDesc, cDesc, given)
    check(not bg.is_null(devSeqLengths), "devSeqLengths", "is NULL (a device copy of seqLengthArray is required)")
    unread(h, devSeqLengths, "devSeqLengths")  # the lengths come from xDesc; still a buffer
    check("x" in given, "x", "is NULL")
    check("y" in given, "y", "is NULL")
    check_given_sizes(need_w, sp, training, weightSpaceSize, workSpaceSize, reserveSpaceSize)
    names, fill, disp = parts
    used = {k: bufs[k] for k in given if k in names}
    check_spaces_given(used, training)
    if not disp:  # first call of the site (after the checks above, as the general order has them)
        disp.append(Dispatch(d, cfg, geo, "forward", training, used, fill))
    disp[0].run(h, d, used)


def _fwd_arm_key(args) -> tuple:
    """RNNForward's site key (``sk``) from its arguments."""
    (handle, rnnDesc, fwdMode, _lens, xDesc, x, yDesc, y, hDesc, hx, hy, cDesc, cx, cy, _wss, w, _wks, ws, _rss,
     rs) = args
    return (handle, rnnDesc, fwdMode, xDesc, yDesc, hDesc, cDesc, _given((x, y, hx, hy, cx, cy, w, ws, rs)))


def _fwd_recipe(h, d, cfg, geo, training, sizes, parts):
    """RNNForward's steady recipe on the GPU place (``_core.recipes.Bound``): its stages bound as
    ``core.run`` binds them after ``preflight(..., pointers=True)``, the buffers it was given
    checked as that preflight checks them, the state buffers it was not given NULL, the size
    arguments at least the sizes; devSeqLengths a buffer, unread."""
    names, _fill, disp = parts
    if h.place != "gpu" or not disp or disp[0].staged is None:
        return None
    dp = disp[0]
    (prepared, _written), specs = dp.staged, dp.specs
    need_w, sp = sizes
    used = [k for k in _FWD_BUFFERS if k in names and (k not in STATE_NAMES or k in dp.call.present)]
    buffers = {k: (_FWD_PARAMS.get(k, k), None, specs[k][1][1], specs[k][1][0]) for k in used}
    if dp.p > 0:
        states = d.dropoutDesc.states
        buffers["states"] = (None, states, specs["states"][1][1], None)
    buffers["devSeqLengths"] = ("devSeqLengths", None, 0, None)
    minimum = {"weightSpaceSize": need_w, "workSpaceSize": sp.ws_size}
    if training:
        minimum["reserveSpaceSize"] = sp.rs_size
    nulls = tuple(k for k in _FWD_BUFFERS if k in names and k in STATE_NAMES and k not in dp.call.present)
    return Recipe.of_bound(h, Bound(buffers, tuple((key, bound, dp.vals) for key, bound in prepared), nulls, minimum))


@call_site(Memo("RNNForward sites"))
def _fwd_site(handle, rnnDesc, fwdMode, devSeqLengths, xDesc, yDesc, hDesc, cDesc, given):
    """RNNForward's descriptor checks, in the call's order (the data checks that come between them
    on a first call included), and what they fix: (handle, rnn descriptor, config, geometry,
    training, (weight space size, spaces), (names of the buffers it binds, paddingFill or None, [its
    Dispatch once made]))."""
    h = get_handle(handle)
    d = rnn_for_call(rnnDesc)
    check(fwdMode in (FWD_INFERENCE, FWD_TRAINING), "fwdMode", f"{fwdMode!r} is not a cudnnForwardMode_t")
    training = fwdMode == FWD_TRAINING
    check(not bg.is_null(devSeqLengths), "devSeqLengths", "is NULL (a device copy of seqLengthArray is required)")
    unread(h, devSeqLengths, "devSeqLengths")
    cfg, geo, xd, yd = data_pair(d, xDesc, yDesc)
    check_state_desc(hDesc, "hDesc", cfg, geo.B, cfg.Hout, "hx" in given or "hy" in given)
    lstm = cfg.mode == "LSTM"
    if lstm:
        check_state_desc(cDesc, "cDesc", cfg, geo.B, cfg.H, "cx" in given or "cy" in given)
    names = {"x", "y", "hx", "hy", "w", "ws"} | ({"cx", "cy"} if lstm else set()) | ({"rs"} if training else set())
    parts = (frozenset(names), yd.paddingFill if geo.padded else None, [])
    return h, d, cfg, geo, training, (weight_space_size(cfg), spaces(cfg, geo)), parts


RNNForward = steady(RNNForward, _fwd_site.sites, ("handle", "rnnDesc", "fwdMode", "xDesc", "yDesc", "hDesc", "cDesc"),
                    _fwd_recipe, arm_key=_fwd_arm_key)


@legacy("cudnnRNNBackwardData_v8", cupy="RNNBackwardData_v8")
def RNNBackwardData_v8(handle, rnnDesc, devSeqLengths, yDesc, y, dy, xDesc, dx, hDesc, hx, dhy, dhx, cDesc, cx, dcy,
                       dcx, weightSpaceSize, weightSpace, workSpaceSize, workSpace, reserveSpaceSize,
                       reserveSpace) -> None:
    """Gradients w.r.t. x, hx, cx after a training-mode cudnnRNNForward with the same y, hx, cx
    and reserve space; dhy/dcy NULL mean zero, dhx/dcx NULL are not written."""
    h = get_handle(handle)
    d = rnn_for_call(rnnDesc)
    check(not bg.is_null(devSeqLengths), "devSeqLengths", "is NULL")
    unread(h, devSeqLengths, "devSeqLengths")
    cfg, geo, _, _ = data_pair(d, xDesc, yDesc)
    check_state_desc(hDesc, "hDesc", cfg, geo.B, cfg.Hout, not all(bg.is_null(v) for v in (hx, dhy, dhx)))
    lstm = cfg.mode == "LSTM"
    if lstm:
        check_state_desc(cDesc, "cDesc", cfg, geo.B, cfg.H, not all(bg.is_null(v) for v in (cx, dcy, dcx)))
    for name, v in (("y", y), ("dy", dy), ("dx", dx)):
        check(not bg.is_null(v), name, "is NULL")
    check_sizes(cfg, geo, True, weightSpaceSize, workSpaceSize, reserveSpaceSize)
    bufs = {"y": y, "dy": dy, "dx": dx, "hx": hx, "dhy": dhy, "dhx": dhx, "w": weightSpace, "ws": workSpace,
            "rs": reserveSpace}
    if lstm:
        bufs.update(cx=cx, dcy=dcy, dcx=dcx)
    dispatch(h, d, cfg, geo, "backward_data", True, bufs)


@legacy("cudnnRNNBackwardWeights_v8", cupy="RNNBackwardWeights_v8")
def RNNBackwardWeights_v8(handle, rnnDesc, addGrad, devSeqLengths, xDesc, x, hDesc, hx, yDesc, y, weightSpaceSize,
                          dweightSpace, workSpaceSize, workSpace, reserveSpaceSize, reserveSpace) -> None:
    """dweightSpace += gradients w.r.t. every weight and bias (only CUDNN_WGRAD_MODE_ADD exists)."""
    h = get_handle(handle)
    d = rnn_for_call(rnnDesc)
    check(addGrad == WGRAD_ADD, "addGrad", "only CUDNN_WGRAD_MODE_ADD is supported (002 §8.2.21)")
    check(not bg.is_null(devSeqLengths), "devSeqLengths", "is NULL")
    unread(h, devSeqLengths, "devSeqLengths")
    cfg, geo, _, _ = data_pair(d, xDesc, yDesc)
    check_state_desc(hDesc, "hDesc", cfg, geo.B, cfg.Hout, not bg.is_null(hx))
    for name, v in (("x", x), ("y", y), ("dweightSpace", dweightSpace)):
        check(not bg.is_null(v), name, "is NULL")
    check_sizes(cfg, geo, True, weightSpaceSize, workSpaceSize, reserveSpaceSize)
    bufs = {"x": x, "hx": hx, "y": y, "dw": dweightSpace, "ws": workSpace, "rs": reserveSpace}
    dispatch(h, d, cfg, geo, "backward_weights", True, bufs)

