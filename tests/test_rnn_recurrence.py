"""The composite recurrence ops (cudnn_compat/_backend/ops/rnn.py): a call's graphs stay compact whatever
T is, and every finalize rule of RNNRecurrence / RNNRecurrenceBackward fires with its check name."""
import pytest

from cudnn_compat._backend.ir import GraphError, Operation, OperationGraph, Tensor, packed_strides, scalar
from cudnn_compat.rnn import core as rnn_core
from cudnn_compat.rnn.core import Call, Geometry, RNNConfig, stages


def graphs(kind, mode="LSTM", D=2, L=2, T=100, B=64, H=512, training=True, lengths=None):
    cfg = RNNConfig(mode, "DOUBLE", D, False, H, H, H, L, "float32", "float32")
    geo = Geometry("SEQ", T, B, tuple(lengths or [T] * B))
    present = frozenset({"hx", "cx", "hy", "cy", "dhy", "dcy", "dhx", "dcx"})
    call = Call(cfg, geo, training, present)
    out = []
    for stage, fn, arg in stages(call, kind):
        b = fn(call, arg) if arg is not None else fn(call)
        out.append((stage, b))
    return out


@pytest.mark.parametrize("kind,per_layer", [("forward", 1), ("backward_data", 2)])
def test_a_long_bidirectional_lstm_is_a_handful_of_ops(kind, per_layer):
    """T=100, 2 layers, bidirectional: one recurrence op per layer, the forward's input projection
    inside it (one graph per layer), the backward's a graph of its own (the pure Matmul/Pointwise
    translation was ~3,400 ops and ~5,000 bindings per forward call)."""
    built = graphs(kind)
    ops = sum(len(b.ops) for _, b in built)
    bindings = sum(len(b.bindings) for _, b in built)
    assert len(built) == 2 * per_layer
    assert ops <= 16 and bindings <= 40, (ops, bindings)  # backward: per layer and direction Matmul + 2 bias ADDs
    rec = [op for _, b in built for op in b.ops if op.kind.startswith("RNNRecurrence")]
    assert len(rec) == 2 and all(op.inputs["w_rec"].dims[0] == 2 for op in rec)
    for _, b in built:
        b.finish()  # finalize: every rule holds


def test_op_count_does_not_grow_with_sequence_length():
    short = graphs("forward", T=3, lengths=[3, 2] * 32)
    long = graphs("forward", T=300, lengths=[300, 200] * 32)
    assert [len(b.ops) for _, b in short] == [len(b.ops) for _, b in long]


def test_matmuls_carry_the_math_type():
    """FMA_MATH (no TF32) reaches the input-projection GEMMs of FLOAT data."""
    args = ("GRU", "DOUBLE", 1, False, 4, 4, 4, 1, "float32", "float32", None)
    assert rnn_core.math_type(RNNConfig(*args, False)) == "FMA_MATH"
    assert rnn_core.math_type(RNNConfig(*args, True)) == "DEFAULT_MATH"
    built = graphs("backward_data", mode="GRU", D=1, L=1, T=2, B=2, H=4)
    stamped = [rnn_core._stamped(b, RNNConfig(*args, False)) for _, b in built]
    mms = [op for b in stamped for op in b.ops if op.kind == "Matmul"]
    assert mms and all(op.attrs["math_type"] == "FMA_MATH" for op in mms)
    # the forward's projection is inside its recurrence op, whose GEMMs follow the op's math type
    fwd_cfg = RNNConfig(*args, False)
    call = Call(fwd_cfg, Geometry("SEQ", 2, 2, (2, 2)), False, frozenset())
    (stage, fn, arg), = stages(call, "forward")
    op, = fn(call, arg).ops
    assert stage == "flayer0" and "x" in op.inputs and op.attrs["math_type"] == "FMA_MATH"


# -- finalize rules ------------------------------------------------------------------------------------

def t(uid, dims, dtype="float32"):
    return Tensor(uid, dims, packed_strides(dims), dtype)


def fwd(**change):
    """A valid LSTM forward op (D=1, B=2, T=3, H=2, SEQ, lengths (3, 3)), with ``change`` applied."""
    D, N, B, H = 1, 6, 2, 2
    ins = {"gx": t(1, (D, N, 4 * H)), "w_rec": t(2, (D, 4 * H, H)), "hx": t(3, (D, B, H)), "cx": t(4, (D, B, H))}
    outs = {"y": t(5, (D, N, H)), "hy": t(6, (D, B, H)), "cy": t(7, (D, B, H)), "acts": t(8, (D, N, 4 * H)),
            "c_all": t(9, (D, N, H))}
    attrs = {"mode": "LSTM", "layout": "SEQ", "T": 3, "lengths": (3, 3), "directions": (False,), "clip": None}
    for k, v in change.items():
        if k in attrs:
            attrs[k] = v
        elif v is None:
            ins.pop(k, None)
            outs.pop(k, None)
        elif k in ("y", "hy", "cy", "acts", "c_all", "hpre", "grn"):
            outs[k] = v
        else:
            ins[k] = v
    return Operation("RNNRecurrence", ins, outs, attrs)


def check_of(op):
    with pytest.raises(GraphError) as e:
        OperationGraph([op]).finalize()
    return e.value.check


def test_valid_op_finalizes():
    OperationGraph([fwd()]).finalize()
    OperationGraph([fwd(acts=None, c_all=None)]).finalize()  # inference: no reserve outputs


@pytest.mark.parametrize("change, check", [
    (dict(mode="LSTMX"), "RNN_MODE"),
    (dict(layout="ROWS"), "RNN_LAYOUT"),
    (dict(T=0), "RNN_STEPS"),
    (dict(lengths=(3, 4)), "RNN_LENGTHS"),
    (dict(layout="PACKED", lengths=(2, 3)), "RNN_LENGTHS"),
    (dict(directions=(False, True)), "RNN_DIRECTIONS"),
    (dict(clip="PROPAGATE"), "RNN_CLIP"),
    (dict(gx=t(1, (1, 6, 7))), "RNN_SHAPES"),
    (dict(hx=t(3, (1, 3, 2))), "RNN_SHAPES"),
    (dict(b_rec=t(10, (1, 1, 2))), "RNN_ROLES"),
    (dict(c_all=None), "RNN_RESERVE"),
    (dict(lengths=(3, 1)), "RNN_PADDING"),
    (dict(fill=t(11, (1,))), "RNN_SCALARS"),
])
def test_rules(change, check):
    assert check_of(fwd(**change)) == check


def test_padding_is_fine_with_fill_or_prior_y():
    OperationGraph([fwd(lengths=(3, 1), fill=scalar(11, "float32"))]).finalize()
    OperationGraph([fwd(lengths=(3, 1), y_in=t(12, (1, 6, 2)))]).finalize()


def test_backward_needs_the_saved_activations():
    D, N, B, H = 1, 6, 2, 2
    op = Operation("RNNRecurrenceBackward", {"dy": t(1, (D, N, H)), "w_rec": t(2, (D, 3 * H, H))},
                   {"dgates": t(3, (D, N, 3 * H))},
                   {"mode": "GRU", "layout": "SEQ", "T": 3, "lengths": (3, 3), "directions": (False,), "clip": None})
    assert check_of(op) == "RNN_RESERVE"


def fused(gx_out=True, **change):
    """``fwd`` in the x form: gx computed by the op from x (I=3) and w_in (ops/rnn.py), and written."""
    op = fwd(gx=None)
    ins, outs = dict(op.inputs), dict(op.outputs)
    ins.update(x=t(20, (1, 6, 3)), w_in=t(21, (1, 8, 3)))
    if gx_out:
        outs["gx"] = t(1, (1, 6, 8))
    for k, v in change.items():
        if v is None:
            ins.pop(k, None)
        else:
            ins[k] = v
    return Operation("RNNRecurrence", ins, outs, op.attrs)


def test_the_x_form_finalizes():
    OperationGraph([fused()]).finalize()
    OperationGraph([fused(b_x=t(22, (1, 1, 8)), b_h=t(23, (1, 1, 8)))]).finalize()


@pytest.mark.parametrize("op, check", [
    (lambda: fused(gx_out=False), "RNN_ROLES"),  # x without gx written
    (lambda: fused(w_in=None), "RNN_ROLES"),
    (lambda: fused(gx=t(24, (1, 6, 8))), "RNN_ROLES"),  # gx both read and written
    (lambda: fwd(b_x=t(22, (1, 1, 8))), "RNN_ROLES"),  # the biases without x
    (lambda: fused(w_in=t(21, (1, 8, 4))), "RNN_SHAPES"),  # x is 3 wide, w_in 4
    (lambda: fused(b_h=t(23, (1, 1, 4))), "RNN_SHAPES"),
])
def test_x_form_rules(op, check):
    assert check_of(op()) == check
