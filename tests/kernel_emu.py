"""Run a generated CUDA kernel on the CPU: the source compiled as C++ with a small shim
(blocks run one after another, the threads of a block as std::threads meeting at a
std::barrier for __syncthreads).  A test aid for machines without a GPU: it checks the
index math and arithmetic of the sources the cupy engine generates, not GPU behaviour."""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile

import numpy as np

SHIM = r"""
#include <cmath>
#include <cstring>
#include <cstdint>
#include <thread>
#include <barrier>
#include <vector>
using std::sqrt; using std::exp; using std::log; using std::tanh; using std::erf; using std::expm1;
using std::log1p; using std::fabs; using std::fmax; using std::fmin; using std::pow; using std::rint;
struct cc_dim3 { unsigned int x, y, z; };
static thread_local cc_dim3 threadIdx, blockIdx;
static cc_dim3 blockDim, gridDim;
static std::barrier<>* cc_bar = nullptr;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) alignas(n)
#define CC_EMU 1
static inline void __syncthreads() { if (cc_bar) cc_bar->arrive_and_wait(); }
static inline float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline unsigned int __float_as_uint(float f) { unsigned int u; std::memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline double __longlong_as_double(long long u) { double f; std::memcpy(&f, &u, 8); return f; }
static inline float cc_h2f(unsigned short h) { _Float16 v; std::memcpy(&v, &h, 2); return (float)v; }
static inline unsigned short cc_f2h(float f) { _Float16 v = (_Float16)f; unsigned short h; std::memcpy(&h, &v, 2); return h; }
static inline unsigned short cc_d2h(double d) { _Float16 v = (_Float16)d; unsigned short h; std::memcpy(&h, &v, 2); return h; }
"""


_AVAILABLE: list = []


def available() -> "str | None":
    """None when g++ can build the shim (C++20 <barrier>, _Float16), else why not."""
    if not _AVAILABLE:
        why = None
        if shutil.which("g++") is None:
            why = "g++ is not installed"
        else:
            d = tempfile.mkdtemp(prefix="cc_emu_probe_")
            src = os.path.join(d, "p.cpp")
            with open(src, "w") as f:
                f.write(SHIM + "int main() { return (int)cc_h2f(cc_f2h(0.0f)); }\n")
            r = subprocess.run(["g++", "-std=c++20", "-fsyntax-only", "-w", src], capture_output=True, text=True)
            if r.returncode:
                why = f"g++ cannot build the emulator shim: {r.stderr.strip()[:200]}"
        _AVAILABLE.append(why)
    return _AVAILABLE[0]


def _split(param: str):
    typ, _, name = param.rpartition(" ")
    return typ.strip(), name


def _wrapper(spec) -> str:
    calls = []
    for i, p in enumerate(spec.params):
        typ, _ = _split(p)
        if "*" in typ:
            calls.append(f"({typ})a[{i}]")
        else:
            base = typ.replace("const ", "")
            calls.append(f"*({base}*)a[{i}]")
    call = f"{spec.name}({', '.join(calls)})"
    sync = "__syncthreads" in spec.source
    return f"""
extern "C" void cc_launch(void** a, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz) {{
  blockDim = cc_dim3{{bx, by, bz}}; gridDim = cc_dim3{{gx, gy, gz}};
  const unsigned nt = bx * by * bz;
  for (unsigned z = 0; z < gz; ++z) for (unsigned y = 0; y < gy; ++y) for (unsigned x = 0; x < gx; ++x) {{
    {"std::barrier<> bar(nt); cc_bar = &bar; std::vector<std::thread> ts;" if sync else ""}
    for (unsigned t = 0; t < nt; ++t) {{
      auto body = [=]() {{ blockIdx = cc_dim3{{x, y, z}}; threadIdx = cc_dim3{{t % bx, (t / bx) % by, t / (bx * by)}}; {call}; }};
      {"ts.emplace_back(body);" if sync else "body();"}
    }}
    {"for (auto& th : ts) th.join(); cc_bar = nullptr;" if sync else ""}
  }}
}}
"""


_LIBS: dict = {}
_FLAGS = ("-std=c++20", "-O1", "-fPIC", "-w")
_SHIM_HEADER: list = []  # the shim as a header with its precompiled form beside it (made once per process)


def _shim_header() -> str:
    """The path of a header holding SHIM, precompiled (``.gch``) with the kernels' own flags: every
    kernel includes it instead of parsing <thread>, <barrier> and the rest again (about 0.5 s a kernel
    instead of 1.0-1.5 s; a suite compiles hundreds).  Should the precompilation fail, g++ reads the
    header as text: the same program, only slower."""
    if not _SHIM_HEADER:
        d = tempfile.mkdtemp(prefix="cc_emu_pch_")
        h = os.path.join(d, "cc_shim.h")
        with open(h, "w") as f:
            f.write(SHIM)
        subprocess.run(["g++", *_FLAGS, "-x", "c++-header", h, "-o", h + ".gch"], capture_output=True, text=True)
        _SHIM_HEADER.append(h)
    return _SHIM_HEADER[0]


def compile_spec(spec):
    body = spec.source + _wrapper(spec)
    key = hashlib.sha1((SHIM + body).encode()).hexdigest()
    lib = _LIBS.get(key)
    if lib is None:
        d = tempfile.mkdtemp(prefix="cc_emu_")
        cpp, so = os.path.join(d, "k.cpp"), os.path.join(d, "k.so")
        with open(cpp, "w") as f:
            f.write(body)
        r = subprocess.run(["g++", *_FLAGS, "-include", _shim_header(), "-shared", "-o", so, cpp, "-lpthread"],
                           capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"g++ failed for {spec.name}:\n{r.stderr[:4000]}")
        lib = ctypes.CDLL(so)
        _LIBS[key] = lib
    return lib


SCALAR = {"float": np.float32, "double": np.float64, "int": np.int32, "long long": np.int64,
          "unsigned int": np.uint32, "unsigned long long": np.uint64}


def launch(spec, values: list) -> None:
    """``values``: per parameter a NumPy array (its buffer's address is passed) or a number."""
    lib = compile_spec(spec)
    keep, ptrs = [], []
    for p, v in zip(spec.params, values):
        typ, _ = _split(p)
        if "*" in typ:
            ptrs.append(ctypes.c_void_p(v if isinstance(v, int) else v.__array_interface__["data"][0]))
        else:
            arr = np.array(v, dtype=SCALAR[typ.replace("const ", "")])
            keep.append(arr)
            ptrs.append(ctypes.c_void_p(arr.ctypes.data))
    argv = (ctypes.c_void_p * len(ptrs))(*ptrs)
    lib.cc_launch(argv, *[ctypes.c_uint(v) for v in spec.grid], *[ctypes.c_uint(v) for v in spec.block])
