"""AddTensor, SetTensor, ScaleTensor against formulas written here (002 §3.2.2, §3.2.88, §3.2.79)."""
import ctypes
import itertools

import numpy as np
import pytest

import cudnn_compat as cc
from conftest import tdesc


@pytest.mark.parametrize("beta", [0.0, 1.0, -0.5])
@pytest.mark.parametrize("ashape", [(1, 3, 1, 1), (2, 3, 4, 5), (1, 1, 4, 1), (2, 1, 1, 5)])
def test_add_tensor_broadcast_blend(handle, rng, ashape, beta):
    cshape = (2, 3, 4, 5)
    A = rng.standard_normal(ashape).astype(np.float32)
    C0 = rng.standard_normal(cshape).astype(np.float32)
    C = C0.copy()
    cc.cudnnAddTensor(handle, 1.5, tdesc(ashape), A, beta, tdesc(cshape), C)
    want = np.empty(cshape)
    for idx in np.ndindex(*cshape):
        aidx = tuple(i if s > 1 else 0 for i, s in zip(idx, ashape))
        want[idx] = 1.5 * A[aidx] + beta * C0[idx]
    np.testing.assert_allclose(C, want, rtol=1e-6, atol=1e-6)


def test_beta_zero_never_reads_output(handle):
    A = np.ones((1, 2, 1, 1), np.float32)
    C = np.full((1, 2, 2, 2), np.nan, np.float32)
    cc.addTensor(handle, 1.0, tdesc((1, 2, 1, 1)), A, 0.0, tdesc((1, 2, 2, 2)), C)
    assert np.all(C == 1.0)


def test_nhwc_output_and_host_pointer_scalars(handle, rng):
    shape = (2, 3, 2, 2)
    A = rng.standard_normal((1, 3, 1, 1)).astype(np.float32)
    C = np.zeros((2, 2, 2, 3), np.float32)  # NHWC memory
    alpha = np.array(2.0, np.float32)
    cc.addTensor(handle, ctypes.c_void_p(alpha.ctypes.data), tdesc((1, 3, 1, 1)), A, 0, tdesc(shape, fmt=cc.CUDNN_TENSOR_NHWC), C)
    np.testing.assert_allclose(C, np.broadcast_to(2 * A.reshape(1, 1, 1, 3), C.shape), rtol=1e-6)


def test_add_tensor_errors_write_nothing(handle):
    C = np.full((2, 3, 2, 2), 5.0, np.float32)
    with pytest.raises(cc.CuDNNError) as e:  # rule: A dims equal C's or 1
        cc.addTensor(handle, 1, tdesc((2, 2, 2, 2)), np.ones(16, np.float32), 0, tdesc((2, 3, 2, 2)), C)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and "aDesc" in str(e.value)
    with pytest.raises(cc.CuDNNError) as e:  # rule: same data type
        cc.addTensor(handle, 1, tdesc((1, 3, 1, 1), cc.CUDNN_DATA_DOUBLE), np.ones(3), 0, tdesc((2, 3, 2, 2)), C)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM
    with pytest.raises(cc.CuDNNError) as e:  # rule: at most 5 dims
        d6 = tdesc((1, 1, 1, 1, 1, 2))
        cc.addTensor(handle, 1, d6, np.ones(2, np.float32), 0, d6, np.ones(2, np.float32))
    assert e.value.status == cc.CUDNN_STATUS_NOT_SUPPORTED
    with pytest.raises(cc.CuDNNError) as e:  # buffer smaller than the descriptor
        cc.addTensor(handle, 1, tdesc((1, 3, 1, 1)), np.ones(2, np.float32), 0, tdesc((2, 3, 2, 2)), C)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM
    assert np.all(C == 5.0)


def test_set_and_scale_tensor(handle, rng):
    d = tdesc((2, 3, 2, 2), strides=(12, 1, 6, 3))
    y = rng.standard_normal(24).astype(np.float32)
    y0 = y.copy()
    cc.cudnnScaleTensor(handle, d, y, -3.0)
    np.testing.assert_allclose(y, -3.0 * y0, rtol=1e-6)
    cc.setTensor(handle, d, y, 0.25)
    assert np.all(y == 0.25)


def test_repeated_call_is_a_cache_hit(handle):
    d = tdesc((1, 4, 1, 1))
    y = np.zeros(4, np.float32)
    cc.setTensor(handle, d, y, 1.0)
    before = cc.plan_cache_info()
    cc.setTensor(handle, d, y, 2.0)
    after = cc.plan_cache_info()
    assert after.hits == before.hits + 1 and after.misses == before.misses
    assert np.all(y == 2.0)


# -- helpers written for these tests (independent of _backend.dtypes) ------------------------

F, D, H, BF, I8 = cc.CUDNN_DATA_FLOAT, cc.CUDNN_DATA_DOUBLE, cc.CUDNN_DATA_HALF, cc.CUDNN_DATA_BFLOAT16, cc.CUDNN_DATA_INT8
NP_STORAGE = {F: np.float32, D: np.float64, H: np.float16, BF: np.uint16, I8: np.int8}
TOL = {F: 1e-5, D: 1e-12, H: 2e-3, BF: 2e-2, I8: 0.5}


def to_storage(values, dt):
    """Test data in a type's storage; for bfloat16 the values must be exact in bfloat16."""
    v = np.ascontiguousarray(values, np.float64)
    if dt == BF:
        f = v.astype(np.float32)
        assert np.array_equal(f, v) or np.isnan(v).any()
        u = f.view(np.uint32)
        assert np.all((u & 0xFFFF) == 0) or np.isnan(v).any(), "test value not exact in bfloat16"
        return (u >> 16).astype(np.uint16)
    return v.astype(NP_STORAGE[dt])


def from_storage(a, dt):
    if dt == BF:
        return (np.asarray(a, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return np.asarray(a, np.float64)


def small_values(rng, shape, lo=-4, hi=4):
    """Multiples of 1/4 in [lo, hi]: exact in every float type (and in bfloat16)."""
    return rng.integers(lo * 4, hi * 4 + 1, size=shape) / 4.0


def status_of(fn, *args):
    with pytest.raises(cc.CuDNNError) as e:
        fn(*args)
    return e.value.status


BAD, NOTSUP, INVALID = cc.CUDNN_STATUS_BAD_PARAM, cc.CUDNN_STATUS_NOT_SUPPORTED, cc.CUDNN_STATUS_INVALID_VALUE


# -- AddTensor / SetTensor / ScaleTensor in every floating type -----------------------------

@pytest.mark.parametrize("dt", [H, BF, D])
def test_add_set_scale_other_types(handle, rng, dt):
    cshape, ashape = (2, 3, 2, 2), (1, 3, 1, 1)
    A = small_values(rng, ashape)
    C0 = small_values(rng, cshape)
    C = to_storage(C0, dt)
    cc.addTensor(handle, 0.5, tdesc(ashape, dt), to_storage(A, dt), 2.0, tdesc(cshape, dt), C)
    np.testing.assert_allclose(from_storage(C, dt), 0.5 * np.broadcast_to(A, cshape) + 2.0 * C0, rtol=TOL[dt], atol=TOL[dt])
    d = tdesc(cshape, dt, fmt=cc.CUDNN_TENSOR_NHWC)
    y = to_storage(C0.transpose(0, 2, 3, 1), dt)
    cc.scaleTensor(handle, d, y, -0.25)
    np.testing.assert_allclose(from_storage(y, dt), -0.25 * C0.transpose(0, 2, 3, 1), rtol=TOL[dt], atol=TOL[dt])
    cc.setTensor(handle, d, y, 1.5)
    assert np.all(from_storage(y, dt) == 1.5)


def test_double_scalars_read_as_double_pointers(handle):
    alpha = np.array(1.0 + 2.0 ** -40)  # not representable in float32
    A = np.ones(4)
    C = np.zeros(4)
    d = tdesc((1, 4, 1, 1), D)
    cc.addTensor(handle, ctypes.c_void_p(alpha.ctypes.data), d, A, 0.0, d, C)
    assert np.all(C == 1.0 + 2.0 ** -40)


# -- cudnnOpTensor --------------------------------------------------------------------------

OPS = {
    cc.CUDNN_OP_TENSOR_ADD: lambda a, b: a + b,
    cc.CUDNN_OP_TENSOR_MUL: lambda a, b: a * b,
    cc.CUDNN_OP_TENSOR_MIN: lambda a, b: np.minimum(a, b),
    cc.CUDNN_OP_TENSOR_MAX: lambda a, b: np.maximum(a, b),
    cc.CUDNN_OP_TENSOR_SQRT: lambda a, b: np.sqrt(a),
    cc.CUDNN_OP_TENSOR_NOT: lambda a, b: 1.0 - a,
}


def op_desc(op, comp=F, nan=cc.CUDNN_NOT_PROPAGATE_NAN):
    o = cc.cudnnCreateOpTensorDescriptor()
    cc.cudnnSetOpTensorDescriptor(o, op, comp, nan)
    return o


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("bshape", [(2, 3, 4, 5), (1, 3, 1, 1), (2, 1, 4, 1)])
@pytest.mark.parametrize("beta", [0.0, 0.75])
def test_op_tensor_formula_and_broadcast(handle, rng, op, bshape, beta):
    cshape = (2, 3, 4, 5)
    A = rng.uniform(0.1, 2.0, cshape).astype(np.float32)  # positive so SQRT is defined
    B = rng.standard_normal(bshape).astype(np.float32)
    C0 = rng.standard_normal(cshape).astype(np.float32)
    C = C0.copy()
    cc.cudnnOpTensor(handle, op_desc(op), 1.5, tdesc(cshape), A, -2.0, tdesc(bshape), B, beta, tdesc(cshape), C)
    a = 1.5 * A.astype(np.float64)
    b = -2.0 * np.broadcast_to(B.astype(np.float64), cshape)
    want = OPS[op](a, b) + beta * C0
    np.testing.assert_allclose(C, want, rtol=2e-6, atol=2e-6)


def test_op_tensor_not_is_one_minus_alpha1_a(handle):
    """NOT(alpha1*A) = 1 - alpha1*A, B ignored (measured on libcudnn 9.19; see op_tensor.py)."""
    A = np.array([1, 2, -1, 0, 0.5, np.nan, -np.inf, 3], np.float32)
    B = np.full(8, 7.0, np.float32)
    d = tdesc((1, 1, 1, 8))
    for alpha1 in (1.0, 2.0, -1.0):
        C = np.full(8, 100.0, np.float32)
        cc.opTensor(handle, op_desc(cc.CUDNN_OP_TENSOR_NOT), alpha1, d, A, 5.0, d, B, 0.0, d, C)
        np.testing.assert_array_equal(C, (1.0 - alpha1 * A.astype(np.float64)).astype(np.float32))


def test_op_tensor_unary_ignores_b_data(handle, rng):
    A = rng.uniform(0, 4, (1, 2, 2, 2)).astype(np.float32)
    C = np.zeros_like(A)
    d = tdesc(A.shape)
    cc.opTensor(handle, op_desc(cc.CUDNN_OP_TENSOR_SQRT), 1.0, d, A, 1.0, d, None, 0.0, d, C)  # B may be NULL
    np.testing.assert_allclose(C, np.sqrt(A), rtol=1e-6)


@pytest.mark.parametrize("op", [cc.CUDNN_OP_TENSOR_MIN, cc.CUDNN_OP_TENSOR_MAX])
def test_op_tensor_nan_propagation(handle, op):
    A = np.array([np.nan, 1, np.nan, 2], np.float32)
    B = np.array([1, np.nan, np.nan, 3], np.float32)
    d = tdesc((1, 1, 1, 4))
    pick = min if op == cc.CUDNN_OP_TENSOR_MIN else max
    for nan in (cc.CUDNN_NOT_PROPAGATE_NAN, cc.CUDNN_PROPAGATE_NAN):
        C = np.zeros(4, np.float32)
        cc.opTensor(handle, op_desc(op, nan=nan), 1.0, d, A, 1.0, d, B, 0.0, d, C)
        for i in range(4):
            vals = [v for v in (A[i], B[i]) if not np.isnan(v)]
            if nan == cc.CUDNN_PROPAGATE_NAN or not vals:
                want = np.nan if (np.isnan(A[i]) or np.isnan(B[i])) else pick(A[i], B[i])
            else:
                want = pick(vals)
            assert (np.isnan(C[i]) and np.isnan(want)) or C[i] == want, (nan, i, C[i], want)


@pytest.mark.parametrize("comp,ta,tc", [(F, H, H), (F, BF, BF), (D, D, D), (F, F, H), (F, H, F), (F, BF, F), (F, F, BF)])
def test_op_tensor_types(handle, rng, comp, ta, tc):
    shape = (1, 2, 3, 4)
    A, B, C0 = small_values(rng, shape), small_values(rng, (1, 2, 1, 1)), small_values(rng, shape)
    C = to_storage(C0, tc)
    dbl = comp == D
    alpha1 = np.array(0.5, np.float64 if dbl else np.float32)
    cc.opTensor(handle, op_desc(cc.CUDNN_OP_TENSOR_MUL, comp), ctypes.c_void_p(alpha1.ctypes.data), tdesc(shape, ta), to_storage(A, ta),
                2.0, tdesc((1, 2, 1, 1), ta), to_storage(B, ta), -1.0, tdesc(shape, tc), C)
    want = (0.5 * A) * (2.0 * np.broadcast_to(B, shape)) - C0
    np.testing.assert_allclose(from_storage(C, tc), want, rtol=TOL[tc], atol=TOL[tc] * 8)


def test_op_tensor_int8(handle, rng):
    shape = (1, 2, 2, 2)
    A = rng.integers(-20, 20, shape)
    B = rng.integers(-20, 20, shape)
    C = np.zeros(shape, np.int8)
    cc.opTensor(handle, op_desc(cc.CUDNN_OP_TENSOR_ADD), 1.0, tdesc(shape, I8), A.astype(np.int8), 2.0,
                tdesc(shape, I8), B.astype(np.int8), 0.0, tdesc(shape, I8), C)
    np.testing.assert_array_equal(C, A + 2 * B)


def test_op_tensor_strides_and_nhwc(handle, rng):
    shape = (2, 3, 2, 2)
    A = rng.standard_normal(shape).astype(np.float32)  # NCHW
    Bmem = rng.standard_normal(48).astype(np.float32)  # every other element, W fastest
    C = np.zeros((2, 2, 2, 3), np.float32)  # NHWC memory
    bdesc = tdesc(shape, strides=(24, 8, 4, 2))
    cc.opTensor(handle, op_desc(cc.CUDNN_OP_TENSOR_ADD), 1.0, tdesc(shape), A, 1.0, bdesc, Bmem, 0.0,
                tdesc(shape, fmt=cc.CUDNN_TENSOR_NHWC), C)
    B = np.empty(shape)
    for n, c, hh, w in np.ndindex(*shape):
        B[n, c, hh, w] = Bmem[24 * n + 8 * c + 4 * hh + 2 * w]
    np.testing.assert_allclose(C, (A + B).transpose(0, 2, 3, 1), rtol=1e-6)


def test_op_tensor_5d_and_beta_zero_never_reads_c(handle, rng):
    shape = (1, 2, 2, 2, 3)
    A, B = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)
    C = np.full(shape, np.nan, np.float32)
    d = tdesc(shape)
    cc.opTensor(handle, op_desc(cc.CUDNN_OP_TENSOR_MAX), 1.0, d, A, 1.0, d, B, 0.0, d, C)
    np.testing.assert_array_equal(C, np.maximum(A, B))


def test_op_tensor_in_place(handle, rng):
    shape = (1, 2, 3, 4)
    d = tdesc(shape)
    A0 = rng.standard_normal(shape).astype(np.float32)
    B = rng.standard_normal(shape).astype(np.float32)
    A = A0.copy()
    cc.opTensor(handle, op_desc(cc.CUDNN_OP_TENSOR_MUL), 1.0, d, A, 1.0, d, B, 0.0, d, A)  # C is A: allowed
    np.testing.assert_allclose(A, A0 * B, rtol=1e-6)
    A = A0.copy()
    cc.opTensor(handle, op_desc(cc.CUDNN_OP_TENSOR_ADD), 1.0, d, A, 1.0, d, A, 1.0, d, A)  # C is A is B
    np.testing.assert_allclose(A, 3 * A0, rtol=1e-6)
    B0 = B.copy()
    assert status_of(cc.opTensor, handle, op_desc(cc.CUDNN_OP_TENSOR_MUL), 1.0, d, A0, 1.0, d, B, 0.0, d, B) == BAD
    np.testing.assert_array_equal(B, B0)


def _op_error_cases():
    f4 = (1, 2, 2, 2)
    return [
        # (rule, comp, (A shape, type), (B shape, type), (C shape, type), status)
        ("A dims differ from C", F, ((1, 2, 2, 1), F), (f4, F), (f4, F), BAD),
        ("A broadcast", F, ((1, 2, 1, 1), F), (f4, F), (f4, F), BAD),
        ("B not C's or 1", F, (f4, F), ((1, 2, 2, 3), F), (f4, F), BAD),
        ("B rank differs", F, (f4, F), ((1, 2, 2, 2, 1), F), (f4, F), BAD),
        ("fewer than 4 dims", F, ((2, 2, 2), F), ((2, 2, 2), F), ((2, 2, 2), F), BAD),
        ("more than 5 dims", F, ((1,) * 4 + (2, 2), F), ((1,) * 4 + (2, 2), F), ((1,) * 4 + (2, 2), F), NOTSUP),
        ("A and B types differ", F, (f4, F), (f4, H), (f4, F), BAD),
        ("double mixed into C", F, (f4, F), (f4, F), (f4, D), BAD),
        ("double data, float C", D, (f4, D), (f4, D), (f4, F), BAD),
        ("C type unknown", F, (f4, F), (f4, F), (f4, cc.CUDNN_DATA_INT32), BAD),
        ("double compType on float", D, (f4, F), (f4, F), (f4, F), NOTSUP),
        ("float compType on double", F, (f4, D), (f4, D), (f4, D), NOTSUP),
        ("half compType", H, (f4, H), (f4, H), (f4, H), NOTSUP),
        ("half data into bfloat16", F, (f4, H), (f4, H), (f4, BF), NOTSUP),
    ]


@pytest.mark.parametrize("rule,comp,a,b,c,status", _op_error_cases(), ids=[x[0] for x in _op_error_cases()])
def test_op_tensor_errors_write_nothing(handle, rule, comp, a, b, c, status):
    def buf(shape, dt):
        return np.zeros(int(np.prod(shape)) * 8, np.uint8)
    C = np.full(int(np.prod(c[0])) * 8, 7, np.uint8)
    e = status_of(cc.opTensor, handle, op_desc(cc.CUDNN_OP_TENSOR_ADD, comp), 1.0, tdesc(*a), buf(*a), 1.0, tdesc(*b),
                  buf(*b), 0.0, tdesc(*c), C)
    assert e == status, rule
    assert np.all(C == 7)


def test_op_tensor_descriptor_lifecycle(handle):
    o = cc.createOpTensorDescriptor()
    with pytest.raises(cc.CuDNNError) as e:  # created, never set
        cc.getOpTensorDescriptor(o)
    assert e.value.status == BAD and "opTensorDesc" in str(e.value)
    cc.setOpTensorDescriptor(int(o), cc.CUDNN_OP_TENSOR_MIN, D, cc.CUDNN_PROPAGATE_NAN)  # the int id works too
    assert cc.getOpTensorDescriptor(o) == (cc.CUDNN_OP_TENSOR_MIN, D, cc.CUDNN_PROPAGATE_NAN)
    for args in [(6, F, 0), (-1, F, 0), (0, 99, 0), (0, I8, 0), (0, cc.CUDNN_DATA_INT32, 0), (0, F, 2)]:
        assert status_of(cc.setOpTensorDescriptor, o, *args) == BAD, args
    assert cc.getOpTensorDescriptor(o) == (cc.CUDNN_OP_TENSOR_MIN, D, cc.CUDNN_PROPAGATE_NAN)  # unchanged
    cc.destroyOpTensorDescriptor(o)
    assert status_of(cc.getOpTensorDescriptor, int(o)) == BAD
    assert status_of(cc.destroyOpTensorDescriptor, o) == BAD
    d = tdesc((1, 1, 1, 2))
    x = np.zeros(2, np.float32)
    assert status_of(cc.opTensor, handle, o, 1.0, d, x, 1.0, d, x, 0.0, d, x.copy()) == BAD
    assert status_of(cc.opTensor, handle, d, 1.0, d, x, 1.0, d, x, 0.0, d, x.copy()) == BAD  # wrong kind


def test_op_tensor_repeat_is_a_cache_hit(handle):
    d = tdesc((1, 1, 2, 2))
    o = op_desc(cc.CUDNN_OP_TENSOR_ADD)
    x, y = np.ones(4, np.float32), np.zeros(4, np.float32)
    cc.opTensor(handle, o, 1.0, d, x, 1.0, d, x, 0.0, d, y)
    before = cc.plan_cache_info()
    cc.opTensor(handle, o, 2.0, d, x, 3.0, d, x, 0.0, d, y)
    after = cc.plan_cache_info()
    assert after.hits == before.hits + 1 and after.misses == before.misses
    assert np.all(y == 5.0)


# -- cudnnReduceTensor ------------------------------------------------------------------------

RED = {
    cc.CUDNN_REDUCE_TENSOR_ADD: lambda v: np.sum(v),
    cc.CUDNN_REDUCE_TENSOR_MUL: lambda v: np.prod(v),
    cc.CUDNN_REDUCE_TENSOR_MIN: lambda v: np.min(v),
    cc.CUDNN_REDUCE_TENSOR_MAX: lambda v: np.max(v),
    cc.CUDNN_REDUCE_TENSOR_AMAX: lambda v: np.max(np.abs(v)),
    cc.CUDNN_REDUCE_TENSOR_AVG: lambda v: np.mean(v),
    cc.CUDNN_REDUCE_TENSOR_NORM1: lambda v: np.sum(np.abs(v)),
    cc.CUDNN_REDUCE_TENSOR_NORM2: lambda v: np.sqrt(np.sum(v * v)),
    cc.CUDNN_REDUCE_TENSOR_MUL_NO_ZEROS: lambda v: np.prod(v[v != 0]),  # empty product = 1
}
CHOOSE = {  # index of the element MIN/MAX/AMAX pick among the reduced ones, first on ties
    cc.CUDNN_REDUCE_TENSOR_MIN: lambda v: int(np.argmin(v)),
    cc.CUDNN_REDUCE_TENSOR_MAX: lambda v: int(np.argmax(v)),
    cc.CUDNN_REDUCE_TENSOR_AMAX: lambda v: int(np.argmax(np.abs(v))),
}


def red_desc(op, comp=F, nan=cc.CUDNN_NOT_PROPAGATE_NAN, indices=cc.CUDNN_REDUCE_TENSOR_NO_INDICES,
             itype=cc.CUDNN_32BIT_INDICES):
    r = cc.cudnnCreateReduceTensorDescriptor()
    cc.cudnnSetReduceTensorDescriptor(r, op, comp, nan, indices, itype)
    return r


def reduced_groups(ashape, cshape):
    """For each index of C (row-major), the list of A indices reduced into it, in row-major
    order over the reduced dims: the order flattened indices count in."""
    for cidx in np.ndindex(*cshape):
        ranges = [range(a) if c == 1 and a != 1 else [i] for a, c, i in zip(ashape, cshape, cidx)]
        yield cidx, list(itertools.product(*ranges))


def expected_reduction(A, cshape, op):
    out = np.empty(cshape)
    for cidx, group in reduced_groups(A.shape, cshape):
        out[cidx] = RED[op](np.array([A[i] for i in group], np.float64))
    return out


def run_reduce(handle, r, A, adesc, cshape, C, alpha=1.0, beta=0.0, cdt=F, indices=None):
    cd = tdesc(cshape, cdt)
    isize = cc.getReductionIndicesSize(handle, r, adesc, cd)
    wsize = cc.getReductionWorkspaceSize(handle, r, adesc, cd)
    ws = np.zeros(max(wsize, 1), np.uint8)
    cc.cudnnReduceTensor(handle, r, indices, isize, ws, wsize, alpha, adesc, A, beta, cd, C)
    return isize, wsize


@pytest.mark.parametrize("op", sorted(RED))
@pytest.mark.parametrize("cshape", [(1, 3, 1, 1), (2, 1, 4, 1), (1, 1, 1, 1), (2, 3, 4, 1)])
def test_reduce_tensor_every_op(handle, rng, op, cshape):
    A = rng.uniform(0.5, 1.5, (2, 3, 4, 5)) * rng.choice([-1, 1], (2, 3, 4, 5))
    A[1, 2, 1, :] = 0.0  # zeros for MUL_NO_ZEROS (and a whole zero slice along W)
    A = A.astype(np.float32)
    C = np.full(cshape, np.nan, np.float32)  # beta = 0: never read
    run_reduce(handle, red_desc(op), A, tdesc(A.shape), cshape, C)
    np.testing.assert_allclose(C, expected_reduction(A, cshape, op), rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("op", sorted(CHOOSE))
@pytest.mark.parametrize("cshape", [(1, 3, 1, 5), (2, 3, 4, 1), (1, 1, 1, 1), (2, 1, 1, 5)])
def test_reduce_tensor_flattened_indices(handle, rng, op, cshape):
    A = rng.integers(-6, 7, (2, 3, 4, 5)).astype(np.float32)  # small integers: plenty of ties
    r = red_desc(op, indices=cc.CUDNN_REDUCE_TENSOR_FLATTENED_INDICES)
    n = int(np.prod(cshape))
    idx = np.full(n, 12345, np.uint32)
    C = np.zeros(cshape, np.float32)
    isize, _ = run_reduce(handle, r, A, tdesc(A.shape), cshape, C, indices=idx)
    assert isize == 4 * n
    for k, (cidx, group) in enumerate(reduced_groups(A.shape, cshape)):
        vals = np.array([A[i] for i in group])
        assert idx[k] == CHOOSE[op](vals), (cidx, idx[k])
        assert C[cidx] == RED[op](vals)


@pytest.mark.parametrize("op", sorted(CHOOSE))
def test_reduce_tensor_nan(handle, op):
    A = np.array([[3.0, np.nan, -5.0, 1.0], [np.nan, np.nan, np.nan, np.nan]], np.float32).reshape(1, 2, 1, 4)
    cshape = (1, 2, 1, 1)
    for nan in (cc.CUDNN_NOT_PROPAGATE_NAN, cc.CUDNN_PROPAGATE_NAN):
        r = red_desc(op, nan=nan, indices=cc.CUDNN_REDUCE_TENSOR_FLATTENED_INDICES)
        C, idx = np.zeros(cshape, np.float32), np.zeros(2, np.uint32)
        run_reduce(handle, r, A, tdesc(A.shape), cshape, C, indices=idx)
        row = A[0, 0, 0]
        if nan == cc.CUDNN_PROPAGATE_NAN:
            assert np.isnan(C[0, 0, 0, 0]) and idx[0] == 1  # the NaN and where it is
        else:
            kept = [i for i in range(4) if not np.isnan(row[i])]
            best = CHOOSE[op](row[kept])
            assert idx[0] == kept[best] and C[0, 0, 0, 0] == RED[op](row[kept])
        assert np.isnan(C[0, 1, 0, 0])  # nothing but NaN


def test_reduce_tensor_blend_strides_and_types(handle, rng):
    shape = (2, 3, 4, 5)
    X = small_values(rng, shape)
    nhwc = np.ascontiguousarray(X.transpose(0, 2, 3, 1))
    C0 = small_values(rng, (1, 3, 1, 1))
    # half A (NHWC), float C, alpha/beta
    C = C0.astype(np.float32)
    run_reduce(handle, red_desc(cc.CUDNN_REDUCE_TENSOR_ADD), nhwc.astype(np.float16), tdesc(shape, H, fmt=cc.CUDNN_TENSOR_NHWC),
               (1, 3, 1, 1), C, alpha=0.5, beta=-2.0)
    np.testing.assert_allclose(C, 0.5 * X.sum((0, 2, 3), keepdims=True) - 2.0 * C0, rtol=1e-6)
    # double everything, scalars read as doubles through host pointers
    C = C0.copy()
    alpha, beta = np.array(0.25), np.array(1.0)
    run_reduce(handle, red_desc(cc.CUDNN_REDUCE_TENSOR_NORM1, D), X, tdesc(shape, D), (1, 3, 1, 1), C,
               alpha=ctypes.c_void_p(alpha.ctypes.data), beta=ctypes.c_void_p(beta.ctypes.data), cdt=D)
    np.testing.assert_allclose(C, 0.25 * np.abs(X).sum((0, 2, 3), keepdims=True) + C0, rtol=1e-14)
    # int8 A into half C
    I = rng.integers(-9, 10, shape)
    C = np.zeros((2, 1, 1, 1), np.float16)
    run_reduce(handle, red_desc(cc.CUDNN_REDUCE_TENSOR_MAX), I.astype(np.int8), tdesc(shape, I8), (2, 1, 1, 1), C, cdt=H)
    np.testing.assert_array_equal(C.reshape(-1), I.max((1, 2, 3)))


@pytest.mark.parametrize("shape,cshape", [((2, 3, 2, 2, 3), (2, 1, 2, 1, 1)), ((2,) * 8, (1, 2) * 4)])
def test_reduce_tensor_5d_and_8d(handle, rng, shape, cshape):
    A = rng.standard_normal(shape).astype(np.float32)
    C = np.zeros(cshape, np.float32)
    run_reduce(handle, red_desc(cc.CUDNN_REDUCE_TENSOR_AVG), A, tdesc(shape), cshape, C)
    np.testing.assert_allclose(C, expected_reduction(A, cshape, cc.CUDNN_REDUCE_TENSOR_AVG), rtol=1e-5, atol=1e-6)


def test_reduce_tensor_sizes(handle):
    ad, cd = tdesc((2, 3, 4, 5)), tdesc((1, 3, 1, 5))
    flat = cc.CUDNN_REDUCE_TENSOR_FLATTENED_INDICES
    assert cc.getReductionIndicesSize(handle, red_desc(cc.CUDNN_REDUCE_TENSOR_MAX, indices=flat), ad, cd) == 15 * 4
    assert cc.getReductionIndicesSize(handle, red_desc(cc.CUDNN_REDUCE_TENSOR_MAX), ad, cd) == 0
    ws = cc.getReductionWorkspaceSize(handle, red_desc(cc.CUDNN_REDUCE_TENSOR_ADD), ad, cd)
    assert isinstance(ws, int) and ws >= 0
    # the queries answer for a shape that reduces nothing (as libcudnn does); the reduction refuses it
    assert cc.getReductionIndicesSize(handle, red_desc(cc.CUDNN_REDUCE_TENSOR_MAX, indices=flat), ad, ad) == 120 * 4
    assert status_of(cc.getReductionWorkspaceSize, handle, red_desc(cc.CUDNN_REDUCE_TENSOR_ADD), ad, tdesc((1, 2, 1, 1))) == BAD


def _reduce_error_cases():
    flat = cc.CUDNN_REDUCE_TENSOR_FLATTENED_INDICES
    R = cc.CUDNN_REDUCE_TENSOR_ADD
    return [
        # (rule, desc args, A (shape, type), C (shape, type), indices bytes, status)
        ("nothing reduced", (R,), ((1, 3, 2, 2), F), ((1, 3, 2, 2), F), 0, BAD),
        ("C dim neither A's nor 1", (R,), ((2, 3, 2, 2), F), ((1, 2, 1, 1), F), 0, BAD),
        ("C rank differs", (R,), ((2, 3, 2, 2), F), ((1, 3, 1), F), 0, BAD),
        ("double A, float C", (R, D), ((2, 3, 2, 2), D), ((1, 3, 1, 1), F), 0, BAD),
        ("float A, double C", (R, F), ((2, 3, 2, 2), F), ((1, 3, 1, 1), D), 0, BAD),
        ("double compType on float", (R, D), ((2, 3, 2, 2), F), ((1, 3, 1, 1), F), 0, NOTSUP),
        ("float compType on double", (R, F), ((2, 3, 2, 2), D), ((1, 3, 1, 1), D), 0, NOTSUP),
        ("half compType", (R, H), ((2, 3, 2, 2), H), ((1, 3, 1, 1), H), 0, NOTSUP),
        ("bfloat16 data", (R,), ((2, 3, 2, 2), BF), ((1, 3, 1, 1), BF), 0, NOTSUP),
        ("indices for ADD", (R, F, 0, flat), ((2, 3, 2, 2), F), ((1, 3, 1, 1), F), 12, BAD),
        ("64-bit indices", (cc.CUDNN_REDUCE_TENSOR_MAX, F, 0, flat, cc.CUDNN_64BIT_INDICES), ((2, 3, 2, 2), F), ((1, 3, 1, 1), F), 24, NOTSUP),
        ("16-bit indices", (cc.CUDNN_REDUCE_TENSOR_MIN, F, 0, flat, cc.CUDNN_16BIT_INDICES), ((2, 3, 2, 2), F), ((1, 3, 1, 1), F), 12, NOTSUP),
        ("indices too small", (cc.CUDNN_REDUCE_TENSOR_MAX, F, 0, flat), ((2, 3, 2, 2), F), ((1, 3, 1, 1), F), 8, INVALID),
    ]


@pytest.mark.parametrize("rule,dargs,a,c,ibytes,status", _reduce_error_cases(), ids=[x[0] for x in _reduce_error_cases()])
def test_reduce_tensor_errors_write_nothing(handle, rule, dargs, a, c, ibytes, status):
    A = np.ones(int(np.prod(a[0])) * 8, np.uint8)
    C = np.full(int(np.prod(c[0])) * 8, 7, np.uint8)
    idx = np.full(8, 9, np.uint32)
    e = status_of(cc.reduceTensor, handle, red_desc(*dargs), idx, ibytes, None, 0, 1.0, tdesc(*a), A, 0.0, tdesc(*c), C)
    assert e == status, rule
    assert np.all(C == 7) and np.all(idx == 9)


def test_reduce_tensor_more_than_8_dims_not_supported(handle):
    big = cc.createTensorDescriptor()
    big.set(F, cc.CUDNN_TENSOR_NCHW, (2,) + (1,) * 8, (1,) * 9)  # no setter builds 9 dims; the rule still holds
    small = cc.createTensorDescriptor()
    small.set(F, cc.CUDNN_TENSOR_NCHW, (1,) * 9, (1,) * 9)
    C = np.full(1, 3.0, np.float32)
    assert status_of(cc.reduceTensor, handle, red_desc(cc.CUDNN_REDUCE_TENSOR_ADD), None, 0, None, 0, 1.0, big,
                     np.ones(2, np.float32), 0.0, small, C) == NOTSUP
    assert C[0] == 3.0


def test_reduce_tensor_workspace_too_small(handle):
    """The workspace check compares with the plan's need; make the cached plan need some."""
    from cudnn_compat._backend.plan_cache import CACHE
    ad, cd = tdesc((2, 3, 1, 1)), tdesc((1, 3, 1, 1))
    r = red_desc(cc.CUDNN_REDUCE_TENSOR_ADD)
    A, C = np.ones(6, np.float32), np.zeros(3, np.float32)
    assert cc.getReductionWorkspaceSize(handle, r, ad, cd) == 0  # the reference engine needs none
    plans = [p for k, p in list(CACHE._d.items()) if "ReduceTensor" in k and r.key() in k]
    assert plans
    for p in plans:
        p.workspace_size = 64
    try:
        assert cc.getReductionWorkspaceSize(handle, r, ad, cd) == 64
        assert status_of(cc.reduceTensor, handle, r, None, 0, np.zeros(32, np.uint8), 32, 1.0, ad, A, 0.0, cd, C) == INVALID
        assert status_of(cc.reduceTensor, handle, r, None, 0, None, 64, 1.0, ad, A, 0.0, cd, C) == INVALID  # NULL is 0 bytes
        assert np.all(C == 0)
        cc.reduceTensor(handle, r, None, 0, np.zeros(64, np.uint8), 64, 1.0, ad, A, 0.0, cd, C)
        assert np.all(C == 2)
    finally:
        for p in plans:
            p.workspace_size = 0


def test_reduce_tensor_descriptor_lifecycle():
    r = cc.createReduceTensorDescriptor()
    assert status_of(cc.getReduceTensorDescriptor, r) == BAD  # never set
    args = (cc.CUDNN_REDUCE_TENSOR_AMAX, D, cc.CUDNN_PROPAGATE_NAN, cc.CUDNN_REDUCE_TENSOR_FLATTENED_INDICES, cc.CUDNN_32BIT_INDICES)
    cc.setReduceTensorDescriptor(int(r), *args)
    assert cc.getReduceTensorDescriptor(r) == args
    for bad in [(9, F, 0, 0, 0), (0, 99, 0, 0, 0), (0, I8, 0, 0, 0), (0, F, 2, 0, 0), (0, F, 0, 2, 0), (0, F, 0, 0, 4)]:
        assert status_of(cc.setReduceTensorDescriptor, r, *bad) == BAD, bad
    assert cc.getReduceTensorDescriptor(r) == args
    cc.destroyReduceTensorDescriptor(r)
    assert status_of(cc.getReduceTensorDescriptor, r) == BAD
    assert status_of(cc.destroyReduceTensorDescriptor, int(r)) == BAD


# -- cudnnTransformTensor ---------------------------------------------------------------------

@pytest.mark.parametrize("dt", [F, H, BF, D])
def test_transform_tensor_layouts(handle, rng, dt):
    shape = (2, 3, 4, 5)
    X = small_values(rng, shape)
    Y0 = small_values(rng, shape)
    y = to_storage(Y0.transpose(0, 2, 3, 1), dt)  # NHWC memory
    dbl = dt == D
    alpha, beta = np.array(2.0, np.float64 if dbl else np.float32), np.array(-0.5, np.float64 if dbl else np.float32)
    cc.transformTensor(handle, ctypes.c_void_p(alpha.ctypes.data), tdesc(shape, dt), to_storage(X, dt), ctypes.c_void_p(beta.ctypes.data),
                       tdesc(shape, dt, fmt=cc.CUDNN_TENSOR_NHWC), y)
    np.testing.assert_allclose(from_storage(y, dt), (2.0 * X - 0.5 * Y0).transpose(0, 2, 3, 1), rtol=TOL[dt], atol=TOL[dt])


def test_transform_tensor_gathers_strided_input(handle, rng):
    shape = (1, 2, 3, 2)
    strides = (40, 20, 6, 2)  # gaps everywhere
    mem = rng.standard_normal(40).astype(np.float32)
    y = np.full(12, np.nan, np.float32)  # beta = 0: never read
    cc.transformTensor(handle, 1.0, tdesc(shape, strides=strides), mem, 0.0, tdesc(shape), y)
    want = [mem[sum(i * s for i, s in zip(idx, strides))] for idx in np.ndindex(*shape)]
    np.testing.assert_array_equal(y, want)


def test_transform_tensor_errors_write_nothing(handle):
    x = np.ones(120, np.float32)
    y = np.full(120, 5.0, np.float32)
    cases = [
        (tdesc((2, 3, 4, 5)), tdesc((2, 3, 5, 4)), x, y, BAD),  # dims differ
        (tdesc((2, 3, 4, 5)), tdesc((2, 3, 20, 1, 1)), x, y, BAD),  # rank differs
        (tdesc((2, 3, 4, 5)), tdesc((2, 3, 4, 5), D), x, y, BAD),  # data types differ
        (tdesc((2, 3, 4, 5)), tdesc((2, 3, 4, 5), fmt=cc.CUDNN_TENSOR_NHWC), y, y, BAD),  # in place
    ]
    for xd, yd, xx, yy, status in cases:
        assert status_of(cc.transformTensor, handle, 1.0, xd, xx, 0.0, yd, yy) == status
        assert np.all(y == 5.0)


# -- GPU: each GPU engine against the CPU reference and the real libcudnn ----------------------

def _libcudnn(L):
    """(ctypes lib, handle pointer) of the real libcudnn (``L``: conftest's ``legacy_cudnn``)."""
    import ctypes
    lib = L.load()
    h = ctypes.c_void_p()
    assert lib.cudnnCreate(ctypes.byref(h)) == 0
    return lib, h


def _real_tensor(lib, shape, dt=F, strides=None):
    import ctypes
    d = ctypes.c_void_p()
    assert lib.cudnnCreateTensorDescriptor(ctypes.byref(d)) == 0
    strides = strides or [int(np.prod(shape[i + 1:])) for i in range(len(shape))]
    n = len(shape)
    assert lib.cudnnSetTensorNdDescriptor(d, dt, n, (ctypes.c_int * n)(*shape), (ctypes.c_int * n)(*strides)) == 0
    return d


@pytest.mark.gpu
def test_gpu_tensor_ops_match_reference_and_libcudnn(rng, legacy_cudnn):
    import ctypes
    import cupy
    lib, rh = _libcudnn(legacy_cudnn)
    V, fl = ctypes.c_void_p, lambda v: ctypes.byref(ctypes.c_float(v))
    gh, ch = cc.create("gpu"), cc.create("cpu")
    shape, bshape = (2, 3, 4, 5), (1, 3, 1, 5)
    A = rng.uniform(-2, 2, shape).astype(np.float32)
    B = rng.uniform(-2, 2, bshape).astype(np.float32)
    C0 = rng.standard_normal(shape).astype(np.float32)
    ad, bd = tdesc(shape), tdesc(bshape)
    for op in sorted(OPS):
        o = op_desc(op, nan=cc.CUDNN_PROPAGATE_NAN)
        Cg, Cc = cupy.asarray(C0), C0.copy()
        cc.opTensor(gh, o, 1.5, ad, cupy.asarray(A), -0.5, bd, cupy.asarray(B), 0.25, ad, Cg)
        cc.opTensor(ch, o, 1.5, ad, A, -0.5, bd, B, 0.25, ad, Cc)
        ro = V()
        assert lib.cudnnCreateOpTensorDescriptor(ctypes.byref(ro)) == 0
        assert lib.cudnnSetOpTensorDescriptor(ro, op, F, cc.CUDNN_PROPAGATE_NAN) == 0
        Ar, Br, Cr = cupy.asarray(A), cupy.asarray(B), cupy.asarray(C0)
        assert lib.cudnnOpTensor(rh, ro, fl(1.5), _real_tensor(lib, shape), V(Ar.data.ptr), fl(-0.5),
                                 _real_tensor(lib, bshape), V(Br.data.ptr), fl(0.25), _real_tensor(lib, shape), V(Cr.data.ptr)) == 0
        cupy.cuda.runtime.deviceSynchronize()
        np.testing.assert_allclose(Cg.get(), Cc, rtol=1e-5, atol=1e-5, equal_nan=True, err_msg=f"op {op} ({cc.last_engine()})")
        np.testing.assert_allclose(Cr.get(), Cc, rtol=1e-5, atol=1e-5, equal_nan=True, err_msg=f"op {op} vs libcudnn")
    for op in sorted(RED):
        flat = cc.CUDNN_REDUCE_TENSOR_FLATTENED_INDICES if op in CHOOSE else cc.CUDNN_REDUCE_TENSOR_NO_INDICES
        r = red_desc(op, indices=flat)
        cshape = (1, 3, 1, 5)
        n = int(np.prod(cshape))
        Cg, Ig = cupy.zeros(cshape, np.float32), cupy.zeros(n, np.uint32)
        Cc, Ic = np.zeros(cshape, np.float32), np.zeros(n, np.uint32)
        for h, Cx, Ix, Ax in ((gh, Cg, Ig, cupy.asarray(A)), (ch, Cc, Ic, A)):
            ws = cc.getReductionWorkspaceSize(h, r, ad, tdesc(cshape))
            buf = (cupy if h is gh else np).zeros(max(ws, 1), np.uint8)
            cc.reduceTensor(h, r, Ix, 4 * n, buf, ws, 2.0, ad, Ax, 0.0, tdesc(cshape), Cx)
        rr = V()
        assert lib.cudnnCreateReduceTensorDescriptor(ctypes.byref(rr)) == 0
        assert lib.cudnnSetReduceTensorDescriptor(rr, op, F, 0, flat, 0) == 0
        rsz, wsz = ctypes.c_size_t(), ctypes.c_size_t()
        ra, rc = _real_tensor(lib, shape), _real_tensor(lib, cshape)
        assert lib.cudnnGetReductionIndicesSize(rh, rr, ra, rc, ctypes.byref(rsz)) == 0
        assert lib.cudnnGetReductionWorkspaceSize(rh, rr, ra, rc, ctypes.byref(wsz)) == 0
        Ir, Wr, Cr, Ar = cupy.zeros(max(rsz.value, 4), np.uint8), cupy.zeros(max(wsz.value, 4), np.uint8), cupy.zeros(cshape, np.float32), cupy.asarray(A)
        assert lib.cudnnReduceTensor(rh, rr, V(Ir.data.ptr), ctypes.c_size_t(rsz.value), V(Wr.data.ptr), ctypes.c_size_t(wsz.value),
                                     fl(2.0), ra, V(Ar.data.ptr), fl(0.0), rc, V(Cr.data.ptr)) == 0
        cupy.cuda.runtime.deviceSynchronize()
        np.testing.assert_allclose(Cg.get(), Cc, rtol=1e-5, atol=1e-5, err_msg=f"reduce {op} ({cc.last_engine()})")
        np.testing.assert_allclose(Cr.get(), Cc, rtol=1e-5, atol=1e-5, err_msg=f"reduce {op} vs libcudnn")
        if op in CHOOSE:
            np.testing.assert_array_equal(Ig.get(), Ic)
            np.testing.assert_array_equal(Ir.get()[:4 * n].view(np.uint32), Ic)
    Yg, Yc = cupy.zeros(A.size, np.float32), np.zeros(A.size, np.float32)
    nhwc = tdesc(shape, fmt=cc.CUDNN_TENSOR_NHWC)
    cc.transformTensor(gh, 1.0, ad, cupy.asarray(A), 0.0, nhwc, Yg)
    cc.transformTensor(ch, 1.0, ad, A, 0.0, nhwc, Yc)
    np.testing.assert_array_equal(Yg.get(), Yc)
    cc.destroy(gh)
    cc.destroy(ch)
    lib.cudnnDestroy(rh)
