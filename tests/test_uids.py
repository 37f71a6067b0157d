"""Graph uids come from one allocator (cudnn_compat._uids, issue 15 item 4): the numbers the
families had by hand (they enter the cudnn engine's persisted autotune signatures), no clash
between families whose graphs meet, and the same numbers in every process."""
from __future__ import annotations

import subprocess
import sys

import pytest

from cudnn_compat import _call, batchnorm as bn, cnn, fused_ops
from cudnn_compat._uids import PRIOR_OFFSET, SCALAR, VIRTUAL, Uids, prior_uid


def test_the_families_keep_their_numbers():
    assert (_call.ALPHA, _call.BETA, _call.Y_PRIOR_OFFSET) == (9001, 9002, 5000)
    assert (cnn.X, cnn.W, cnn.Y, cnn.Z, cnn.BIAS, cnn.ALPHA2) == (1, 2, 3, 4, 5, 9003)
    assert (cnn.CONV_OUT, cnn.SUM_Z, cnn.SUM_BIAS) == (8001, 8002, 8003)
    assert (bn.X, bn.DZ, bn.ALPHA_P, bn.BETA_P, bn.EPS, bn.FACTOR) == (1, 16, 9003, 9004, 9005, 9006)


def test_fused_ops_uids_meet_none_of_batchnorms():
    """Op 6 runs batchnorm's backward graph with the fused scalars beside batchnorm's and the blend's."""
    mine = {fused_ops.EPS, fused_ops.INV_M, fused_ops.KEEP, fused_ops.FACTOR, fused_ops.FACTOR_UNBIASED,
            fused_ops.ONE, fused_ops.ZERO}
    theirs = {_call.ALPHA, _call.BETA, bn.ALPHA_P, bn.BETA_P, bn.EPS, bn.FACTOR}
    assert len(mine) == 7 and not mine & theirs and min(mine) > max(theirs)
    data = set(range(bn.X, bn.DZ + 1))
    assert fused_ops.BN_UID["bias"] not in data and set(fused_ops.BN_UID.values()) - {fused_ops.BN_UID["bias"]} <= data


def test_ranges_and_priors():
    u = Uids()
    assert u.data() == 1 and u.data(2) == (2, 3) and u.virtual() == VIRTUAL and u.scalar(2) == (SCALAR, SCALAR + 1)
    assert prior_uid(3) == 3 + PRIOR_OFFSET
    after = Uids(after=u)
    assert after.data() == 4 and after.virtual() == VIRTUAL + 1 and after.scalar() == SCALAR + 2
    with pytest.raises(ValueError):
        Uids().data(VIRTUAL - PRIOR_OFFSET)  # a prior would reach the virtual range


def test_the_numbers_do_not_depend_on_import_order():
    code = ("import cudnn_compat.fused_ops as f, cudnn_compat.cnn as c, cudnn_compat.batchnorm as b;"
            "print(f.EPS, f.ZERO, f.BN_UID['bias'], c.ALPHA2, c.SUM_BIAS, b.FACTOR)")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert got == [str(v) for v in (fused_ops.EPS, fused_ops.ZERO, fused_ops.BN_UID["bias"], cnn.ALPHA2,
                                    cnn.SUM_BIAS, bn.FACTOR)]
