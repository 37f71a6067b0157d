"""bfloat16 conversions (issue 23 item 10; cudnn_compat/_backend/dtypes.py): ml_dtypes where installed, the
uint16 bit arithmetic as the fallback; both bit-exact against each other, and each against the
rule written here (round to nearest even; NaN keeps its sign and upper payload, quiet)."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from cudnn_compat._backend import dtypes

ml = pytest.importorskip("ml_dtypes")
ALL_BF16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
# every float32 whose upper half is any bfloat16, with the low halves at the rounding boundaries
LOWS = np.array([0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xFFFF, 0x1234], np.uint32)
F32_BITS = ((ALL_BF16.astype(np.uint32)[:, None] << 16) | LOWS[None, :]).ravel()
F32 = F32_BITS.view(np.float32)


def test_ml_dtypes_is_used_where_installed():
    assert dtypes.BF16 == np.dtype(ml.bfloat16)
    assert dtypes.bf16_to_f32 is dtypes.ml_bf16_to_f32 and dtypes.f32_to_bf16 is dtypes.ml_f32_to_bf16


def test_widening_is_bit_exact_for_every_bfloat16():
    a, b = dtypes.bits_bf16_to_f32(ALL_BF16), dtypes.ml_bf16_to_f32(ALL_BF16)
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    np.testing.assert_array_equal(a.view(np.uint32), ALL_BF16.astype(np.uint32) << 16)  # the definition


def test_rounding_is_bit_exact_over_every_boundary():
    with np.errstate(over="ignore", invalid="ignore"):
        a, b = dtypes.bits_f32_to_bf16(F32), dtypes.ml_f32_to_bf16(F32)
    assert a.dtype == b.dtype == np.uint16
    np.testing.assert_array_equal(a, b)
    # the rule, independently: nearest, ties to the even upper half; NaN -> quiet NaN, payload kept
    hi, lo = F32_BITS >> 16, F32_BITS & 0xFFFF
    up = (lo > 0x8000) | ((lo == 0x8000) & (hi & 1 == 1))
    want = (hi + up).astype(np.uint16)
    nan = np.isnan(F32)
    want[nan] = (hi[nan] | 0x40).astype(np.uint16)
    np.testing.assert_array_equal(a, want)
    assert a[F32_BITS == 0x7F7FFFFF][0] == 0x7F80  # the largest float32 rounds to +inf


@pytest.mark.parametrize("shape", [(), (3,), (2, 3), (0, 4)])
def test_shapes_and_strided_views(shape):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(np.float32)
    for f in (dtypes.bits_f32_to_bf16, dtypes.ml_f32_to_bf16):
        assert f(x).shape == np.shape(x)
    big = rng.standard_normal((4, 6)).astype(np.float32)[:, ::2]  # not contiguous
    np.testing.assert_array_equal(dtypes.bits_f32_to_bf16(big), dtypes.ml_f32_to_bf16(big))
    u = dtypes.bits_f32_to_bf16(rng.standard_normal((4, 6)).astype(np.float32))[:, 1::2]
    np.testing.assert_array_equal(dtypes.bits_bf16_to_f32(u), dtypes.ml_bf16_to_f32(u))


def test_without_ml_dtypes_the_uint16_path_is_used():
    code = ("import sys; sys.modules['ml_dtypes'] = None\n"
            "from cudnn_compat._backend import dtypes as d\n"
            "import numpy as np\n"
            "assert d.BF16 is None and d.f32_to_bf16 is d.bits_f32_to_bf16 and d.bf16_to_f32 is d.bits_bf16_to_f32\n"
            "assert d.to_storage([1.0, 1.00390625], 'bfloat16').tolist() == [0x3F80, 0x3F80]\n"  # tie to even
            "print('ok')")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr
