"""The backend API (002 §5.2.1-§5.2.7, ch. 9; 000 "Graph API") on the CPU reference engine:
graphs built purely through cudnnBackend* calls, checked against loops written here; GetAttribute
round trips; every status rule; finalize messages naming the failed check and attribute."""
import ctypes
import itertools

import numpy as np
import pytest

import cudnn_compat as cc
from _tolerance import assert_close, gemm_class
from cudnn_compat.graph_api import api as ba

T = cc  # enum constants live on the package: cc.CUDNN_TYPE_INT64, cc.CUDNN_ATTR_..., ...


# -- helpers: one call per attribute, as C code does --------------------------------------------

def create(kind):
    return cc.cudnnBackendCreateDescriptor(getattr(cc, f"CUDNN_BACKEND_{kind}_DESCRIPTOR"))


def setv(d, attr, typ, values):
    values = values if isinstance(values, (list, tuple)) else [values]
    cc.cudnnBackendSetAttribute(d, getattr(cc, "CUDNN_ATTR_" + attr), getattr(cc, "CUDNN_TYPE_" + typ), len(values), values)


def getv(d, attr, typ, n=16):
    return cc.cudnnBackendGetAttribute(d, getattr(cc, "CUDNN_ATTR_" + attr), getattr(cc, "CUDNN_TYPE_" + typ), n)


def build(kind, attrs, finalize=True):
    d = create(kind)
    for attr, typ, values in attrs:
        setv(d, attr, typ, values)
    if finalize:
        cc.cudnnBackendFinalize(d)
    return d


def packed(dims, order=None):
    """Element strides of ``dims`` stored with axes ``order`` outermost first (default row-major)."""
    order = list(range(len(dims))) if order is None else order
    st, acc = [0] * len(dims), 1
    for ax in reversed(order):
        st[ax] = acc
        acc *= dims[ax]
    return st


def tensor(uid, dims, strides=None, dtype=None, virtual=False, align=4, finalize=True, by_value=False):
    attrs = [("TENSOR_UNIQUE_ID", "INT64", uid),
             ("TENSOR_DATA_TYPE", "DATA_TYPE", cc.CUDNN_DATA_FLOAT if dtype is None else dtype),
             ("TENSOR_BYTE_ALIGNMENT", "INT64", align), ("TENSOR_DIMENSIONS", "INT64", list(dims)),
             ("TENSOR_STRIDES", "INT64", list(strides or packed(dims)))]
    if virtual:
        attrs.append(("TENSOR_IS_VIRTUAL", "BOOLEAN", True))
    if by_value:
        attrs.append(("TENSOR_IS_BY_VALUE", "BOOLEAN", True))
    return build("TENSOR", attrs, finalize)


def conv_desc(pre, post, stride, dilation, mode=None, spatial=None, finalize=True):
    attrs = [("CONVOLUTION_COMP_TYPE", "DATA_TYPE", cc.CUDNN_DATA_FLOAT),
             ("CONVOLUTION_CONV_MODE", "CONVOLUTION_MODE", cc.CUDNN_CROSS_CORRELATION if mode is None else mode),
             ("CONVOLUTION_SPATIAL_DIMS", "INT64", len(pre) if spatial is None else spatial),
             ("CONVOLUTION_PRE_PADDINGS", "INT64", list(pre)), ("CONVOLUTION_POST_PADDINGS", "INT64", list(post)),
             ("CONVOLUTION_FILTER_STRIDES", "INT64", list(stride)), ("CONVOLUTION_DILATIONS", "INT64", list(dilation))]
    return build("CONVOLUTION", attrs, finalize)


CONV_PREFIX = {"FORWARD": "OPERATION_CONVOLUTION_FORWARD_", "BACKWARD_DATA": "OPERATION_CONVOLUTION_BWD_DATA_",
               "BACKWARD_FILTER": "OPERATION_CONVOLUTION_BWD_FILTER_"}


def conv_op(direction, cdesc, tensors, alpha=1.0, beta=0.0, finalize=True):
    p = CONV_PREFIX[direction]
    attrs = [(p + "ALPHA", "FLOAT", alpha), (p + "BETA", "FLOAT", beta), (p + "CONV_DESC", "BACKEND_DESCRIPTOR", cdesc)]
    attrs += [(p + role, "BACKEND_DESCRIPTOR", t) for role, t in tensors.items()]
    return build("OPERATION_CONVOLUTION_" + direction, attrs, finalize)


def pointwise(mode, x, y, b=None, alpha1=None, alpha2=None, finalize=True):
    pw = build("POINTWISE", [("POINTWISE_MODE", "POINTWISE_MODE", mode), ("POINTWISE_MATH_PREC", "DATA_TYPE", cc.CUDNN_DATA_FLOAT)])
    attrs = [("OPERATION_POINTWISE_PW_DESCRIPTOR", "BACKEND_DESCRIPTOR", pw), ("OPERATION_POINTWISE_XDESC", "BACKEND_DESCRIPTOR", x),
             ("OPERATION_POINTWISE_YDESC", "BACKEND_DESCRIPTOR", y)]
    if b is not None:
        attrs.append(("OPERATION_POINTWISE_BDESC", "BACKEND_DESCRIPTOR", b))
    if alpha1 is not None:
        attrs.append(("OPERATION_POINTWISE_ALPHA1", "FLOAT", alpha1))
    if alpha2 is not None:
        attrs.append(("OPERATION_POINTWISE_ALPHA2", "FLOAT", alpha2))
    return build("OPERATION_POINTWISE", attrs, finalize)


def graph(handle, ops):
    return build("OPERATIONGRAPH", [("OPERATIONGRAPH_HANDLE", "HANDLE", handle), ("OPERATIONGRAPH_OPS", "BACKEND_DESCRIPTOR", list(ops))])


def plan_for(handle, g, mode=None):
    """heuristics -> first engine config -> plan (the recommended flow of 000)."""
    heur = build("ENGINEHEUR", [("ENGINEHEUR_OPERATION_GRAPH", "BACKEND_DESCRIPTOR", g),
                                ("ENGINEHEUR_MODE", "HEUR_MODE", cc.CUDNN_HEUR_MODE_INSTANT if mode is None else mode)])
    count, _ = getv(heur, "ENGINEHEUR_RESULTS", "BACKEND_DESCRIPTOR", 0)
    assert count >= 1
    cfgs = [create("ENGINECFG") for _ in range(count)]
    n, got = cc.cudnnBackendGetAttribute(heur, cc.CUDNN_ATTR_ENGINEHEUR_RESULTS, cc.CUDNN_TYPE_BACKEND_DESCRIPTOR, count, cfgs)
    assert n == count and got == cfgs  # the caller's descriptors were filled, as in C
    return build("EXECUTION_PLAN", [("EXECUTION_PLAN_HANDLE", "HANDLE", handle),
                                    ("EXECUTION_PLAN_ENGINE_CONFIG", "BACKEND_DESCRIPTOR", cfgs[0])])


def execute(handle, plan, data: dict, workspace=None):
    pack = build("VARIANT_PACK", [("VARIANT_PACK_UNIQUE_IDS", "INT64", list(data)),
                                  ("VARIANT_PACK_DATA_POINTERS", "VOID_PTR", list(data.values())),
                                  ("VARIANT_PACK_WORKSPACE", "VOID_PTR", [workspace])])
    cc.cudnnBackendExecute(handle, plan, pack)


def loop_conv(x, w, pre, stride, dil, out_sp, flip=False, groups=1):
    """Direct-loop grouped convolution (cross-correlation; flip=True: the filter flipped)."""
    n, c = x.shape[:2]
    k = w.shape[0]
    cg, kg = c // groups, k // groups
    y = np.zeros((n, k) + tuple(out_sp))
    R, S = w.shape[2:]
    for ni, ki, p, q in itertools.product(range(n), range(k), range(out_sp[0]), range(out_sp[1])):
        g = ki // kg
        acc = 0.0
        for ci, r, s in itertools.product(range(cg), range(R), range(S)):
            h, ww = p * stride[0] - pre[0] + r * dil[0], q * stride[1] - pre[1] + s * dil[1]
            if 0 <= h < x.shape[2] and 0 <= ww < x.shape[3]:
                wv = w[ki, ci, R - 1 - r, S - 1 - s] if flip else w[ki, ci, r, s]
                acc += x[ni, g * cg + ci, h, ww] * wv
        y[ni, ki, p, q] = acc
    return y


def strided_empty(dims, strides, dtype=np.float32):
    """A buffer holding a tensor with element ``strides``, and the logical view of it."""
    size = 1 + sum((d - 1) * s for d, s in zip(dims, strides))
    buf = np.zeros(size, dtype)
    view = np.lib.stride_tricks.as_strided(buf, dims, [s * buf.itemsize for s in strides])
    return buf, view


# -- graphs that compute ------------------------------------------------------------------------

def test_conv_forward_graph_matches_loop(handle, rng):
    """002 §9.3 flow: tensors, conv desc, fwd op with alpha/beta, graph, heuristics, plan,
    variant pack, execute; NHWC x, asymmetric padding, stride and dilation."""
    N, C, H, W, K, R, S = 2, 3, 7, 6, 4, 3, 2
    pre, post, stride, dil = (1, 0), (2, 1), (2, 1), (1, 2)
    P = 1 + (H + pre[0] + post[0] - ((R - 1) * dil[0] + 1)) // stride[0]
    Q = 1 + (W + pre[1] + post[1] - ((S - 1) * dil[1] + 1)) // stride[1]
    xs = packed((N, C, H, W), [0, 2, 3, 1])  # NHWC memory
    xd, wd, yd = tensor(ord("x"), (N, C, H, W), xs), tensor(ord("w"), (K, C, R, S)), tensor(ord("y"), (N, K, P, Q))
    op = conv_op("FORWARD", conv_desc(pre, post, stride, dil), {"X": xd, "W": wd, "Y": yd}, alpha=1.5, beta=0.5)
    g = graph(handle, [op])
    plan = plan_for(handle, g)
    assert getv(plan, "EXECUTION_PLAN_WORKSPACE_SIZE", "INT64") == (1, [0])

    xbuf, xv = strided_empty((N, C, H, W), xs)
    xv[...] = rng.standard_normal((N, C, H, W))
    w = rng.standard_normal((K, C, R, S)).astype(np.float32)
    y0 = rng.standard_normal((N, K, P, Q)).astype(np.float32)
    y = y0.copy()
    # arrays or host pointers (ctypes.c_void_p; a plain int is BAD_PARAM on the CPU place, docs/conventions.md)
    with pytest.raises(cc.CuDNNError) as e:
        execute(handle, plan, {ord("x"): xbuf, ord("w"): w.ctypes.data, ord("y"): y})
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and "c_void_p" in str(e.value)
    np.testing.assert_array_equal(y, y0)
    execute(handle, plan, {ord("x"): xbuf, ord("w"): ctypes.c_void_p(w.ctypes.data), ord("y"): y})
    want = 1.5 * loop_conv(xv.astype(np.float64), w, pre, stride, dil, (P, Q)) + 0.5 * y0
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_grouped_conv_six_dim_form(handle, rng):
    """002 §9.2.12: [N, G, C, H, W], [G, K, C, R, S], [N, G, K, P, Q] with CUDNN_CONVOLUTION (flipped)."""
    N, G, C, K, H, W = 1, 2, 2, 3, 5, 4
    xd, wd, yd = tensor(1, (N, G, C, H, W)), tensor(2, (G, K, C, 3, 3)), tensor(3, (N, G, K, 3, 2))
    op = conv_op("FORWARD", conv_desc((0, 0), (0, 0), (1, 1), (1, 1), mode=cc.CUDNN_CONVOLUTION),
                 {"X": xd, "W": wd, "Y": yd})
    plan = plan_for(handle, graph(handle, [op]))
    x = rng.standard_normal((N, G, C, H, W)).astype(np.float32)
    w = rng.standard_normal((G, K, C, 3, 3)).astype(np.float32)
    y = np.full((N, G, K, 3, 2), np.nan, np.float32)  # beta = 0: never read
    execute(handle, plan, {1: x, 2: w, 3: y})
    want = loop_conv(x.reshape(N, G * C, H, W), w.reshape(G * K, C, 3, 3), (0, 0), (1, 1), (1, 1), (3, 2), flip=True, groups=G)
    np.testing.assert_allclose(y.reshape(N, G * K, 3, 2), want, rtol=1e-5, atol=1e-5)


def test_conv_bias_relu_fused_graph(handle, rng):
    """000's fusion example: conv -> ADD bias -> RELU_FWD through virtual Tmp0/Tmp1; ops given out of order."""
    N, C, H, W, K = 2, 3, 4, 4, 5
    xd, wd, bd, yd = tensor(10, (N, C, H, W)), tensor(11, (K, C, 3, 3)), tensor(12, (1, K, 1, 1)), tensor(13, (N, K, 4, 4))
    t0, t1 = tensor(20, (N, K, 4, 4), virtual=True), tensor(21, (N, K, 4, 4), virtual=True)
    conv = conv_op("FORWARD", conv_desc((1, 1), (1, 1), (1, 1), (1, 1)), {"X": xd, "W": wd, "Y": t0})
    add = pointwise(cc.CUDNN_POINTWISE_ADD, t0, t1, b=bd)
    relu = pointwise(cc.CUDNN_POINTWISE_RELU_FWD, t1, yd)
    g = graph(handle, [relu, conv, add])  # 000: the order of OPS does not matter
    plan = plan_for(handle, g)
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    w = rng.standard_normal((K, C, 3, 3)).astype(np.float32)
    b = rng.standard_normal((1, K, 1, 1)).astype(np.float32)
    y = np.zeros((N, K, 4, 4), np.float32)
    execute(handle, plan, {10: x, 11: w, 12: b, 13: y})
    want = np.maximum(loop_conv(x, w, (1, 1), (1, 1), (1, 1), (4, 4)) + b, 0.0)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    assert (y == 0).any() and (y > 0).any()


def test_matmul_graph_broadcast_batch(handle, rng):
    ad, bd, cd = tensor(1, (2, 3, 4)), tensor(2, (1, 4, 5)), tensor(3, (2, 3, 5))
    mm = build("MATMUL", [("MATMUL_COMP_TYPE", "DATA_TYPE", cc.CUDNN_DATA_FLOAT)])
    op = build("OPERATION_MATMUL", [("OPERATION_MATMUL_ADESC", "BACKEND_DESCRIPTOR", ad), ("OPERATION_MATMUL_BDESC", "BACKEND_DESCRIPTOR", bd),
                                    ("OPERATION_MATMUL_CDESC", "BACKEND_DESCRIPTOR", cd), ("OPERATION_MATMUL_DESC", "BACKEND_DESCRIPTOR", mm)])
    plan = plan_for(handle, graph(handle, [op]))
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    b = rng.standard_normal((1, 4, 5)).astype(np.float32)
    c = np.zeros((2, 3, 5), np.float32)
    execute(handle, plan, {1: a, 2: b, 3: c})
    want = np.zeros((2, 3, 5))
    for i, r, col in itertools.product(range(2), range(3), range(5)):
        want[i, r, col] = sum(float(a[i, r, k]) * float(b[0, k, col]) for k in range(4))
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-5)


def test_reduction_and_genstats_graphs(handle, rng):
    x = rng.standard_normal((2, 3, 4, 2)).astype(np.float32)
    red = build("REDUCTION", [("REDUCTION_OPERATOR", "REDUCTION_OPERATOR_TYPE", cc.CUDNN_REDUCE_TENSOR_MAX),
                              ("REDUCTION_COMP_TYPE", "DATA_TYPE", cc.CUDNN_DATA_FLOAT)])
    xd, yd = tensor(1, x.shape), tensor(2, (2, 1, 4, 1))
    op = build("OPERATION_REDUCTION", [("OPERATION_REDUCTION_XDESC", "BACKEND_DESCRIPTOR", xd),
                                       ("OPERATION_REDUCTION_YDESC", "BACKEND_DESCRIPTOR", yd),
                                       ("OPERATION_REDUCTION_DESC", "BACKEND_DESCRIPTOR", red)])
    y = np.zeros((2, 1, 4, 1), np.float32)
    execute(handle, plan_for(handle, graph(handle, [op])), {1: x, 2: y})
    for n, h in itertools.product(range(2), range(4)):
        assert y[n, 0, h, 0] == max(x[n, c, h, w] for c in range(3) for w in range(2))

    sd, qd = tensor(3, (1, 3, 1, 1)), tensor(4, (1, 3, 1, 1))
    gs = build("OPERATION_GEN_STATS", [("OPERATION_GENSTATS_MODE", "GENSTATS_MODE", cc.CUDNN_GENSTATS_SUM_SQSUM),
                                       ("OPERATION_GENSTATS_MATH_PREC", "DATA_TYPE", cc.CUDNN_DATA_FLOAT),
                                       ("OPERATION_GENSTATS_XDESC", "BACKEND_DESCRIPTOR", xd),
                                       ("OPERATION_GENSTATS_SUMDESC", "BACKEND_DESCRIPTOR", sd),
                                       ("OPERATION_GENSTATS_SQSUMDESC", "BACKEND_DESCRIPTOR", qd)])
    s, q = np.zeros(3, np.float32), np.zeros(3, np.float32)
    execute(handle, plan_for(handle, graph(handle, [gs])), {1: x, 3: s, 4: q})
    for c in range(3):
        vals = [float(v) for v in x[:, c].ravel()]
        assert s[c] == pytest.approx(sum(vals), rel=1e-5, abs=1e-5)
        assert q[c] == pytest.approx(sum(v * v for v in vals), rel=1e-5)


def test_conv_backward_adjoint_identities(handle, rng):
    """<conv(x, w), dy> == <x, bwd_data(dy, w)> == <w, bwd_filter(x, dy)>, all through the backend API, float64."""
    D = cc.CUDNN_DATA_DOUBLE
    xs, ws, ys = (2, 4, 6, 5), (6, 2, 3, 2), (2, 6, 3, 2)  # 2 groups (x has 4 channels, w 2 per group)
    args = ((1, 0), (1, 0), (2, 2), (1, 2))
    x, w, dy = (rng.standard_normal(s) for s in (xs, ws, ys))

    def run(direction, tensors, data, out_uid, shape):
        tds = {role: tensor(uid, shp, dtype=D, align=8) for role, (uid, shp) in tensors.items()}
        op = conv_op(direction, conv_desc(*args), tds)
        out = np.zeros(shape)
        execute(handle, plan_for(handle, graph(handle, [op])), {**data, out_uid: out})
        return out

    y = run("FORWARD", {"X": (1, xs), "W": (2, ws), "Y": (3, ys)}, {1: x, 2: w}, 3, ys)
    dx = run("BACKWARD_DATA", {"DX": (1, xs), "W": (2, ws), "DY": (3, ys)}, {2: w, 3: dy}, 1, xs)
    dw = run("BACKWARD_FILTER", {"X": (1, xs), "DW": (2, ws), "DY": (3, ys)}, {1: x, 3: dy}, 2, ws)
    lhs = float(np.sum(y * dy))
    assert lhs == pytest.approx(float(np.sum(x * dx)), rel=1e-10)
    assert lhs == pytest.approx(float(np.sum(w * dw)), rel=1e-10)
    np.testing.assert_allclose(y, loop_conv(x, w, (1, 0), (2, 2), (1, 2), ys[2:], groups=2), rtol=1e-10)


def test_single_op_in_place_and_by_value_scalar(handle, rng):
    """000: in-place ops work in single-op graphs; a by-value tensor (8.2) carries a host scalar."""
    xd = tensor(7, (2, 3))
    op = pointwise(cc.CUDNN_POINTWISE_RELU_FWD, xd, xd, alpha1=2.0)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    x0 = x.copy()
    execute(handle, plan_for(handle, graph(handle, [op])), {7: x})
    np.testing.assert_allclose(x, np.maximum(2 * x0, 0), rtol=1e-6)

    sd, yd = tensor(8, (1, 1), by_value=True), tensor(9, (2, 3))
    op = pointwise(cc.CUDNN_POINTWISE_MUL, tensor(7, (2, 3)), yd, b=sd, alpha2=0.5)
    y = np.zeros((2, 3), np.float32)
    execute(handle, plan_for(handle, graph(handle, [op])), {7: x0, 8: np.array(3.0, np.float32), 9: y})
    np.testing.assert_allclose(y, x0 * 1.5, rtol=1e-6)


def test_fallback_mode_and_manual_engine(handle, rng):
    """000: FALLBACK heuristics; 002 §9.3.2: an engine built by global index, an engine config without knobs."""
    xd, yd = tensor(1, (4,)), tensor(2, (4,))
    g = graph(handle, [pointwise(cc.CUDNN_POINTWISE_SQRT, xd, yd)])
    x = np.array([1.0, 4.0, 9.0, 2.25], np.float32)
    y = np.zeros(4, np.float32)
    execute(handle, plan_for(handle, g, mode=ba.CUDNN_HEUR_MODE_FALLBACK), {1: x, 2: y})
    np.testing.assert_array_equal(y, [1, 2, 3, 1.5])
    count = getv(g, "OPERATIONGRAPH_ENGINE_GLOBAL_COUNT", "INT64")[1][0]
    assert count >= 1
    eng = build("ENGINE", [("ENGINE_OPERATION_GRAPH", "BACKEND_DESCRIPTOR", g), ("ENGINE_GLOBAL_INDEX", "INT64", 0)])
    cfg = build("ENGINECFG", [("ENGINECFG_ENGINE", "BACKEND_DESCRIPTOR", eng)])
    plan = build("EXECUTION_PLAN", [("EXECUTION_PLAN_HANDLE", "HANDLE", handle), ("EXECUTION_PLAN_ENGINE_CONFIG", "BACKEND_DESCRIPTOR", cfg)])
    y[:] = 0
    execute(handle, plan, {1: x, 2: y})
    np.testing.assert_array_equal(y, [1, 2, 3, 1.5])


# -- GetAttribute round trips -------------------------------------------------------------------

def test_get_attribute_round_trips(handle):
    xd = tensor(ord("x"), (1, 2, 3, 4), strides=[24, 1, 8, 2], align=16)
    assert getv(xd, "TENSOR_UNIQUE_ID", "INT64") == (1, [ord("x")])
    assert getv(xd, "TENSOR_DIMENSIONS", "INT64") == (4, [1, 2, 3, 4])
    assert getv(xd, "TENSOR_STRIDES", "INT64", 2) == (4, [24, 1])  # min(requested, actual) written
    assert getv(xd, "TENSOR_DATA_TYPE", "DATA_TYPE") == (1, [cc.CUDNN_DATA_FLOAT])
    assert getv(xd, "TENSOR_BYTE_ALIGNMENT", "INT64") == (1, [16])
    assert getv(xd, "TENSOR_IS_VIRTUAL", "BOOLEAN") == (1, [False])  # default
    assert getv(xd, "TENSOR_VECTOR_COUNT", "INT64") == (1, [1])
    assert cc.backendGetAttribute(xd, cc.CUDNN_ATTR_TENSOR_IS_VIRTUAL, ba.CUDNN_TYPE_BOOL, 1) == (1, [False])

    cd = conv_desc((1, 2), (3, 4), (1, 1), (2, 2), spatial=2)
    assert getv(cd, "CONVOLUTION_PRE_PADDING", "INT64") == (2, [1, 2])  # 002 §5.1.3.1 spelling
    assert getv(cd, "CONVOLUTION_POST_PADDINGS", "INT64") == (2, [3, 4])  # header spelling
    assert getv(cd, "CONVOLUTION_MODE", "CONVOLUTION_MODE") == (1, [cc.CUDNN_CROSS_CORRELATION])  # ch. 9 spelling
    assert getv(cd, "CONVOLUTION_SPATIAL_DIMS", "INT64") == (1, [2])

    yd = tensor(ord("y"), (1, 2, 3, 4))
    op = pointwise(cc.CUDNN_POINTWISE_TANH_FWD, xd, yd, alpha1=0.1)
    n, (a,) = getv(op, "OPERATION_POINTWISE_ALPHA1", "DOUBLE")
    assert n == 1 and a == pytest.approx(0.1, rel=1e-7)  # stored as float, read as double
    assert getv(op, "OPERATION_POINTWISE_ALPHA2", "FLOAT") == (1, [1.0])  # default 1.0
    assert getv(op, "OPERATION_POINTWISE_BDESC", "BACKEND_DESCRIPTOR") == (0, [])
    assert getv(op, "OPERATION_POINTWISE_XDESC", "BACKEND_DESCRIPTOR") == (1, [xd])

    g = graph(handle, [op])
    assert getv(g, "OPERATIONGRAPH_HANDLE", "HANDLE") == (1, [handle])
    assert getv(g, "OPERATIONGRAPH_OPS", "BACKEND_DESCRIPTOR") == (1, [op])
    heur = build("ENGINEHEUR", [("ENGINEHEUR_OPERATION_GRAPH", "BACKEND_DESCRIPTOR", g),
                                ("ENGINEHEUR_MODE", "HEUR_MODE", ba.CUDNN_HEUR_MODE_A)])
    assert getv(heur, "ENGINEHEUR_MODE", "HEUR_MODE") == (1, [3])
    n, (cfg,) = getv(heur, "ENGINEHEUR_RESULTS", "BACKEND_DESCRIPTOR", 1)  # new descriptors when none are given
    n, (eng,) = getv(cfg, "ENGINECFG_ENGINE", "BACKEND_DESCRIPTOR")
    n, (idx,) = getv(eng, "ENGINE_GLOBAL_INDEX", "INT64")
    assert 0 <= idx < getv(g, "OPERATIONGRAPH_ENGINE_GLOBAL_COUNT", "INT64")[1][0]
    assert getv(eng, "ENGINE_OPERATION_GRAPH", "BACKEND_DESCRIPTOR") == (1, [g])
    assert getv(eng, "ENGINE_LAYOUT_INFO", "BACKEND_DESCRIPTOR") == (0, [])
    notes = getv(eng, "ENGINE_NUMERICAL_NOTE", "NUMERICAL_NOTE")[1]
    assert all(cc.enums.is_valid("cudnnBackendNumericalNote_t", v) for v in notes)


def test_attribute_name_enum_values():
    # 8.2.1 cudnn_backend.h values, spot checks across the groups (and both spellings of the errata)
    assert (cc.CUDNN_ATTR_POINTWISE_SWISH_BETA, cc.CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, cc.CUDNN_ATTR_ENGINEHEUR_RESULTS) == (8, 106, 202)
    assert (cc.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, cc.CUDNN_ATTR_OPERATION_POINTWISE_DYDESC) == (717, 757)
    assert (cc.CUDNN_ATTR_OPERATION_BN_FINALIZE_EXP_AVERATE_FACTOR_DESC, cc.CUDNN_ATTR_TENSOR_IS_BY_VALUE) == (796, 908)
    assert (cc.CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, cc.CUDNN_ATTR_MATMUL_COMP_TYPE, cc.CUDNN_ATTR_OPERATION_MATMUL_DESC) == (1305, 1500, 1523)
    assert (cc.CUDNN_ATTR_OPERATION_REDUCTION_DESC, cc.CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_BIAS) == (1612, 1630)
    assert cc.CUDNN_ATTR_CONVOLUTION_PRE_PADDING == cc.CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS == 105
    assert cc.CUDNN_ATTR_CONVOLUTION_MODE == cc.CUDNN_ATTR_CONVOLUTION_CONV_MODE == 101
    names = cc.enums.ENUMS["cudnnBackendAttributeName_t"]
    assert ba.CUDNN_ATTR_VARIANT_PACK_WORKSPACE == 1003 and len(set(names.values())) == 131 and len(names) == 134
    for c_name in ("CreateDescriptor", "DestroyDescriptor", "Initialize", "SetAttribute", "GetAttribute", "Finalize", "Execute"):
        assert getattr(cc, "cudnnBackend" + c_name) is getattr(cc, "backend" + c_name)


# -- status rules ----------------------------------------------------------------------------------

def status_of(fn, *args):
    with pytest.raises(cc.CuDNNError) as e:
        fn(*args)
    return e.value


def test_create_destroy_initialize_statuses():
    assert status_of(cc.cudnnBackendCreateDescriptor, 99).status == cc.CUDNN_STATUS_NOT_SUPPORTED
    d = tensor(1, (2, 2))
    cc.cudnnBackendInitialize(d)  # 8.2 one-argument form: back to an empty, unfinalized tensor descriptor
    assert status_of(getv, d, "TENSOR_UNIQUE_ID", "INT64").status == cc.CUDNN_STATUS_NOT_INITIALIZED
    assert status_of(cc.cudnnBackendFinalize, d).status == cc.CUDNN_STATUS_BAD_PARAM  # nothing set any more
    cc.cudnnBackendInitialize(d, cc.CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, 64)  # 002's three-argument form
    setv(d, "KNOB_CHOICE_KNOB_TYPE", "KNOB_TYPE", cc.CUDNN_KNOB_TYPE_SPLIT_K)
    assert status_of(cc.cudnnBackendInitialize, d, 99, 64).status == cc.CUDNN_STATUS_BAD_PARAM
    assert status_of(cc.cudnnBackendInitialize, None).status == cc.CUDNN_STATUS_BAD_PARAM
    cc.cudnnBackendDestroyDescriptor(d)
    assert status_of(cc.cudnnBackendDestroyDescriptor, d).status == cc.CUDNN_STATUS_BAD_PARAM


def test_set_attribute_statuses():
    d = create("TENSOR")
    A, TY = cc.CUDNN_ATTR_TENSOR_UNIQUE_ID, cc.CUDNN_TYPE_INT64
    cases = [  # (args, status, check)
        ((d, cc.CUDNN_ATTR_CONVOLUTION_COMP_TYPE, cc.CUDNN_TYPE_DATA_TYPE, 1, [0]), cc.CUDNN_STATUS_BAD_PARAM, "ATTRIBUTE_NAME"),
        ((d, 12345, TY, 1, [1]), cc.CUDNN_STATUS_BAD_PARAM, "ATTRIBUTE_NAME"),
        ((d, A, cc.CUDNN_TYPE_FLOAT, 1, [1.0]), cc.CUDNN_STATUS_BAD_PARAM, "ATTRIBUTE_TYPE"),
        ((d, A, TY, 2, [1, 2]), cc.CUDNN_STATUS_BAD_PARAM, "ELEMENT_COUNT"),
        ((d, cc.CUDNN_ATTR_TENSOR_DIMENSIONS, TY, 9, list(range(1, 10))), cc.CUDNN_STATUS_BAD_PARAM, "ELEMENT_COUNT"),
        ((d, cc.CUDNN_ATTR_TENSOR_DIMENSIONS, TY, 3, [1, 2]), cc.CUDNN_STATUS_BAD_PARAM, "ATTRIBUTE_VALUE"),
        ((d, A, TY, 1, [1.5]), cc.CUDNN_STATUS_BAD_PARAM, "ATTRIBUTE_VALUE"),
        ((d, cc.CUDNN_ATTR_TENSOR_DATA_TYPE, cc.CUDNN_TYPE_DATA_TYPE, 1, [77]), cc.CUDNN_STATUS_BAD_PARAM, "ATTRIBUTE_VALUE"),
        ((d, cc.CUDNN_ATTR_TENSOR_IS_VIRTUAL, cc.CUDNN_TYPE_BOOLEAN, 1, [2]), cc.CUDNN_STATUS_BAD_PARAM, "ATTRIBUTE_VALUE"),
    ]
    for args, status, check in cases:
        e = status_of(cc.cudnnBackendSetAttribute, *args)
        assert (e.status, e.check) == (status, check), (args, e)
    op = create("OPERATION_POINTWISE")
    e = status_of(setv, op, "OPERATION_POINTWISE_XDESC", "BACKEND_DESCRIPTOR", create("CONVOLUTION"))
    assert (e.status, e.check) == (cc.CUDNN_STATUS_BAD_PARAM, "ATTRIBUTE_VALUE") and "CUDNN_BACKEND_TENSOR_DESCRIPTOR" in str(e)
    g = create("OPERATIONGRAPH")
    e = status_of(setv, g, "OPERATIONGRAPH_ENGINE_GLOBAL_COUNT", "INT64", 3)
    assert (e.status, e.check) == (cc.CUDNN_STATUS_BAD_PARAM, "ATTRIBUTE_READ_ONLY")
    pack = create("VARIANT_PACK")
    e = status_of(setv, pack, "VARIANT_PACK_INTERMEDIATES", "VOID_PTR", [1234])
    assert e.status == cc.CUDNN_STATUS_NOT_SUPPORTED  # 002: placeholder
    setv(pack, "VARIANT_PACK_INTERMEDIATES", "VOID_PTR", [])  # zero elements are fine
    k = build("KNOB_CHOICE", [("KNOB_CHOICE_KNOB_TYPE", "KNOB_TYPE", cc.CUDNN_KNOB_TYPE_SPLIT_K), ("KNOB_CHOICE_KNOB_VALUE", "INT64", 2)])
    e = status_of(setv, k, "KNOB_CHOICE_KNOB_VALUE", "INT64", 3)
    assert e.status == cc.CUDNN_STATUS_NOT_INITIALIZED  # already finalized
    assert getv(k, "KNOB_CHOICE_KNOB_VALUE", "INT64") == (1, [2])


def test_get_attribute_statuses():
    d = tensor(1, (2, 2), finalize=False)
    assert status_of(getv, d, "TENSOR_UNIQUE_ID", "INT64").status == cc.CUDNN_STATUS_NOT_INITIALIZED
    cc.cudnnBackendFinalize(d)
    e = status_of(getv, d, "CONVOLUTION_COMP_TYPE", "DATA_TYPE")
    assert (e.status, e.check) == (cc.CUDNN_STATUS_BAD_PARAM, "ATTRIBUTE_NAME")
    e = status_of(getv, d, "TENSOR_UNIQUE_ID", "DOUBLE")
    assert (e.status, e.check) == (cc.CUDNN_STATUS_BAD_PARAM, "ATTRIBUTE_TYPE")
    e = status_of(cc.cudnnBackendGetAttribute, d, cc.CUDNN_ATTR_TENSOR_UNIQUE_ID, cc.CUDNN_TYPE_INT64, -1)
    assert e.status == cc.CUDNN_STATUS_BAD_PARAM


def finalize_error(d):
    e = status_of(cc.cudnnBackendFinalize, d)
    assert not d.finalized
    return e


def test_finalize_errors_name_check_and_attribute(handle):
    """Seed 004's complaint: every finalize error says which check failed and on which attribute."""
    cases = []
    cases.append((create("CONVOLUTION"), cc.CUDNN_STATUS_BAD_PARAM, "ATTRIBUTE_REQUIRED", "CUDNN_ATTR_CONVOLUTION_COMP_TYPE"))
    d = create("TENSOR")
    setv(d, "TENSOR_UNIQUE_ID", "INT64", 1)
    cases.append((d, cc.CUDNN_STATUS_BAD_PARAM, "ATTRIBUTE_REQUIRED", "CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT"))
    cases.append((tensor(1, (2, 0), strides=[1, 1], finalize=False), cc.CUDNN_STATUS_BAD_PARAM, "TENSOR_DIMENSIONS_POSITIVE",
                  "CUDNN_ATTR_TENSOR_DIMENSIONS"))
    cases.append((tensor(1, (2, 2), strides=[2, -1], finalize=False), cc.CUDNN_STATUS_BAD_PARAM, "TENSOR_STRIDES_POSITIVE",
                  "CUDNN_ATTR_TENSOR_STRIDES"))
    cases.append((tensor(1, (2, 2), align=2, finalize=False), cc.CUDNN_STATUS_BAD_PARAM, "TENSOR_ALIGNMENT",
                  "CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT"))
    cases.append((tensor(1, (2, 4), dtype=cc.CUDNN_DATA_INT8x4, finalize=False), cc.CUDNN_STATUS_NOT_SUPPORTED,
                  "TENSOR_VECTOR_DATA_TYPE", "CUDNN_ATTR_TENSOR_DATA_TYPE"))
    cd = conv_desc((1, 1), (1, 1), (1, 1), (1, 1), spatial=3, finalize=False)
    cases.append((cd, cc.CUDNN_STATUS_BAD_PARAM, "CONV_SPATIAL_DIMS", "CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS"))
    cases.append((conv_desc((1, -1), (1, 1), (1, 1), (1, 1), finalize=False), cc.CUDNN_STATUS_BAD_PARAM, "CONV_PRE_PADDINGS",
                  "CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS"))
    conv = conv_desc((0, 0), (0, 0), (1, 1), (1, 1))
    xd, wd = tensor(1, (1, 4, 5, 5)), tensor(2, (6, 2, 3, 3))
    bad_y = conv_op("FORWARD", conv, {"X": xd, "W": wd, "Y": tensor(3, (1, 6, 4, 3))}, finalize=False)
    cases.append((bad_y, cc.CUDNN_STATUS_BAD_PARAM, "CONV_OUTPUT_DIMS", "CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y"))
    bad_k = conv_op("FORWARD", conv, {"X": xd, "W": tensor(2, (5, 2, 3, 3)), "Y": tensor(3, (1, 5, 3, 3))}, finalize=False)
    cases.append((bad_k, cc.CUDNN_STATUS_BAD_PARAM, "CONV_GROUPS", "CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W"))
    bad_g = conv_op("FORWARD", conv, {"X": tensor(1, (1, 2, 2, 5, 5)), "W": tensor(2, (3, 1, 2, 3, 3)), "Y": tensor(3, (1, 2, 1, 3, 3))},
                    finalize=False)
    cases.append((bad_g, cc.CUDNN_STATUS_BAD_PARAM, "CONV_GROUP_DIMS", "CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W"))
    bad_rank = conv_op("FORWARD", conv, {"X": tensor(1, (4, 5, 5)), "W": wd, "Y": tensor(3, (1, 6, 3, 3))}, finalize=False)
    cases.append((bad_rank, cc.CUDNN_STATUS_BAD_PARAM, "CONV_TENSOR_RANK", "CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X"))
    virt_beta = conv_op("FORWARD", conv, {"X": xd, "W": wd, "Y": tensor(3, (1, 6, 3, 3), virtual=True)}, beta=1.0, finalize=False)
    cases.append((virt_beta, cc.CUDNN_STATUS_NOT_SUPPORTED, "CONV_BETA_VIRTUAL", "CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA"))
    unfinal = conv_op("FORWARD", conv, {"X": tensor(1, (1, 4, 5, 5), finalize=False), "W": wd, "Y": tensor(3, (1, 6, 3, 3))},
                      finalize=False)
    cases.append((unfinal, cc.CUDNN_STATUS_BAD_PARAM, "DESCRIPTOR_NOT_FINALIZED", "CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X"))
    bcast = pointwise(cc.CUDNN_POINTWISE_ADD, tensor(1, (2, 3)), tensor(2, (2, 3)), b=tensor(4, (3, 3)), finalize=False)
    cases.append((bcast, cc.CUDNN_STATUS_BAD_PARAM, "POINTWISE_BROADCAST", "CUDNN_ATTR_OPERATION_POINTWISE_BDESC"))
    no_b = pointwise(cc.CUDNN_POINTWISE_MUL, tensor(1, (2, 3)), tensor(2, (2, 3)), finalize=False)
    cases.append((no_b, cc.CUDNN_STATUS_BAD_PARAM, "POINTWISE_TENSORS", "CUDNN_ATTR_OPERATION_POINTWISE_BDESC"))
    extra_b = pointwise(cc.CUDNN_POINTWISE_SQRT, tensor(1, (2, 3)), tensor(2, (2, 3)), b=tensor(4, (2, 3)), finalize=False)
    cases.append((extra_b, cc.CUDNN_STATUS_BAD_PARAM, "POINTWISE_TENSORS", "CUDNN_ATTR_OPERATION_POINTWISE_BDESC"))
    mm = build("MATMUL", [("MATMUL_COMP_TYPE", "DATA_TYPE", cc.CUDNN_DATA_FLOAT)])
    bad_mm = build("OPERATION_MATMUL", [("OPERATION_MATMUL_ADESC", "BACKEND_DESCRIPTOR", tensor(1, (2, 3))),
                                        ("OPERATION_MATMUL_BDESC", "BACKEND_DESCRIPTOR", tensor(2, (4, 5))),
                                        ("OPERATION_MATMUL_CDESC", "BACKEND_DESCRIPTOR", tensor(3, (2, 5))),
                                        ("OPERATION_MATMUL_DESC", "BACKEND_DESCRIPTOR", mm)], finalize=False)
    cases.append((bad_mm, cc.CUDNN_STATUS_BAD_PARAM, "MATMUL_SHAPE", "CUDNN_ATTR_OPERATION_MATMUL_BDESC"))
    bn = build("OPERATION_BN_FINALIZE_STATISTICS", [("OPERATION_BN_FINALIZE_STATS_MODE", "BN_FINALIZE_STATS_MODE", 0),
                                                    ("OPERATION_BN_FINALIZE_MATH_PREC", "DATA_TYPE", cc.CUDNN_DATA_FLOAT)], finalize=False)
    cases.append((bn, cc.CUDNN_STATUS_NOT_SUPPORTED, "OPERATION_KIND", None))
    cases.append((create("KNOB_INFO"), cc.CUDNN_STATUS_NOT_SUPPORTED, "DESCRIPTOR_READ_ONLY", None))
    cases.append((create("INTERMEDIATE_INFO"), cc.CUDNN_STATUS_NOT_SUPPORTED, "DESCRIPTOR_READ_ONLY", None))
    for d, status, check, attr in cases:
        e = finalize_error(d)
        assert (e.status, e.check) == (status, check), (d, e)
        assert check in str(e) and "cudnnBackendFinalize" in str(e)
        if attr is not None:
            assert e.argument == attr and attr in str(e), e


def test_graph_engine_and_plan_finalize_errors(handle):
    a, b, c = tensor(1, (4,)), tensor(2, (4,)), tensor(3, (4,))
    loop1, loop2 = pointwise(cc.CUDNN_POINTWISE_SQRT, a, b), pointwise(cc.CUDNN_POINTWISE_SQRT, b, a)
    g = build("OPERATIONGRAPH", [("OPERATIONGRAPH_HANDLE", "HANDLE", handle),
                                 ("OPERATIONGRAPH_OPS", "BACKEND_DESCRIPTOR", [loop1, loop2])], finalize=False)
    e = finalize_error(g)
    assert (e.status, e.check, e.argument) == (cc.CUDNN_STATUS_NOT_SUPPORTED, "OPERATIONGRAPH_CYCLE", "CUDNN_ATTR_OPERATIONGRAPH_OPS")
    inplace = pointwise(cc.CUDNN_POINTWISE_SQRT, c, c)
    g = build("OPERATIONGRAPH", [("OPERATIONGRAPH_HANDLE", "HANDLE", handle),
                                 ("OPERATIONGRAPH_OPS", "BACKEND_DESCRIPTOR", [loop1, inplace])], finalize=False)
    assert finalize_error(g).check == "OPERATIONGRAPH_IN_PLACE"
    twice = pointwise(cc.CUDNN_POINTWISE_SQRT, c, b)
    g = build("OPERATIONGRAPH", [("OPERATIONGRAPH_HANDLE", "HANDLE", handle),
                                 ("OPERATIONGRAPH_OPS", "BACKEND_DESCRIPTOR", [loop1, twice])], finalize=False)
    e = finalize_error(g)
    assert (e.status, e.check) == (cc.CUDNN_STATUS_BAD_PARAM, "TENSOR_SINGLE_PRODUCER")
    clash = pointwise(cc.CUDNN_POINTWISE_SQRT, tensor(1, (4,), strides=[2]), c)
    g = build("OPERATIONGRAPH", [("OPERATIONGRAPH_HANDLE", "HANDLE", handle),
                                 ("OPERATIONGRAPH_OPS", "BACKEND_DESCRIPTOR", [loop1, clash])], finalize=False)
    assert finalize_error(g).check == "TENSOR_UNIQUE_ID"
    orphan = pointwise(cc.CUDNN_POINTWISE_SQRT, tensor(5, (4,), virtual=True), c)
    g = build("OPERATIONGRAPH", [("OPERATIONGRAPH_HANDLE", "HANDLE", handle),
                                 ("OPERATIONGRAPH_OPS", "BACKEND_DESCRIPTOR", [orphan])], finalize=False)
    e = finalize_error(g)
    assert (e.status, e.check) == (cc.CUDNN_STATUS_BAD_PARAM, "VIRTUAL_TENSOR_PRODUCER")
    unfinal = pointwise(cc.CUDNN_POINTWISE_SQRT, a, b, finalize=False)
    g = build("OPERATIONGRAPH", [("OPERATIONGRAPH_HANDLE", "HANDLE", handle),
                                 ("OPERATIONGRAPH_OPS", "BACKEND_DESCRIPTOR", [unfinal])], finalize=False)
    e = finalize_error(g)
    assert (e.status, e.check) == (cc.CUDNN_STATUS_BAD_PARAM, "DESCRIPTOR_NOT_FINALIZED") and "OPS[0]" in str(e)

    g = graph(handle, [loop1])
    eng = build("ENGINE", [("ENGINE_OPERATION_GRAPH", "BACKEND_DESCRIPTOR", g), ("ENGINE_GLOBAL_INDEX", "INT64", 1000)], finalize=False)
    e = finalize_error(eng)
    assert (e.status, e.check, e.argument) == (cc.CUDNN_STATUS_NOT_SUPPORTED, "ENGINE_GLOBAL_INDEX", "CUDNN_ATTR_ENGINE_GLOBAL_INDEX")
    g2 = create("OPERATIONGRAPH")
    eng = build("ENGINE", [("ENGINE_OPERATION_GRAPH", "BACKEND_DESCRIPTOR", g2), ("ENGINE_GLOBAL_INDEX", "INT64", 0)], finalize=False)
    e = finalize_error(eng)
    assert (e.status, e.check) == (cc.CUDNN_STATUS_BAD_PARAM, "DESCRIPTOR_NOT_FINALIZED")
    eng = build("ENGINE", [("ENGINE_OPERATION_GRAPH", "BACKEND_DESCRIPTOR", g), ("ENGINE_GLOBAL_INDEX", "INT64", 0)])
    knob = build("KNOB_CHOICE", [("KNOB_CHOICE_KNOB_TYPE", "KNOB_TYPE", cc.CUDNN_KNOB_TYPE_TILE_SIZE), ("KNOB_CHOICE_KNOB_VALUE", "INT64", 3)])
    cfg = build("ENGINECFG", [("ENGINECFG_ENGINE", "BACKEND_DESCRIPTOR", eng), ("ENGINECFG_KNOB_CHOICES", "BACKEND_DESCRIPTOR", [knob])],
                finalize=False)
    e = finalize_error(cfg)
    assert (e.status, e.check) == (cc.CUDNN_STATUS_NOT_SUPPORTED, "KNOB_CHOICE_TYPE")
    cfg = build("ENGINECFG", [("ENGINECFG_ENGINE", "BACKEND_DESCRIPTOR", eng)])
    plan = build("EXECUTION_PLAN", [("EXECUTION_PLAN_ENGINE_CONFIG", "BACKEND_DESCRIPTOR", cfg)], finalize=False)
    e = finalize_error(plan)  # 002 lists the handle as required (its own §9.3.3 sample forgets it)
    assert (e.status, e.check, e.argument) == (cc.CUDNN_STATUS_BAD_PARAM, "ATTRIBUTE_REQUIRED", "CUDNN_ATTR_EXECUTION_PLAN_HANDLE")


def test_execute_statuses_write_nothing(handle):
    xd, yd = tensor(1, (3,)), tensor(2, (3,))
    g = graph(handle, [pointwise(cc.CUDNN_POINTWISE_SQRT, xd, yd)])
    plan = plan_for(handle, g)
    y = np.full(3, 7.0, np.float32)
    pack = build("VARIANT_PACK", [("VARIANT_PACK_UNIQUE_IDS", "INT64", [2]), ("VARIANT_PACK_DATA_POINTERS", "VOID_PTR", [y]),
                                  ("VARIANT_PACK_WORKSPACE", "VOID_PTR", [None])])
    e = status_of(cc.cudnnBackendExecute, handle, plan, pack)
    assert (e.status, e.check) == (cc.CUDNN_STATUS_BAD_PARAM, "VARIANT_PACK_UID") and "uid 1" in str(e)
    small = build("VARIANT_PACK", [("VARIANT_PACK_UNIQUE_IDS", "INT64", [1, 2]),
                                   ("VARIANT_PACK_DATA_POINTERS", "VOID_PTR", [np.ones(2, np.float32), y]),
                                   ("VARIANT_PACK_WORKSPACE", "VOID_PTR", [None])])
    assert status_of(cc.cudnnBackendExecute, handle, plan, small).status == cc.CUDNN_STATUS_BAD_PARAM  # buffer too small
    unfinal = create("VARIANT_PACK")
    assert status_of(cc.cudnnBackendExecute, handle, plan, unfinal).status == cc.CUDNN_STATUS_BAD_PARAM
    assert status_of(cc.cudnnBackendExecute, handle, pack, plan).status == cc.CUDNN_STATUS_BAD_PARAM  # swapped
    np.testing.assert_array_equal(y, 7.0)
    bad = build("VARIANT_PACK", [("VARIANT_PACK_UNIQUE_IDS", "INT64", [1, 1]), ("VARIANT_PACK_DATA_POINTERS", "VOID_PTR", [y, y]),
                                 ("VARIANT_PACK_WORKSPACE", "VOID_PTR", [None])], finalize=False)
    assert finalize_error(bad).check == "VARIANT_PACK_UID_UNIQUE"
    bad = build("VARIANT_PACK", [("VARIANT_PACK_UNIQUE_IDS", "INT64", [1]), ("VARIANT_PACK_DATA_POINTERS", "VOID_PTR", [y, y]),
                                 ("VARIANT_PACK_WORKSPACE", "VOID_PTR", [None])], finalize=False)
    assert finalize_error(bad).check == "VARIANT_PACK_COUNT"


def test_sub_descriptors_can_be_destroyed_after_use(handle, rng):
    """A finalized op keeps what it took from its tensors (as cuDNN copies them)."""
    xd, yd = tensor(1, (5,)), tensor(2, (5,))
    op = pointwise(cc.CUDNN_POINTWISE_RELU_FWD, xd, yd)
    cc.cudnnBackendDestroyDescriptor(xd)
    plan = plan_for(handle, graph(handle, [op]))
    x = rng.standard_normal(5).astype(np.float32)
    y = np.zeros(5, np.float32)
    execute(handle, plan, {1: x, 2: y})
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    op2 = pointwise(cc.CUDNN_POINTWISE_RELU_FWD, yd, tensor(3, (5,)), finalize=False)
    cc.cudnnBackendDestroyDescriptor(yd)
    assert finalize_error(op2).check == "DESCRIPTOR_DESTROYED"


# -- GPU place: the same calls run the GPU engines ---------------------------------------------------

@pytest.mark.gpu
def test_gpu_every_engine_of_a_fused_graph(rng):
    """conv (alpha 1.5, beta 0.5) -> ADD bias -> RELU on a GPU handle: every engine index either
    declines at ENGINE finalize (NOT_SUPPORTED, with the reason) or matches the loop."""
    import cupy
    h = cc.cudnnCreate("gpu")
    N, C, H, W, K = 2, 8, 6, 6, 16
    xd, wd, bd, yd = tensor(10, (N, C, H, W)), tensor(11, (K, C, 3, 3)), tensor(12, (1, K, 1, 1)), tensor(13, (N, K, H, W))
    t0 = tensor(20, (N, K, H, W))  # not virtual: beta needs a prior value
    t1 = tensor(21, (N, K, H, W), virtual=True)
    conv = conv_op("FORWARD", conv_desc((1, 1), (1, 1), (1, 1), (1, 1)), {"X": xd, "W": wd, "Y": t0}, alpha=1.5, beta=0.5)
    g = graph(h, [conv, pointwise(cc.CUDNN_POINTWISE_ADD, t0, t1, b=bd), pointwise(cc.CUDNN_POINTWISE_RELU_FWD, t1, yd)])
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    w = rng.standard_normal((K, C, 3, 3)).astype(np.float32)
    b = rng.standard_normal((1, K, 1, 1)).astype(np.float32)
    t00 = rng.standard_normal((N, K, H, W)).astype(np.float32)
    ref_t0 = 1.5 * loop_conv(x, w, (1, 1), (1, 1), (1, 1), (H, W)) + 0.5 * t00
    want = np.maximum(ref_t0 + b, 0)
    count = getv(g, "OPERATIONGRAPH_ENGINE_GLOBAL_COUNT", "INT64")[1][0]
    ran = []
    for idx in range(count):
        eng = build("ENGINE", [("ENGINE_OPERATION_GRAPH", "BACKEND_DESCRIPTOR", g), ("ENGINE_GLOBAL_INDEX", "INT64", idx)], finalize=False)
        try:
            cc.cudnnBackendFinalize(eng)
            cfg = build("ENGINECFG", [("ENGINECFG_ENGINE", "BACKEND_DESCRIPTOR", eng)])
            plan = build("EXECUTION_PLAN", [("EXECUTION_PLAN_HANDLE", "HANDLE", h), ("EXECUTION_PLAN_ENGINE_CONFIG", "BACKEND_DESCRIPTOR", cfg)])
        except cc.CuDNNError as e:
            assert e.status == cc.CUDNN_STATUS_NOT_SUPPORTED and e.check == "ENGINE_SUPPORT", e
            continue
        ws = getv(plan, "EXECUTION_PLAN_WORKSPACE_SIZE", "INT64")[1][0]
        work = cupy.empty(max(ws, 1), cupy.uint8)
        dx, dw, db = cupy.asarray(x), cupy.asarray(w), cupy.asarray(b)
        dt0, dy = cupy.asarray(t00), cupy.zeros((N, K, H, W), cupy.float32)
        execute(h, plan, {10: dx, 11: dw, 12: db, 13: dy, 20: dt0}, workspace=work.data.ptr if ws else None)
        cupy.cuda.Device().synchronize()
        # the backend API's convolution carries DEFAULT_MATH: float32 may run TF32 (tf32 class, 2e-3 of
        # max|want|; 72 products per output, ~5e-4 relative rounding each); the reference engine is exact
        cls = gemm_class("float32", "DEFAULT_MATH")
        assert_close(dt0.get(), ref_t0, cls, err_msg="t0")
        assert_close(dy.get(), want, cls, err_msg="y")
        ran.append(plan.obj.plan.engine)
    assert "reference" in ran, ran  # the FALLBACK engine always runs; the others are checked when they accept
    cc.cudnnDestroy(h)
