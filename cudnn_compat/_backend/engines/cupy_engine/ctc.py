"""CTC loss on the GPU: generated kernels for the ``CTCLoss`` op with the reference engine's
semantics (reference/adv.py, cudnn_compat/_backend/ops/ctc_sampler.py; 002 §8.2.3 cudnnCTCLoss, §8.2.4 _v8).

Three kernels, all deterministic (no atomics):
  ``ctclse``   (normalization SOFTMAX only) log-sum-exp of every activation row [t, n, :]:
               32 lanes per row, an online (max, sum) merged in shared memory.
  ``ctcab``    one block per batch item n, one thread per extended-label position s
               (l' = blank, l1, blank, ..., S = 2 L + 1 <= 1024): the unalignable test (L + R > T),
               the alpha recursion in log space (alpha kept in two shared rows, each row also
               written to a scratch table [N, T, S_max]), log p, the cost, then, when gradients
               are wanted, the beta recursion, which replaces each table entry by the occupancy
               gamma_t(s) = exp(alpha_t(s) + beta_t(s) - log p - log y_t(l'_s)) (0 where
               alpha + beta is -inf, the reference's "not visited").  log y is read a chunk of
               8 time steps ahead (registers), so the serial loop waits on no load.  Only the
               warps covering S take part after the setup (``bar.sync`` with a thread count).
  ``ctcgrad``  one row (t, n) per 32 lanes, fully parallel: grad = y_k, then for the blank and
               for each distinct label the sum of gamma over the positions s with l'_s = k
               (the blank by a tree, a label along a per-sample chain of its positions, both
               in a fixed order) is subtracted: y_k - sum_s gamma = the reference's
               y_k - exp(logsumexp_s(alpha + beta) - log p - log y_k).  Rows t >= T_n are 0;
               an unalignable sample's rows are 0 (NOT_PROPAGATE_NAN) or its gradients_prior
               (PROPAGATE_NAN).
Scratch (kept per device and stream, as ``rowops.BnRun``): the gamma table, the row
log-sum-exps, one valid flag and one position chain per sample.
"""
from __future__ import annotations

from .codegen import INT32_LIMIT, PREAMBLE, KernelSpec, load_expr, max_offset, name_kernel, store_expr
from .steps import ScratchRun

KINDS = ("CTCLoss",)
FLOATS = ("float16", "bfloat16", "float32", "float64")
MAX_S = 1024  # extended labels per block (one thread each): label lengths up to 511
CHUNK = 8  # time steps of log y loaded ahead
ROWS = 4  # (t, n) rows per block of the gradient kernel (32 lanes each)


def supports(op) -> "str | None":
    for role in ("probs", "gradients", "gradients_prior", "costs"):
        t = op.inputs.get(role) or op.outputs.get(role)
        if t is not None and t.dtype not in FLOATS:
            return f"CTCLoss: {role} data type {t.dtype} is not supported (float types only)"
    lmax = op.inputs["labels"].dims[1] if len(op.inputs["labels"].dims) == 2 else 0
    if 2 * lmax + 1 > MAX_S:
        return f"CTCLoss: label capacity {lmax} exceeds {(MAX_S - 1) // 2} (one thread per extended label)"
    return None


# CUDA helpers of the CTC kernels; ``bar.sync 1, n`` synchronizes the first n threads only (the
# emulator has every thread of the block take part, so it uses __syncthreads)
_HELPERS = r"""
#ifdef CC_EMU
#define CC_BAR(n) __syncthreads()
#else
#define CC_BAR(n) asm volatile("bar.sync 1, %0;" :: "r"(n) : "memory")
#endif
template <typename T> static __device__ __forceinline__ T cc_lse2(T a, T b, T ninf) {
  const T m = a > b ? a : b;
  return m == ninf ? ninf : m + log(exp(a - m) + exp(b - m));
}
template <typename T> static __device__ __forceinline__ T cc_lse3(T a, T b, T c, T ninf) {
  T m = a > b ? a : b; m = m > c ? m : c;
  return m == ninf ? ninf : m + log(exp(a - m) + exp(b - m) + exp(c - m));
}
"""


def _ctype(T):
    return "double" if T == "double" else "float"


def build(step) -> list:
    op = step.op
    probs, labels = op.inputs["probs"], op.inputs["labels"]
    lab_len, in_len = op.inputs["label_lengths"], op.inputs["input_lengths"]
    prior = op.inputs.get("gradients_prior")
    costs, grads = op.outputs["costs"], op.outputs.get("gradients")
    soft = op.attrs["normalization"] == "SOFTMAX"
    keep_prior = op.attrs["grad_mode"] == "PROPAGATE_NAN" and prior is not None
    Tm, N, A = probs.dims
    lmax = labels.dims[1]
    s_max = 2 * lmax + 1
    mem = [probs, costs] + ([grads] if grads is not None else [])
    T = "double" if any(t.dtype == "float64" for t in mem) else "float"
    wdt = "float64" if T == "double" else "float32"
    big = max(N * Tm * s_max, max_offset(probs.dims, probs.strides) + 1,
              (max_offset(grads.dims, grads.strides) + 1) if grads is not None else 0) > INT32_LIMIT
    I = "long long" if big else "int"
    ctx = dict(op=op, probs=probs, labels=labels, lab_len=lab_len, in_len=in_len, prior=prior, costs=costs,
               grads=grads, soft=soft, keep_prior=keep_prior, Tm=Tm, N=N, A=A, lmax=lmax, s_max=s_max, T=T, I=I)
    specs = []
    if soft:
        specs.append(_lse_kernel(ctx))
    specs.append(_ab_kernel(ctx))
    if grads is not None:
        specs.append(_grad_kernel(ctx))
    scratch = {"g": (N * Tm * s_max if grads is not None else 1, wdt), "lse": (Tm * N if soft else 1, wdt),
               "info": (N, "int32"), "chain": (N * s_max if grads is not None else 1, "int32")}
    temps = [t for t in op.outputs.values() if t.is_virtual]
    return [ScratchRun(specs, scratch, temps)]


def _p(t, io="in"):
    from .codegen import STORAGE
    return f"{'const ' if io == 'in' else ''}{STORAGE[t.dtype]}* p{t.uid}"


def _clamped(t, n, I, lo, hi) -> str:
    """A length input's entry n as an int clamped to [lo, hi] (no read outside the tables)."""
    v = f"{load_expr(t.dtype, f'p{t.uid}[({I}){n} * ({I}){t.strides[0]}]', 'int')}"
    return f"({v} < {lo} ? {lo} : ({v} > {hi} ? {hi} : {v}))"


def _logy(c, t_expr, k_expr, n_expr="n"):
    """log y_t(k) for sample n (T), as a C expression."""
    p, T, I = c["probs"], c["T"], c["I"]
    s0, s1, s2 = p.strides
    v = load_expr(p.dtype, f"p{p.uid}[({I})({t_expr}) * ({I}){s0} + ({I})({n_expr}) * ({I}){s1} + ({I})({k_expr}) * ({I}){s2}]", T)
    if c["soft"]:
        return f"({v} - lse[({I})({t_expr}) * ({I}){c['N']} + ({I})({n_expr})])"
    return f"log({v})"


def _lse_kernel(c) -> KernelSpec:
    p, T, I, N, A, Tm = c["probs"], c["T"], c["I"], c["N"], c["A"], c["Tm"]
    B = 32 * ROWS
    rows = Tm * N
    ninf = f"(-{'CC_INF_F' if T == 'float' else 'CC_INF_D'})"
    src = [PREAMBLE, f'extern "C" __global__ void __launch_bounds__({B}) KNAME({_p(p)}, {T}* lse) {{',
           f"  __shared__ {T} smx[{B}]; __shared__ {T} ssm[{B}];",
           "  const int tid = threadIdx.x, lane = tid & 31;",
           f"  const {I} r = ({I})blockIdx.x * {ROWS} + (tid >> 5);",
           f"  {T} m = {ninf}, s = {T}(0);",
           f"  if (r < ({I}){rows}) {{",
           f"    const {I} t = r / {N}, n = r % {N};",
           f"    for (int k = lane; k < {A}; k += 32) {{",
           f"      const {T} e = {load_expr(p.dtype, f'p{p.uid}[t * ({I}){p.strides[0]} + n * ({I}){p.strides[1]} + ({I})k * ({I}){p.strides[2]}]', T)};",
           f"      if (e > m) {{ s = s * exp(m - e) + {T}(1); m = e; }} else {{ s += (e == m) ? {T}(1) : exp(e - m); }}",
           "    }", "  }",
           "  smx[tid] = m; ssm[tid] = s;", "  __syncthreads();",
           "  for (int off = 16; off > 0; off >>= 1) {",
           "    if (lane < off) {",
           f"      const {T} m1 = smx[tid], m2 = smx[tid + off];",
           f"      const {T} mm = m1 > m2 ? m1 : m2;",
           f"      if (mm != {ninf}) ssm[tid] = ssm[tid] * (m1 == mm ? {T}(1) : exp(m1 - mm)) + ssm[tid + off] * (m2 == mm ? {T}(1) : exp(m2 - mm));",
           "      smx[tid] = mm;",
           "    }",
           "    __syncthreads();",
           "  }",
           f"  if (lane == 0 && r < ({I}){rows}) lse[r] = smx[tid] + log(ssm[tid]);",
           "}"]
    name, code = name_kernel("ctclse", "\n".join(src) + "\n")
    return KernelSpec(name, code, [("buf", p.uid), ("extra", "lse", "ptr")], [_p(p), f"{T}* lse"],
                      (max(1, -(-rows // ROWS)), 1, 1), (B, 1, 1), 0, (), "ctclse")


def _ab_kernel(c) -> KernelSpec:
    p, lab, ll, il, costs, grads = c["probs"], c["labels"], c["lab_len"], c["in_len"], c["costs"], c["grads"]
    T, I, N, A, s_max, Tm = c["T"], c["I"], c["N"], c["A"], c["s_max"], c["Tm"]
    B = 32 * -(-s_max // 32)
    P = 1 << (B - 1).bit_length()
    ninf = f"(-{'CC_INF_F' if T == 'float' else 'CC_INF_D'})"
    inf = "CC_INF_F" if T == "float" else "CC_INF_D"
    K = CHUNK
    ly = lambda t: _logy(c, t, "e")  # noqa: E731
    src = [PREAMBLE, _HELPERS]
    params = [_p(p), _p(lab), _p(ll), _p(il), _p(costs, "out"), f"{T}* g", f"const {T}* lse", "int* info", "int* chain"]
    args = [("buf", p.uid), ("buf", lab.uid), ("buf", ll.uid), ("buf", il.uid), ("buf", costs.uid),
            ("extra", "g", "ptr"), ("extra", "lse", "ptr"), ("extra", "info", "ptr"), ("extra", "chain", "ptr")]
    b = [f'extern "C" __global__ void __launch_bounds__({B}) KNAME({", ".join(params)}) {{',
         f"  __shared__ int ext[{B}]; __shared__ int red[{B}];",
         f"  __shared__ {T} buf0[{B}]; __shared__ {T} buf1[{B}];",
         "  const int s = threadIdx.x;",
         "  const int n = blockIdx.x;",
         f"  const int L = {_clamped(ll, 'n', I, 0, c['lmax'])};",
         f"  const int Tn = {_clamped(il, 'n', I, 1, Tm)};",
         "  const int S = 2 * L + 1;",
         "  int e = 0;",
         f"  if ((s & 1) && s < S) {{ e = {load_expr(lab.dtype, f'p{lab.uid}[({I})n * ({I}){lab.strides[0]} + ({I})(s >> 1) * ({I}){lab.strides[1]}]', 'int')};"
         f" e = e < 0 ? 0 : (e > {A - 1} ? {A - 1} : e); }}",
         "  ext[s] = e;",
         "  __syncthreads();",
         "  const bool rep = (s & 1) && s >= 3 && s < S && ext[s] == ext[s - 2];",
         "  red[s] = rep ? 1 : 0;",
         "  __syncthreads();",
         f"  for (int off = {P // 2}; off > 0; off >>= 1) {{",
         f"    if (s < off && s + off < {B}) red[s] += red[s + off];",
         "    __syncthreads();",
         "  }",
         "  const int R = red[0];",
         "  if (L + R > Tn) {",
         f"    if (s == 0) {{ p{costs.uid}[({I})n * ({I}){costs.strides[0]}] = {store_expr(costs.dtype, inf, T)}; info[n] = 0; }}",
         "    return;",
         "  }",
         "  if (s == 0) info[n] = 1;"]
    if grads is not None:  # positions of each label class: first flag, next position (0: none)
        b += ["  if ((s & 1) && s < S) {",
              "    int first = 1, nxt = 0;",
              "    for (int j = 1; j < s; j += 2) if (ext[j] == e) { first = 0; break; }",
              "    for (int j = s + 2; j < S; j += 2) if (ext[j] == e) { nxt = j; break; }",
              f"    chain[({I})n * {s_max} + s] = first | (nxt << 1);",
              "  }"]
    b += ["  const int act = (S + 31) & ~31;",
          "#ifndef CC_EMU",
          "  if (s >= act) return;",
          "#endif",
          "  const bool in = s < S;",
          "  const bool skip = (s & 1) && s >= 3 && in && ext[s] != ext[s - 2];",
          f"  {T}* G = g + ({I})n * ({I}){Tm * s_max};",
          # t = 0
          f"  {T} a = {ninf};",
          f"  if (in && s < 2) a = {ly('0')};",
          "  buf0[s] = a;",
          f"  {'if (in) G[s] = a;' if grads is not None else ''}",
          "  CC_BAR(act);",
          f"  {T} cur[{K}], nx[{K}];",
          "  #pragma unroll",
          f"  for (int j = 0; j < {K}; ++j) cur[j] = (in && 1 + j < Tn) ? {ly('1 + j')} : {T}(0);",
          f"  for (int t0 = 1; t0 < Tn; t0 += {K}) {{",
          "    #pragma unroll",
          f"    for (int j = 0; j < {K}; ++j) nx[j] = (in && t0 + {K} + j < Tn) ? {ly(f't0 + {K} + j')} : {T}(0);",
          "    #pragma unroll",
          f"    for (int j = 0; j < {K}; ++j) {{",
          "      const int t = t0 + j;",
          "      if (t < Tn) {",
          f"        const {T}* pv = (t & 1) ? buf0 : buf1;",
          f"        {T}* cv = (t & 1) ? buf1 : buf0;",
          f"        {T} v = {ninf};",
          "        if (in) {",
          f"          v = cc_lse3<{T}>(pv[s], s >= 1 ? pv[s - 1] : {ninf}, skip ? pv[s - 2] : {ninf}, {ninf});",
          f"          if (v != {ninf}) v += cur[j];",
          f"          {'G[(' + I + ')t * ' + str(s_max) + ' + s] = v;' if grads is not None else ''}",
          "        }",
          "        cv[s] = v;",
          "        CC_BAR(act);",
          "      }",
          "    }",
          "    #pragma unroll",
          f"    for (int j = 0; j < {K}; ++j) cur[j] = nx[j];",
          "  }",
          f"  const {T}* fin = ((Tn - 1) & 1) ? buf1 : buf0;",
          f"  const {T} lp = cc_lse2<{T}>(fin[S - 1], S > 1 ? fin[S - 2] : {ninf}, {ninf});",
          f"  if (s == 0) p{costs.uid}[({I})n * ({I}){costs.strides[0]}] = {store_expr(costs.dtype, '-lp', T)};"]
    if grads is not None:
        b += ["  CC_BAR(act);",  # every thread has read fin before the beta rows overwrite it
              "  const bool skn = in && s + 2 < S && ((s + 2) & 1) && ext[s + 2] != ext[s];",
              "  {",
              "    const int t = Tn - 1;",
              f"    const {T} lt = in ? {ly('t')} : {T}(0);",
              f"    {T} bv = {ninf};",
              "    if (in && (s == S - 1 || s == S - 2)) bv = lt;",
              f"    {T}* cv = (t & 1) ? buf1 : buf0;",
              "    cv[s] = bv;",
              "    if (in) {",
              f"      const {T} ab = G[({I})t * {s_max} + s] + bv;",
              f"      G[({I})t * {s_max} + s] = ab == {ninf} ? {T}(0) : exp(ab - lp - lt);",
              "    }",
              "    CC_BAR(act);",
              "  }",
              f"  {T} ca[{K}], na[{K}];",
              "  #pragma unroll",
              f"  for (int j = 0; j < {K}; ++j) {{ const int t = Tn - 2 - j; cur[j] = (in && t >= 0) ? {ly('t')} : {T}(0);"
              f" ca[j] = (in && t >= 0) ? G[({I})t * {s_max} + s] : {T}(0); }}",
              f"  for (int t0 = Tn - 2; t0 >= 0; t0 -= {K}) {{",
              "    #pragma unroll",
              f"    for (int j = 0; j < {K}; ++j) {{ const int t = t0 - {K} - j; nx[j] = (in && t >= 0) ? {ly('t')} : {T}(0);"
              f" na[j] = (in && t >= 0) ? G[({I})t * {s_max} + s] : {T}(0); }}",
              "    #pragma unroll",
              f"    for (int j = 0; j < {K}; ++j) {{",
              "      const int t = t0 - j;",
              "      if (t >= 0) {",
              f"        const {T}* pv = (t & 1) ? buf0 : buf1;",
              f"        {T}* cv = (t & 1) ? buf1 : buf0;",
              f"        {T} v = {ninf};",
              "        if (in) {",
              f"          v = cc_lse3<{T}>(pv[s], s + 1 < S ? pv[s + 1] : {ninf}, skn ? pv[s + 2] : {ninf}, {ninf});",
              f"          if (v != {ninf}) v += cur[j];",
              f"          const {T} ab = ca[j] + v;",
              f"          G[({I})t * {s_max} + s] = ab == {ninf} ? {T}(0) : exp(ab - lp - cur[j]);",
              "        }",
              "        cv[s] = v;",
              "        CC_BAR(act);",
              "      }",
              "    }",
              "    #pragma unroll",
              f"    for (int j = 0; j < {K}; ++j) {{ cur[j] = nx[j]; ca[j] = na[j]; }}",
              "  }"]
    b.append("}")
    name, code = name_kernel("ctcab", "\n".join(src + b) + "\n")
    return KernelSpec(name, code, args, params, (N, 1, 1), (B, 1, 1), 0, (), "ctcab")


def _grad_kernel(c) -> KernelSpec:
    p, lab, ll, il, grads, prior = c["probs"], c["labels"], c["lab_len"], c["in_len"], c["grads"], c["prior"]
    T, I, N, A, s_max, Tm = c["T"], c["I"], c["N"], c["A"], c["s_max"], c["Tm"]
    keep = c["keep_prior"]
    B = 32 * ROWS
    rows = Tm * N
    gs = grads.strides

    def gref(k):
        return f"p{grads.uid}[t * ({I}){gs[0]} + ({I})n * ({I}){gs[1]} + ({I})({k}) * ({I}){gs[2]}]"

    def y(k):
        return f"exp({_logy(c, 't', k)})"
    params = [_p(p), _p(lab), _p(ll), _p(il)] + ([_p(prior)] if keep else []) + [
        _p(grads, "out"), f"const {T}* g", f"const {T}* lse", "const int* info", "const int* chain"]
    args = [("buf", p.uid), ("buf", lab.uid), ("buf", ll.uid), ("buf", il.uid)] + (
        [("buf", prior.uid)] if keep else []) + [
        ("buf", grads.uid), ("extra", "g", "ptr"), ("extra", "lse", "ptr"), ("extra", "info", "ptr"),
        ("extra", "chain", "ptr")]
    zero = store_expr(grads.dtype, f"{T}(0)", T)
    b = [PREAMBLE, f'extern "C" __global__ void __launch_bounds__({B}) KNAME({", ".join(params)}) {{',
         f"  __shared__ {T} red[{B}];",
         "  const int tid = threadIdx.x, lane = tid & 31;",
         f"  const {I} r = ({I})blockIdx.x * {ROWS} + (tid >> 5);",
         f"  const bool row = r < ({I}){rows};",
         f"  const {I} t = row ? r / {N} : 0;",
         f"  const int n = row ? (int)(r % {N}) : 0;",
         f"  const int Tn = {_clamped(il, 'n', I, 1, Tm)};",
         f"  const int L = {_clamped(ll, 'n', I, 0, c['lmax'])};",
         "  const int S = 2 * L + 1;",
         "  const bool valid = info[n] != 0;",
         "  const bool live = row && valid && t < Tn;",
         "  if (row && !live) {",
         f"    for (int k = lane; k < {A}; k += 32) "
         + (f"{gref('k')} = valid ? {zero} : " + store_expr(grads.dtype, load_expr(
            prior.dtype, f"p{prior.uid}[t * ({I}){prior.strides[0]} + ({I})n * ({I}){prior.strides[1]}"
            f" + ({I})k * ({I}){prior.strides[2]}]", T), T) + ";" if keep else f"{gref('k')} = {zero};"),
         "  }",
         "  if (live) {",
         f"    for (int k = lane; k < {A}; k += 32) {gref('k')} = {store_expr(grads.dtype, y('k'), T)};",
         "  }",
         "  __syncthreads();",
         f"  const {T}* G = g + ({I})n * ({I}){Tm * s_max} + t * ({I}){s_max};",
         f"  {T} acc = {T}(0);",
         "  if (live) for (int s = 2 * lane; s < S; s += 64) acc += G[s];",
         "  red[tid] = acc;",
         "  __syncthreads();",
         "  for (int off = 16; off > 0; off >>= 1) {",
         "    if (lane < off) red[tid] += red[tid + off];",
         "    __syncthreads();",
         "  }",
         f"  if (live && lane == 0) {gref('0')} = {store_expr(grads.dtype, y(0) + ' - red[tid]', T)};",
         "  if (live) {",
         "    for (int s = 2 * lane + 1; s < S; s += 64) {",
         f"      const int ch = chain[({I})n * {s_max} + s];",
         "      if (ch & 1) {",
         f"        {T} sum = G[s];",
         f"        for (int j = ch >> 1; j; j = chain[({I})n * {s_max} + j] >> 1) sum += G[j];",
         f"        int k = {load_expr(lab.dtype, f'p{lab.uid}[({I})n * ({I}){lab.strides[0]} + ({I})(s >> 1) * ({I}){lab.strides[1]}]', 'int')};",
         f"        k = k < 0 ? 0 : (k > {A - 1} ? {A - 1} : k);",
         f"        {gref('k')} = {store_expr(grads.dtype, y('k') + ' - sum', T)};",
         "      }",
         "    }",
         "  }",
         "}"]
    name, code = name_kernel("ctcgrad", "\n".join(b) + "\n")
    return KernelSpec(name, code, args, params, (max(1, -(-rows // ROWS)), 1, 1), (B, 1, 1), 0, (), "ctcgrad")
