"""Graph uids come from one allocator (cudnn_compat._core.uids, issue 15 item 4): the numbers the
families had by hand (they enter the cudnn engine's persisted autotune signatures), no clash
between families whose graphs meet, and the same numbers in every process."""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

import cudnn_compat
from cudnn_compat._core import call as _call
from cudnn_compat import batchnorm as bn, fused_ops, lrn, op_tensor, reduce_tensor, transform
from cudnn_compat.convolution import api as cnn
from cudnn_compat._core.uids import PRIOR_OFFSET, SCALAR, VIRTUAL, Uids, prior_uid


def test_the_families_keep_their_numbers():
    assert (_call.ALPHA, _call.BETA, _call.Y_PRIOR_OFFSET) == (9001, 9002, 5000)
    assert (cnn.X, cnn.W, cnn.Y, cnn.Z, cnn.BIAS, cnn.ALPHA2) == (1, 2, 3, 4, 5, 9003)
    assert (cnn.CONV_OUT, cnn.SUM_Z, cnn.SUM_BIAS) == (8001, 8002, 8003)
    assert (bn.X, bn.DZ, bn.ALPHA_P, bn.BETA_P, bn.EPS, bn.FACTOR) == (1, 16, 9003, 9004, 9005, 9006)
    assert (bn.V1, bn.V2, bn.V3, bn.V4) == (8001, 8002, 8003, 8004)
    assert (op_tensor.A_UID, op_tensor.B_UID, op_tensor.C_UID, op_tensor.ALPHA1, op_tensor.ALPHA2,
            op_tensor.RESULT) == (1, 3, 2, 9011, 9012, 8001)
    assert (reduce_tensor.A_UID, reduce_tensor.C_UID, reduce_tensor.I_UID, reduce_tensor.RESULT) == (1, 2, 3, 8001)
    assert (lrn.X, lrn.DMEANS, lrn.DX_RESULT, lrn.DMEANS_RESULT) == (1, 6, 8001, 8002)
    assert (transform.SRC, transform.DST, transform.W, transform.B_OUT) == (1, 2, 1, 4)
    assert [(t[0], t[-1]) for t in (transform.SRC_PHASE, transform.DST_PHASE, transform.TMP_PHASE)] == \
        [(100, 999), (1000, 3000), (8100, 8999)]


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
    kept = Uids()
    assert kept.scalar(2, at=9011) == (9011, 9012) and kept.scalar() == 9013
    with pytest.raises(ValueError):
        kept.scalar(at=9012)  # below a uid already handed out


def test_the_numbers_do_not_depend_on_import_order():
    code = ("import cudnn_compat.fused_ops as f, cudnn_compat.convolution.api as c, cudnn_compat.batchnorm as b;"
            "print(f.EPS, f.ZERO, f.BN_UID['bias'], c.ALPHA2, c.SUM_BIAS, b.FACTOR)")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert got == [str(v) for v in (fused_ops.EPS, fused_ops.ZERO, fused_ops.BN_UID["bias"], cnn.ALPHA2,
                                    cnn.SUM_BIAS, bn.FACTOR)]


# calls whose first argument (or uid=) is a graph tensor's uid: ir.Tensor, ir.virtual, ir.scalar (imported
# as scalar_tensor), a descriptor's .ir(uid, name), transform._flat
_UID_TAKERS = {"Tensor", "virtual", "scalar_tensor", "ir", "_flat"}


def _literal_uids(tree):
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        if name not in _UID_TAKERS or (name == "virtual" and not isinstance(f, ast.Name)):
            continue  # x.virtual(...): Uids.virtual(n) and backend_ops' Lowering.virtual(dims, ...) take no uid
        for arg in node.args[:1] + [k.value for k in node.keywords if k.arg == "uid"]:
            # 0: a tensor of no graph (extent_bytes of a descriptor)
            if isinstance(arg, ast.Constant) and type(arg.value) is int and arg.value != 0:
                yield node.lineno, name, arg.value


def test_no_module_numbers_a_graph_uid_by_hand():
    """Every uid a module passes to a graph tensor comes from a Uids allocator (or a name bound to one),
    never a literal int (issue 15 item 4)."""
    root = pathlib.Path(cudnn_compat.__file__).parent
    found = [f"{path.relative_to(root)}:{line}: {name}({uid}, ...)"
             for path in sorted(root.rglob("*.py"))
             for line, name, uid in _literal_uids(ast.parse(path.read_text(encoding="utf-8"), str(path)))]
    assert not found, found


def test_the_uid_rule_sees_a_literal():
    code = "t = Tensor(3, d, s, 'float32')\nv = virtual(uid=8001)\nx = xd.ir(2, 'x')\nu = UIDS.virtual(4)\ne = Tensor(0, d, s, 'f')"
    assert [(n, u) for _, n, u in _literal_uids(ast.parse(code))] == [("Tensor", 3), ("virtual", 8001), ("ir", 2)]
