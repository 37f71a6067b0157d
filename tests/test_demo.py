"""The demo's checks (issue 16 item 4): every op is compared with an independent NumPy formula
written in cudnn_compat/tools/demo.py, not with the library's reference engine, so a wrong op fails
on the CPU place too (cudnn_compat/tools/demo.py; tests/test_cli.py runs the command)."""
from __future__ import annotations

import numpy as np
import pytest

from cudnn_compat.tools import demo


def test_cpu_errors_are_measured_against_the_formulas():
    rows = demo.run("cpu")
    assert [r.op for r in rows] == [name for name, _ in demo.STAGES]
    assert all(r.ok and r.engine == "numpy" for r in rows), rows  # the CPU place's default engine (issue 25)
    # float32 results against float64 formulas: rounding shows where the op does arithmetic
    by_op = {r.op: r.error for r in rows}
    for op in ("ConvolutionForward", "AddTensor (bias)", "BatchNormalizationForwardTraining", "SoftmaxForward"):
        assert 0 < by_op[op] < 1e-5, (op, by_op[op])


@pytest.mark.parametrize("stage", range(len(demo.STAGES)))
def test_a_wrong_op_fails_its_row(monkeypatch, stage):
    """Each op's output perturbed by 1e-2 (or a wrong running statistic): that row, and only it, fails."""
    name, fn = demo.STAGES[stage]

    def wrong(p, net, x):
        outs, t = fn(p, net, x)
        outs[-1] += 1e-2  # the last output (BN: the saved inverse variance)
        return outs, t
    stages = list(demo.STAGES)
    stages[stage] = (name, wrong)
    monkeypatch.setattr(demo, "STAGES", tuple(stages))
    rows = demo.run("cpu", rtol=1e-3)
    assert [r.ok for r in rows] == [i != stage for i in range(len(rows))], rows
    assert 0.9e-2 < rows[stage].error < 1.1e-2


def test_formulas_by_hand():
    net = demo.Network(seed=3, n=1, c=1, hw=4, k=1)
    net.w[...] = 0
    net.w[0, 0, 1, 1] = 2.0  # the centre tap: y = 2 x
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    np.testing.assert_array_equal(demo.conv_formula(net, x)[0], 2.0 * x)
    net.w[0, 0, 1, 1], net.w[0, 0, 0, 0] = 0.0, 1.0  # the top-left tap reads x[i-1, j-1] (zero padding)
    y = demo.conv_formula(net, x)[0]
    assert y[0, 0, 0, 0] == 0 and y[0, 0, 1, 1] == x[0, 0, 0, 0] and y[0, 0, 3, 3] == x[0, 0, 2, 2]
    np.testing.assert_array_equal(demo.max_pool_formula(net, x)[0].ravel(), [5, 7, 13, 15])
    s = demo.softmax_formula(net, np.array([[[[0.0]], [[np.log(3.0)]]]]))[0].ravel()
    np.testing.assert_allclose(s, [0.25, 0.75])
    bn = demo.batch_norm_formula(net, np.array([1.0, 3.0], np.float32).reshape(2, 1, 1, 1))
    mean, var_unbiased = 2.0, 2.0
    np.testing.assert_allclose(bn[1].ravel(), [0.1 * mean])
    np.testing.assert_allclose(bn[2].ravel(), [0.9 + 0.1 * var_unbiased])
    np.testing.assert_allclose(bn[4].ravel(), [1 / np.sqrt(1.0 + demo.BN_EPS)])
