"""Softmax, SoftmaxBackward, NormForward (TRAINING) and NormBackward as row kernels
(``rowwise``), with the reference engine's semantics (reference/softmax.py, reference/norm.py;
002 §3.2.96, §4.1.19, §4.1.4, §4.1.2).

Softmax keeps an online (max, sum of exp) state, merged as m = max(m1, m2),
s = s1 e^(m1-m) + s2 e^(m2-m), so one read of x gives both.  Batch norm sums x - x0
and (x - x0)^2 with x0 the row's first element (the shifted-data variance: no cancellation
when |mean| >> std); backward sums dy and dy (x - x0) in the same pass, and x - x0,
(x - x0)^2 too when the saved statistics are absent.

Fast paths (issue 14 item 4): batch norm runs through ``bn`` (a statistics kernel and a map
kernel at memory speed, ``BnRun``) and softmax through ``softmax_kernels`` (the row in
registers) whenever the layout is one they take; other layouts use the generic ``rowwise``
kernels built from the same specs.  ``FAST_BN`` / ``FAST_SOFTMAX`` switch them off (benchmarks).
"""
from __future__ import annotations

from . import runtime
from .rowwise import RowOut, RowSpec, row_kernels, sum_merge
from .softmax_kernels import softmax_kernels
from .steps import KernelRun, ScratchRun

KINDS = ("Softmax", "SoftmaxBackward", "NormForward", "NormBackward")


def supports(op) -> "str | None":
    if op.kind == "NormForward" and op.attrs.get("phase") != "TRAINING":
        return f"NormForward phase {op.attrs.get('phase')} is not implemented"
    return None


class RowRun:
    """One row kernel, or a split pair sharing a scratch buffer of partial states."""

    def __init__(self, specs, temps):
        self.specs, self.temps = specs, temps

    def kernels(self):
        return list(self.specs)

    def run(self, env, ctx):
        for t in self.temps:
            if t.uid not in env:
                env[t.uid] = runtime.empty(t)
        extra = None
        if len(self.specs) > 1:
            cp = runtime.cupy()
            extra = {"ws": cp.empty(self.specs[0].ws_bytes // 4 + 1, dtype=cp.float32)}
            env = runtime.unalias(env, self.specs[0].guard, self.specs[0].stored)
        for spec in self.specs:
            runtime.launch(spec, env, extra)


def _temps(step, outs):
    """Outputs not consumed by an epilogue that are virtual: later steps read them."""
    return [t for r, t in outs.items() if t.is_virtual and r not in step.epilogues]


def _out(step, role, value):
    op = step.op
    if role not in op.outputs:
        return None
    return RowOut(op.outputs[role], value, step.epilogues.get(role))


def _scalar(op, name):
    return op.inputs[name] if name in op.inputs else float(op.attrs[name])


class BnRun(ScratchRun):
    """Batch norm through ``bn``: one kernel or a stats/apply pair, the 16-byte vector variant
    when every element pointer is aligned, else the scalar one.  The scratch (per-channel
    coefficients, per-block partials, self-resetting ticket counters; ``scratch``: their byte
    sizes) is a ``ScratchRun``'s, kept per stream, so a cached call allocates nothing; work on one
    stream is ordered, so the pair never races with itself."""

    def __init__(self, variants, scratch, temps, guard, stored):
        super().__init__([], {"cnt": (scratch["cnt"] // 4, "uint32"), "ws": (scratch["ws"] // 4, "float32")},
                         temps, guard, stored)
        self.variants, self.scratch = variants, scratch

    def kernels(self):
        return [k for v in self.variants for k in v]

    def launch_all(self, env, extra):
        for specs in self.variants:
            if not specs[0].aligned or runtime.aligned(env, specs[0].aligned):
                for spec in specs:
                    runtime.launch(spec, env, extra)
                return
        raise RuntimeError("no kernel variant fits")  # pragma: no cover - the scalar one always does

    def emulate(self, env, emu, np, variant=None):
        """Run on the CPU emulator (tests): NumPy scratch with zeroed counters; ``variant``
        forces one variant (else the first whose pointers are aligned)."""
        wt = np.float64 if self.variants[0][0].layout.T == "double" else np.float32
        extra = {"cnt": np.zeros(max(1, self.scratch["cnt"] // 4) + 2, np.uint32),
                 "ws": np.zeros(max(1, self.scratch["ws"] // 4) + 8, wt)}
        for i, specs in enumerate(self.variants):
            if variant is not None and i != variant:
                continue
            if variant is not None or not specs[0].aligned or all(
                    env[u].__array_interface__["data"][0] % 16 == 0 for u in specs[0].aligned):
                for spec in specs:
                    emu.launch(spec, [extra[a[1]] if a[0] == "extra" else env[a[1]] for a in spec.args])
                return


def _bn_run(step, spec, coefs):
    """A BnRun for a norm spec, or None when its layout is not one of ``bn``'s fast shapes."""
    from . import bn
    built = bn.build_kernels(spec, coefs)
    if built is None:
        return None
    variants, scratch = built
    lay = variants[0][0].layout
    # pass 2 reads an element where it writes one, unless strides differ: then copy first
    guard = tuple(t.uid for t in spec.elem.values()
                  if any(tuple(t.strides) != tuple(s.strides) for s in lay.e_stores.values()))
    return BnRun(variants, scratch, _temps(step, step.op.outputs), guard, tuple(lay.e_stores))


def build(step) -> list:
    op = step.op
    spec = {"Softmax": _softmax, "SoftmaxBackward": _softmax_backward,
            "NormForward": _norm_forward, "NormBackward": _norm_backward}[op.kind](step)
    if op.kind in ("NormForward", "NormBackward") and FAST_BN:
        run = _bn_run(step, spec, spec.coefs)
        if run is not None:
            return [run]
    if op.kind in ("Softmax", "SoftmaxBackward") and FAST_SOFTMAX:
        role = "y" if op.kind == "Softmax" else "dx"
        ks = softmax_kernels(op, step.epilogues.get(role), role) if role in op.outputs else None
        if ks is not None:
            return [KernelRun(ks, _temps(step, op.outputs))]
    return [RowRun(row_kernels(spec), _temps(step, op.outputs))]


FAST_BN = True  # False: batch norm through the generic row kernels (benchmarks compare both)
FAST_SOFTMAX = True  # False: softmax through the generic row kernels


def _online_merge(a, b):
    return [f"{{ const auto mx = cc_pmax({a}mx, {b}mx);",
            f"  {a}s = {a}s * (({a}mx == mx) ? {{T}}(1) : exp({a}mx - mx)) + {b}s * (({b}mx == mx) ? {{T}}(1) : exp({b}mx - mx));",
            f"  {a}mx = mx; }}"]


def _softmax(step):
    op = step.op
    algo = op.attrs["algorithm"]
    x = op.inputs["x"]
    spec = RowSpec("softmax", x.dims, tuple(op.attrs["axes"]), {"x": x}, leader="x")
    if algo == "FAST":
        spec.state = [("s", 0.0)]
        spec.accumulate = ["st_s += exp(e_x);"]
        spec.merge = sum_merge(["s"])
        spec.apply = ["const auto v = exp(e_x) / st_s;"]
    else:
        spec.state = [("mx", float("-inf")), ("s", 0.0)]
        spec.accumulate = ["if (e_x > st_mx) { st_s = st_s * exp(st_mx - e_x) + {T}(1); st_mx = e_x; }",
                           "else { st_s += (e_x == st_mx) ? {T}(1) : exp(e_x - st_mx); }"]
        spec.merge = _online_merge
        if algo == "LOG":
            spec.finalize = ["const auto ls = log(st_s);"]
            spec.apply = ["const auto v = (e_x - st_mx) - ls;"]
        else:
            spec.apply = ["const auto v = exp(e_x - st_mx) / st_s;"]
    spec.elem_out = _out(step, "y", "v")
    return spec


def _softmax_backward(step):
    op = step.op
    y, dy = op.inputs["y"], op.inputs["dy"]
    spec = RowSpec("softmaxbwd", y.dims, tuple(op.attrs["axes"]), {"y": y, "dy": dy}, leader="y")
    spec.state = [("s", 0.0)]
    spec.merge = sum_merge(["s"])
    if op.attrs["algorithm"] == "LOG":
        spec.accumulate = ["st_s += e_dy;"]
        spec.apply = ["const auto v = e_dy - exp(e_y) * st_s;"]
    else:
        spec.accumulate = ["st_s += e_dy * e_y;"]
        spec.apply = ["const auto v = e_y * (e_dy - st_s);"]
    spec.elem_out = _out(step, "dx", "v")
    return spec


def _count(x, axes) -> int:
    n = 1
    for a in axes:
        n *= x.dims[a]
    return n


# E[d^2] - E[d]^2 may round below 0: clamp it, but let a NaN through (a NaN x makes its channel's
# statistics NaN, as in reference/norm.py; ``var > 0 ? var : 0`` would turn it into 0).
_CLAMP_VAR = "var = var < {T}(0) ? {T}(0) : var;"


def _norm_forward(step):
    op = step.op
    x = op.inputs["x"]
    axes = tuple(op.attrs["axes"])
    m = _count(x, axes)
    spec = RowSpec("bnfwd", x.dims, axes, {"x": x}, leader="x")
    spec.row = {"scale": op.inputs["scale"], "bias": op.inputs["bias"]}
    spec.scalars = {"eps": _scalar(op, "epsilon")}
    spec.state = [("s1", 0.0), ("s2", 0.0)]
    spec.accumulate = ["{ const auto d = e_x - f_x; st_s1 += d; st_s2 += d * d; }"]
    spec.merge = sum_merge(["s1", "s2"])
    spec.finalize = [f"const auto dm = st_s1 / {{T}}({m});",
                     "const auto mean = f_x + dm;",
                     f"auto var = st_s2 / {{T}}({m}) - dm * dm;",
                     _CLAMP_VAR,
                     "const auto inv = {T}(1) / sqrt(var + sc_eps);",
                     "const auto ga = r_scale * inv;"]
    spec.apply = ["const auto v = (e_x - mean) * ga + r_bias;"]
    spec.elem_out = _out(step, "y", "v")
    outs = [_out(step, "saved_mean", "mean"), _out(step, "saved_inv_variance", "inv")]
    if "running_mean" in op.inputs:
        spec.row.update(rm=op.inputs["running_mean"], rv=op.inputs["running_var"])
        spec.scalars["f"] = _scalar(op, "exp_avg_factor")
        unbiased = f"var * {{T}}({m / (m - 1.0)!r})" if m > 1 else "{NAN}"
        spec.finalize.append(f"const auto ub = {unbiased};")
        outs += [_out(step, "next_running_mean", "({T}(1) - sc_f) * r_rm + sc_f * mean"),
                 _out(step, "next_running_var", "({T}(1) - sc_f) * r_rv + sc_f * ub")]
    spec.row_outs = [o for o in outs if o is not None]
    spec.apply_elems = ("x",)
    spec.coefs = ("mean", "ga", "r_bias")  # the row values ``apply`` reads
    return spec


def _norm_backward(step):
    op = step.op
    x, dy = op.inputs["x"], op.inputs["dy"]
    axes = tuple(op.attrs["axes"])
    m = _count(x, axes)
    spec = RowSpec("bnbwd", x.dims, axes, {"x": x, "dy": dy}, leader="x")
    spec.row = {"scale": op.inputs["scale"]}
    saved = "saved_mean" in op.inputs
    acc = ["const auto d = e_x - f_x;", "st_sdy += e_dy;", "st_sdyx += e_dy * d;"]
    state = [("sdy", 0.0), ("sdyx", 0.0)]
    if saved:
        spec.row.update(mean=op.inputs["saved_mean"], inv=op.inputs["saved_inv_variance"])
        fin = ["const auto mean = r_mean;", "const auto inv = r_inv;"]
    else:
        spec.scalars = {"eps": _scalar(op, "epsilon")}
        acc += ["st_s1 += d;", "st_s2 += d * d;"]
        state += [("s1", 0.0), ("s2", 0.0)]
        fin = [f"const auto dm = st_s1 / {{T}}({m});", "const auto mean = f_x + dm;",
               f"auto var = st_s2 / {{T}}({m}) - dm * dm;",
               _CLAMP_VAR,
               "const auto inv = {T}(1) / sqrt(var + sc_eps);"]
    spec.state = state
    spec.accumulate = ["{ " + " ".join(acc) + " }"]
    spec.merge = sum_merge([v for v, _ in state])
    spec.finalize = fin + ["const auto dbias = st_sdy;",
                           "const auto dscale = (st_sdyx - (mean - f_x) * st_sdy) * inv;",
                           "const auto c1 = r_scale * inv;",
                           f"const auto mb = dbias / {{T}}({m});",
                           f"const auto cx = c1 * inv * (dscale / {{T}}({m}));"]
    # dx = c1 (dy - mb - xhat ms) = c1 (dy - mb) - c1 inv ms (x - mean)
    spec.apply = ["const auto v = c1 * (e_dy - mb) - cx * (e_x - mean);"]
    spec.elem_out = _out(step, "dx", "v")
    spec.row_outs = [o for o in (_out(step, "dscale", "dscale"), _out(step, "dbias", "dbias")) if o is not None]
    spec.coefs = ("mean", "c1", "mb", "cx")
    return spec
