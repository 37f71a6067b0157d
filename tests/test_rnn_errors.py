"""Every BAD_PARAM / NOT_SUPPORTED / INVALID_VALUE / NOT_INITIALIZED rule of the RNN family,
broken one at a time (002 §7.2.36, §7.2.47, §7.2.49, §7.2.31, §7.2.24/25, §7.2.42, §7.2.52,
§8.2.18, §8.2.21, §7.2.33), with the outputs checked to be untouched."""
import ctypes

import numpy as np
import pytest

import cudnn_compat as cc
from test_rnn_reference import data_desc, forward, make_net, tdesc3

BAD, UNSUP = cc.CUDNN_STATUS_BAD_PARAM, cc.CUDNN_STATUS_NOT_SUPPORTED
D_, F_ = cc.CUDNN_DATA_DOUBLE, cc.CUDNN_DATA_FLOAT
SEQ, PACKED = cc.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, cc.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED


def expect(status, fn, word=None):
    with pytest.raises(cc.CuDNNError) as e:
        fn()
    assert e.value.status == status, str(e.value)
    if word:
        assert word in str(e.value), str(e.value)
    return e.value


V8 = dict(algo=cc.CUDNN_RNN_ALGO_STANDARD, cellMode=cc.CUDNN_LSTM, biasMode=cc.CUDNN_RNN_DOUBLE_BIAS,
          dirMode=cc.CUDNN_UNIDIRECTIONAL, inputMode=cc.CUDNN_LINEAR_INPUT, dataType=F_, mathPrec=F_,
          mathType=cc.CUDNN_DEFAULT_MATH, inputSize=3, hiddenSize=4, projSize=4, numLayers=1, dropoutDesc=None,
          auxFlags=0)


@pytest.mark.parametrize("change,status,word", [
    (dict(cellMode=9), BAD, "cellMode"),
    (dict(hiddenSize=0), BAD, "hiddenSize"),
    (dict(numLayers=-1), BAD, "numLayers"),
    (dict(projSize=5), UNSUP, "projSize"),
    (dict(projSize=2, cellMode=cc.CUDNN_GRU), UNSUP, "LSTM"),
    (dict(projSize=2, algo=cc.CUDNN_RNN_ALGO_PERSIST_STATIC), UNSUP, "STANDARD"),
    (dict(inputMode=cc.CUDNN_SKIP_INPUT), BAD, "inputSize"),
    (dict(mathPrec=cc.CUDNN_DATA_HALF), BAD, "mathPrec"),
    (dict(dataType=cc.CUDNN_DATA_DOUBLE), BAD, "mathPrec"),
    (dict(dataType=cc.CUDNN_DATA_INT8, mathPrec=cc.CUDNN_DATA_INT8), UNSUP, "dataType"),
    (dict(biasMode=cc.CUDNN_RNN_NO_BIAS, algo=cc.CUDNN_RNN_ALGO_PERSIST_STATIC), UNSUP, "biasMode"),
    (dict(auxFlags=4), BAD, "auxFlags"),
    (dict(dropoutDesc=2 ** 62 + 12345), BAD, "dropoutDesc"),  # an id no descriptor has (a small one may be live in a full run)
])
def test_set_rnn_descriptor_v8_rules(change, status, word):
    d = cc.cudnnCreateRNNDescriptor()
    expect(status, lambda: cc.cudnnSetRNNDescriptor_v8(d, **{**V8, **change}), word)
    expect(BAD, lambda: cc.cudnnRNNGetClip_v8(d), "never set")  # nothing was stored


def test_descriptor_setter_rules(handle):
    d = cc.cudnnCreateRNNDescriptor()
    cc.cudnnSetRNNDescriptor_v8(d, **V8)
    expect(BAD, lambda: cc.cudnnRNNSetClip_v8(d, cc.CUDNN_RNN_CLIP_MINMAX, cc.CUDNN_NOT_PROPAGATE_NAN, 1.0, -1.0), "lclip")
    expect(BAD, lambda: cc.cudnnRNNSetClip_v8(d, cc.CUDNN_RNN_CLIP_MINMAX, cc.CUDNN_NOT_PROPAGATE_NAN, float("nan"), 1.0))
    expect(BAD, lambda: cc.cudnnRNNSetClip(handle, d, 5, cc.CUDNN_NOT_PROPAGATE_NAN, -1.0, 1.0), "clipMode")
    assert cc.cudnnRNNGetClip_v8(d)[0] == cc.CUDNN_RNN_CLIP_NONE
    expect(UNSUP, lambda: cc.cudnnSetRNNProjectionLayers(handle, d, 2, 3), "outProjSize")
    expect(UNSUP, lambda: cc.cudnnSetRNNProjectionLayers(handle, d, 9, 0), "recProjSize")
    expect(BAD, lambda: cc.cudnnSetRNNProjectionLayers(handle, d, -2, 0))
    expect(BAD, lambda: cc.cudnnSetRNNBiasMode(d, 17), "biasMode")
    expect(BAD, lambda: cc.cudnnSetRNNPaddingMode(d, 3), "paddingMode")
    expect(BAD, lambda: cc.cudnnSetRNNMatrixMathType(d, 9), "mType")
    expect(BAD, lambda: cc.cudnnSetRNNDescriptor_v6(handle, d, 4, 1, None, 0, 0, 2, 0, F_), "dropoutDesc")
    expect(BAD, lambda: cc.cudnnSetRNNDescriptor(d, 4, 1), "8 (v5) or 10")
    expect(UNSUP, lambda: cc.cudnnCreatePersistentRNNPlan(d, 4, F_))
    expect(BAD, lambda: cc.cudnnGetRNNDescriptor_v8(None), "rnnDesc")
    assert cc.cudnnGetRNNDescriptor_v8(d)[8:12] == (3, 4, 4, 1)


def test_rnn_data_descriptor_rules():
    d = cc.cudnnCreateRNNDataDescriptor()
    expect(BAD, lambda: cc.cudnnSetRNNDataDescriptor(d, F_, SEQ, 3, 2, 4, [3, 4], None), "seqLengthArray")
    expect(BAD, lambda: cc.cudnnSetRNNDataDescriptor(d, F_, SEQ, 3, 2, 4, [-1, 2], None), "seqLengthArray")
    expect(BAD, lambda: cc.cudnnSetRNNDataDescriptor(d, F_, SEQ, 3, 0, 4, [], None), "batchSize")
    expect(BAD, lambda: cc.cudnnSetRNNDataDescriptor(d, F_, 7, 3, 2, 4, [3, 3], None), "layout")
    expect(BAD, lambda: cc.cudnnSetRNNDataDescriptor(d, F_, SEQ, 3, 2, 4, [3], None), "seqLengthArray")
    expect(UNSUP, lambda: cc.cudnnSetRNNDataDescriptor(d, cc.CUDNN_DATA_INT8, SEQ, 3, 2, 4, [3, 3], None), "dataType")
    expect(BAD, lambda: cc.cudnnGetRNNDataDescriptor(d, 1), "never set")
    cc.cudnnSetRNNDataDescriptor(d, F_, SEQ, 3, 2, 4, [3, 3], None)
    expect(BAD, lambda: cc.cudnnGetRNNDataDescriptor(d, -1), "arrayLengthRequested")


def test_weight_param_rules(handle, rng):
    net = make_net(handle, cc.CUDNN_GRU, D=2, L=1, rng=rng)
    d, size, w = net["desc"], net["wsize"], net["wspace"]
    md, bd = cc.cudnnCreateTensorDescriptor(), cc.cudnnCreateTensorDescriptor()
    expect(BAD, lambda: cc.cudnnGetRNNWeightParams(handle, d, 2, size, w, 0, md, bd), "pseudoLayer")
    expect(BAD, lambda: cc.cudnnGetRNNWeightParams(handle, d, 0, size, w, 6, md, bd), "linLayerID")
    expect(BAD, lambda: cc.cudnnGetRNNWeightParams(handle, d, 0, size, w, -1, md, bd), "linLayerID")
    expect(cc.CUDNN_STATUS_INVALID_VALUE, lambda: cc.cudnnGetRNNWeightParams(handle, d, 0, size - 8, w, 0, md, bd))
    # legacy LinLayer queries
    xd = tdesc3((2, 3, 1), D_)
    wd = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilterNdDescriptor(wd, F_, cc.CUDNN_TENSOR_NCHW, 3, [size // 8, 1, 1])
    fd = cc.cudnnCreateFilterDescriptor()
    expect(BAD, lambda: cc.cudnnGetRNNLinLayerMatrixParams(handle, d, 0, xd, wd, w, 0, fd), "wDesc")
    cc.cudnnSetFilterNdDescriptor(wd, D_, cc.CUDNN_TENSOR_NCHW, 3, [size // 8 - 1, 1, 1])
    expect(cc.CUDNN_STATUS_INVALID_VALUE, lambda: cc.cudnnGetRNNLinLayerMatrixParams(handle, d, 0, xd, wd, w, 0, fd))
    cc.cudnnSetFilterNdDescriptor(wd, D_, cc.CUDNN_TENSOR_NCHW, 3, [size // 8, 1, 1])
    expect(BAD, lambda: cc.cudnnGetRNNLinLayerBiasParams(handle, d, 0, xd, wd, w, 6, fd), "linLayerID")
    expect(BAD, lambda: cc.cudnnGetRNNLinLayerMatrixParams(handle, d, 0, xd, wd, ctypes.c_void_p(w.ctypes.data + 4), 0, fd), "aligned")
    expect(BAD, lambda: cc.cudnnGetRNNLinLayerMatrixParams(handle, d, 0, tdesc3((2, 5, 1), D_), wd, w, 0, fd), "inputSize")
    expect(UNSUP, lambda: cc.cudnnGetRNNParamsSize(handle, d, tdesc3((2, 3, 1), cc.CUDNN_DATA_INT32), D_))
    expect(BAD, lambda: cc.cudnnGetRNNParamsSize(handle, d, xd, F_), "dataType")


@pytest.fixture
def setup(handle, rng):
    """A double LSTM (2 layers, padded IO) and valid arguments for cudnnRNNForward."""
    net = make_net(handle, cc.CUDNN_LSTM, D=1, L=2, rng=rng)
    lengths, T, B = [3, 2], 3, 2
    xd = data_desc(D_, SEQ, T, B, 3, lengths)
    yd = data_desc(D_, SEQ, T, B, 4, lengths)
    hd = tdesc3((2, B, 4), D_)
    ws_size, rs_size = cc.cudnnGetRNNTempSpaceSizes(handle, net["desc"], cc.CUDNN_FWD_MODE_TRAINING, xd)
    a = dict(handle=handle, rnnDesc=net["desc"], fwdMode=cc.CUDNN_FWD_MODE_TRAINING,
             devSeqLengths=np.array(lengths, np.int32), xDesc=xd, x=rng.standard_normal(T * B * 3), yDesc=yd,
             y=np.full(T * B * 4, 7.0), hDesc=hd, hx=rng.standard_normal(16), hy=np.full(16, 7.0), cDesc=hd,
             cx=None, cy=np.full(16, 7.0), weightSpaceSize=net["wsize"], weightSpace=net["wspace"],
             workSpaceSize=ws_size, workSpace=np.zeros(ws_size, np.uint8), reserveSpaceSize=rs_size,
             reserveSpace=np.full(rs_size, 3, np.uint8))
    return net, a


def _untouched(a):
    return np.all(a["y"] == 7) and np.all(a["hy"] == 7) and np.all(a["cy"] == 7) and np.all(a["reserveSpace"] == 3)


def test_forward_valid_arguments_run(setup):
    net, a = setup
    cc.cudnnRNNForward(**a)
    assert not _untouched(a)


def _fwd_cases(handle):
    return [
        ("NULL xDesc", dict(xDesc=None), BAD, "xDesc"),
        ("NULL yDesc", dict(yDesc=0), BAD, "yDesc"),
        ("NULL devSeqLengths", dict(devSeqLengths=None), BAD, "devSeqLengths"),
        ("NULL x", dict(x=None), BAD, "x"),
        ("bad fwdMode", dict(fwdMode=5), BAD, "fwdMode"),
        ("x vectorSize", dict(xDesc=data_desc(D_, SEQ, 3, 2, 5, [3, 2])), BAD, "inputSize"),
        ("x dataType", dict(xDesc=data_desc(F_, SEQ, 3, 2, 3, [3, 2])), BAD, "data type"),
        ("y vectorSize", dict(yDesc=data_desc(D_, SEQ, 3, 2, 8, [3, 2])), BAD, "vectorSize"),
        ("seq lengths differ", dict(yDesc=data_desc(D_, SEQ, 3, 2, 4, [3, 3])), BAD, "seqLengthArray"),
        ("layouts differ", dict(yDesc=data_desc(D_, cc.CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED, 3, 2, 4, [3, 2])),
         BAD, "layout"),
        ("unsorted packed batch", dict(xDesc=data_desc(D_, PACKED, 3, 2, 3, [2, 3]),
                                       yDesc=data_desc(D_, PACKED, 3, 2, 4, [2, 3])), BAD, "sorted"),
        ("packed maxSeqLength", dict(xDesc=data_desc(D_, PACKED, 3, 2, 3, [2, 1]),
                                     yDesc=data_desc(D_, PACKED, 3, 2, 4, [2, 1])), BAD, "maxSeqLength"),
        ("hDesc dims", dict(hDesc=tdesc3((2, 3, 4), D_)), BAD, "hDesc"),
        ("hDesc NULL with hx", dict(hDesc=None), BAD, "hDesc"),
        ("hDesc strides", dict(hDesc=_strided_hdesc()), BAD, "packed"),
        ("cDesc dtype", dict(cDesc=tdesc3((2, 2, 4), F_)), BAD, "cDesc"),
        ("weight space small", dict(weightSpaceSize=8), BAD, "weightSpaceSize"),
        ("workspace small", dict(workSpaceSize=16), BAD, "workSpaceSize"),
        ("reserve small", dict(reserveSpaceSize=16), BAD, "reserveSpaceSize"),
        ("y buffer small", dict(y=np.full(4, 7.0)), BAD, "y"),
        ("rnnDesc NULL", dict(rnnDesc=None), BAD, "rnnDesc"),
    ]


def _strided_hdesc():
    d = cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensorNdDescriptor(d, D_, 3, [2, 2, 4], [16, 8, 1])
    return d


@pytest.mark.parametrize("case", range(21))
def test_forward_rules_write_nothing(setup, case):
    net, a = setup
    name, change, status, word = _fwd_cases(a["handle"])[case]
    a.update(change)
    if name == "y buffer small":
        a["y"][:] = 7
    expect(status, lambda: cc.cudnnRNNForward(**a), word)
    assert np.all(a["y"] == 7) and np.all(a["hy"] == 7) and np.all(a["cy"] == 7) and np.all(a["reserveSpace"] == 3)


@pytest.mark.parametrize("case", range(21))
def test_forward_rules_same_after_the_call_site_is_warm(setup, case):
    """Each rule gives the same status and message, and writes nothing, whether the call is the
    first with its descriptors (every check in order) or follows a valid call with the same ones
    (the call site's cached checks, rnn/v8.py ``_fwd_site``): the cache skips no data check and
    reorders none."""
    from cudnn_compat._core import memo
    net, a = setup
    name, change, status, word = _fwd_cases(a["handle"])[case]

    def bad_call(warm: bool) -> str:
        memo.clear_all()
        args = dict(a)
        if warm:
            cc.cudnnRNNForward(**args)  # the valid call: the site is warm for these descriptors
            for k in ("y", "hy", "cy"):
                args[k][:] = 7
            args["reserveSpace"][:] = 3
        args.update(change)
        if name == "y buffer small":
            args["y"][:] = 7
        err = expect(status, lambda: cc.cudnnRNNForward(**args), word)
        assert np.all(args["y"] == 7) and np.all(args["hy"] == 7) and np.all(args["cy"] == 7)
        assert np.all(args["reserveSpace"] == 3)
        return str(err)

    assert bad_call(warm=True) == bad_call(warm=False)


def test_forward_not_supported_and_settings_rules(handle, rng, setup):
    net, a = setup
    d = cc.cudnnCreateRNNDescriptor()
    v8 = {**V8, "dataType": D_, "mathPrec": D_, "numLayers": 2, "algo": cc.CUDNN_RNN_ALGO_PERSIST_DYNAMIC,
          "auxFlags": cc.CUDNN_RNN_PADDED_IO_ENABLED}
    cc.cudnnSetRNNDescriptor_v8(d, **v8)
    a["rnnDesc"] = d
    expect(UNSUP, lambda: cc.cudnnRNNForward(**a), "variable sequence lengths")
    cc.cudnnSetRNNDescriptor_v8(d, **{**v8, "algo": cc.CUDNN_RNN_ALGO_PERSIST_STATIC})
    a["xDesc"], a["yDesc"] = data_desc(D_, SEQ, 3, 2, 3, [3, 3]), data_desc(D_, SEQ, 3, 2, 4, [3, 3])
    expect(UNSUP, lambda: cc.cudnnRNNForward(**a), "DOUBLE")
    # unpacked layouts need the padded-IO flag
    cc.cudnnSetRNNDescriptor_v8(d, **{**v8, "algo": cc.CUDNN_RNN_ALGO_STANDARD, "auxFlags": 0})
    expect(BAD, lambda: cc.cudnnRNNForward(**a), "PADDED_IO")
    # dropout between layers needs seeded states in training (not in inference)
    drop = cc.cudnnCreateDropoutDescriptor()
    cc.cudnnSetDropoutDescriptor(drop, handle, 0.5, None, 0, 0)
    cc.cudnnSetRNNDescriptor_v8(d, **{**v8, "algo": cc.CUDNN_RNN_ALGO_STANDARD, "dropoutDesc": drop})
    expect(BAD, lambda: cc.cudnnRNNForward(**a), "states")
    assert _untouched(a)
    cc.cudnnRNNForward(**{**a, "fwdMode": cc.CUDNN_FWD_MODE_INFERENCE})
    # v6 descriptors cannot be used by the v8 calls
    d6 = cc.cudnnCreateRNNDescriptor()
    cc.cudnnSetRNNDescriptor_v6(handle, d6, 4, 2, drop, 0, 0, cc.CUDNN_LSTM, 0, D_)
    expect(BAD, lambda: cc.cudnnRNNForward(**{**a, "rnnDesc": d6}), "v6")
    expect(cc.CUDNN_STATUS_NOT_INITIALIZED, lambda: cc.cudnnGetRNNWeightParams(handle, d6, 0, 1 << 20, 4096, 0, None, None))


def test_backward_rules(handle, rng):
    net = make_net(handle, cc.CUDNN_GRU, D=1, L=1, rng=rng)
    lengths = (2, 2)
    xs = [rng.standard_normal((2, 3)) for _ in lengths]
    _, _, _, st = forward(handle, net, xs, SEQ, lengths, 2, training=True)
    d = net["desc"]
    dx = np.full(st["x"].size, 7.0)
    dw = np.full(net["wsize"] // 8, 7.0)

    def bwd_data(**kw):
        a = dict(handle=handle, rnnDesc=d, devSeqLengths=st["seq"], yDesc=st["yd"], y=st["y"], dy=st["y"],
                 xDesc=st["xd"], dx=dx, hDesc=None, hx=None, dhy=None, dhx=None, cDesc=None, cx=None, dcy=None,
                 dcx=None, weightSpaceSize=net["wsize"], weightSpace=net["wspace"], workSpaceSize=st["ws_size"],
                 workSpace=st["ws"], reserveSpaceSize=st["rs_size"], reserveSpace=st["rs"])
        a.update(kw)
        return cc.cudnnRNNBackwardData_v8(**a)

    def bwd_w(**kw):
        a = dict(handle=handle, rnnDesc=d, addGrad=cc.CUDNN_WGRAD_MODE_ADD, devSeqLengths=st["seq"], xDesc=st["xd"],
                 x=st["x"], hDesc=None, hx=None, yDesc=st["yd"], y=st["y"], weightSpaceSize=net["wsize"],
                 dweightSpace=dw, workSpaceSize=st["ws_size"], workSpace=st["ws"], reserveSpaceSize=st["rs_size"],
                 reserveSpace=st["rs"])
        a.update(kw)
        return cc.cudnnRNNBackwardWeights_v8(**a)
    expect(BAD, lambda: bwd_data(dx=None), "dx")
    expect(BAD, lambda: bwd_data(dy=None), "dy")
    expect(BAD, lambda: bwd_data(dhx=np.zeros(16)), "hDesc")
    expect(BAD, lambda: bwd_data(reserveSpaceSize=8), "reserveSpaceSize")
    expect(BAD, lambda: bwd_data(xDesc=data_desc(D_, SEQ, 2, 2, 3, [2, 1])), "seqLengthArray")
    expect(BAD, lambda: bwd_w(addGrad=cc.CUDNN_WGRAD_MODE_SET), "addGrad")
    expect(BAD, lambda: bwd_w(weightSpaceSize=16), "weightSpaceSize")
    expect(BAD, lambda: bwd_w(dweightSpace=np.zeros(3)), "dweightSpace")
    assert np.all(dx == 7) and np.all(dw == 7)


def test_legacy_call_rules(handle, rng):
    drop = cc.cudnnCreateDropoutDescriptor()
    cc.cudnnSetDropoutDescriptor(drop, handle, 0.0, None, 0, 0)
    d = cc.cudnnCreateRNNDescriptor()
    cc.cudnnSetRNNDescriptor_v6(handle, d, 4, 1, drop, 0, 0, cc.CUDNN_RNN_TANH, 0, D_)
    x3 = [tdesc3((2, 3, 1), D_), tdesc3((2, 3, 1), D_)]
    y3 = [tdesc3((2, 4, 1), D_), tdesc3((2, 4, 1), D_)]
    size = cc.cudnnGetRNNParamsSize(handle, d, x3[0], D_)
    wd = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilterNdDescriptor(wd, D_, cc.CUDNN_TENSOR_NCHW, 3, [size // 8, 1, 1])
    w = np.zeros(size // 8)
    ws = np.zeros(cc.cudnnGetRNNWorkspaceSize(handle, d, 2, x3), np.uint8)
    y = np.full(16, 7.0)

    def fwd(xD=x3, yD=y3, wD=wd, T=2, wsz=ws.size, x=np.zeros(12)):
        cc.cudnnRNNForwardInference(handle, d, T, xD, x, None, None, None, None, wD, w, yD, y, None, None, None, None,
                                    ws, wsz)
    fwd()
    y[:] = 7
    expect(BAD, lambda: fwd(xD=[tdesc3((1, 3, 1), D_), tdesc3((2, 3, 1), D_)]), "may not increase")
    expect(BAD, lambda: fwd(xD=[tdesc3((2, 3, 1), D_), tdesc3((2, 2, 1), D_)]), "vector size")
    expect(BAD, lambda: fwd(yD=[tdesc3((2, 4, 1), D_), tdesc3((1, 4, 1), D_)]), "yDesc[1]")
    expect(BAD, lambda: fwd(xD=x3[:1]), "xDesc")
    expect(BAD, lambda: fwd(T=0), "seqLength")
    expect(BAD, lambda: fwd(wsz=8), "workSpaceSize")
    wd2 = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilterNdDescriptor(wd2, D_, cc.CUDNN_TENSOR_NCHW, 3, [size // 8 - 1, 1, 1])
    expect(BAD, lambda: fwd(wD=wd2), "wDesc")
    cc.cudnnSetFilterNdDescriptor(wd2, F_, cc.CUDNN_TENSOR_NCHW, 3, [size // 4, 1, 1])
    expect(BAD, lambda: fwd(wD=wd2), "wDesc")
    expect(UNSUP, lambda: fwd(xD=[tdesc3((2, 3, 1), cc.CUDNN_DATA_INT32)] * 2), "data type")
    assert np.all(y == 7)
    rd = data_desc(D_, SEQ, 2, 2, 3, [2, 2])
    expect(UNSUP, lambda: cc.cudnnRNNForwardInferenceEx(handle, d, rd, np.zeros(12), None, None, None, None, wd, w,
                                                        data_desc(D_, SEQ, 2, 2, 4, [2, 2]), y, None, None, None,
                                                        None, rd, np.zeros(4), None, None, None, None, None, None, ws,
                                                        ws.size), "kDesc")
