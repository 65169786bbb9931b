"""Run onnxep's CUDA C kernels on the CPU, for tests on machines without a GPU.

The kernel source (the very string a kernel module hands NVRTC) is compiled
with g++ against a small prelude: one ``std::thread`` per CUDA thread,
``std::barrier`` for ``__syncthreads``, a per-warp exchange for
``__shfl_xor_sync``, ``_Float16`` for ``__half``, dynamic shared memory filled
with NaN bytes so a read before a write shows. Blocks run one after another.
:func:`emulated_function` stands in for ``nvrtc.function``; the callable it
returns checks every argument against the kernel's C signature (count, scalar
types, pointer element dtypes, contiguity, a parameter struct's byte size as
g++ lays it out) -- which CuPy does not -- and the launch limits (block size,
grid y/z, 48 KiB of shared memory).

Limits: templates must be ``template <typename T> __global__ void
__launch_bounds__(N) name(...)`` instantiated for ``float``/``__half``; shuffles
must be warp-uniform and blocks a multiple of 32 threads; races between blocks
cannot show. Compiled with ``-ffp-contract=off``, as NVRTC is asked to keep
the ``__f*_rn`` products separate (the build and its cache: ``gxx_build``).

Why this is not ``cuda_emulator`` (the fiber emulator the reduction, index,
norm and hybrid kernels run on): the attention kernels are fetched through
NVRTC's ``function(source, name, name_expressions)`` door, not
``compile_kernels(body, names)``; they launch 3-D grids (``gridDim.y/z``)
with dynamic ``extern __shared__`` memory sized per launch, and take
parameter structs whose byte size is checked against g++'s layout. The fiber
emulator has a 1-D grid, static shared memory and scalar/pointer arguments
only; porting the attention tests means teaching it those three first.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import types
from typing import Any

import numpy as np
from gxx_build import build_shared

_PRELUDE = r"""
#include <math.h>
#include <string.h>
#include <stdint.h>
#include <atomic>
#include <barrier>
#include <functional>
#include <memory>
#include <thread>
#include <vector>
struct dim3 { unsigned x = 1, y = 1, z = 1; };
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
float* g_smem = nullptr;
std::barrier<>* g_block_barrier = nullptr;
struct Warp { std::barrier<> bar{32}; float vals[32]; };
std::vector<std::unique_ptr<Warp>>* g_warps = nullptr;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
inline void __syncthreads() { g_block_barrier->arrive_and_wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }
inline int atomicCAS(int* p, int e, int d) {
  std::atomic_ref<int>(*p).compare_exchange_strong(e, d);
  return e;
}
inline float __shfl_xor_sync(unsigned, float v, int o) {
  Warp& w = *(*g_warps)[threadIdx.x / 32];
  const int l = threadIdx.x % 32;
  w.vals[l] = v;
  w.bar.arrive_and_wait();
  const float r = w.vals[l ^ o];
  w.bar.arrive_and_wait();
  return r;
}
inline float __shfl_sync(unsigned, float v, int src) {
  Warp& w = *(*g_warps)[threadIdx.x / 32];
  const int l = threadIdx.x % 32;
  w.vals[l] = v;
  w.bar.arrive_and_wait();
  const float r = w.vals[src & 31];
  w.bar.arrive_and_wait();
  return r;
}
template <typename T> inline T __ldcg(const T* p) { return *(const volatile T*)p; }
inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
struct __half { _Float16 v; };
inline float __half2float(__half h) { return (float)h.v; }
inline __half __float2half_rn(float f) { __half h; h.v = (_Float16)f; return h; }
"""

_LAUNCH = r"""
static int emu_launch(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned long smem,
                      const std::function<void()>& body) {
  gridDim = dim3{gx, gy, gz};
  blockDim = dim3{bx, 1, 1};
  std::vector<unsigned char> sm(smem + 64);
  for (unsigned z = 0; z < gz; ++z)
    for (unsigned y = 0; y < gy; ++y)
      for (unsigned x = 0; x < gx; ++x) {
        memset(sm.data(), 0xFF, sm.size());
        g_smem = (float*)sm.data();
        std::barrier<> bar(bx);
        g_block_barrier = &bar;
        std::vector<std::unique_ptr<Warp>> warps;
        for (unsigned w = 0; w < (bx + 31) / 32; ++w) warps.emplace_back(new Warp());
        g_warps = &warps;
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < bx; ++t)
          ts.emplace_back([&, t, x, y, z]() {
            threadIdx = dim3{t, 0, 0};
            blockIdx = dim3{x, y, z};
            body();
          });
        for (auto& th : ts) th.join();
      }
  return 0;
}
"""

_KERNEL = re.compile(
    r"template <typename T>\s*__global__ void __launch_bounds__\(\d+\) (\w+)\((.*?)\)\s*\{", re.S
)
_ELEMENT = {"float": np.float32, "__half": np.float16}
_SCALAR = {"int": (np.int32, ctypes.c_int32), "long long": (np.int64, ctypes.c_int64),
           "float": (np.float32, ctypes.c_float)}  # fmt: skip
_POINTEE = {"int": np.int32, "long long": np.int64, "float": np.float32, "__half": np.float16,
            "unsigned char": np.uint8}  # fmt: skip

_libraries: dict[str, tuple[Any, dict]] = {}


def available() -> str | None:
    """Why kernels cannot be emulated here, or None when they can."""
    if shutil.which("g++") is None:
        return "g++ is not installed"
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "probe.cpp")
        with open(src, "w") as f:
            f.write("#include <barrier>\nint main() { std::barrier<> b(1); _Float16 h = 1; "
                    "b.arrive_and_wait(); return (int)h - 1; }\n")  # fmt: skip
        res = subprocess.run(["g++", "-std=c++20", "-pthread", "-o", os.path.join(d, "p"), src],
                             capture_output=True, text=True)  # fmt: skip
    return None if res.returncode == 0 else "g++ lacks C++20 <barrier> or _Float16"


def _signatures(source: str) -> dict[str, list[tuple[str, str]]]:
    sigs = {}
    for m in _KERNEL.finditer(source):
        params = []
        for p in m.group(2).split(","):
            typ, name = " ".join(p.replace("__restrict__", "").split()).rsplit(" ", 1)
            params.append((typ.replace(" *", "*"), name))
        sigs[m.group(1)] = params
    return sigs


def _library(source: str):
    key = hashlib.sha1(source.encode()).hexdigest()[:16]
    if key in _libraries:
        return _libraries[key]
    sigs = _signatures(source)
    body = source.replace("#include <cuda_fp16.h>", "").replace(
        "extern __shared__ float smem[];", "float* smem = g_smem;"
    )
    wrappers = []
    for name, params in sigs.items():
        for ct in _ELEMENT:
            types = [re.sub(r"\bT\b", ct, t) for t, _ in params]
            call = ", ".join(f"*({t}*)a[{i}]" for i, t in enumerate(types))
            wrappers.append(
                f'extern "C" int L_{name}_{ct}(unsigned gx, unsigned gy, unsigned gz, unsigned bx,'
                f" unsigned long smem, void** a) {{ return emu_launch(gx, gy, gz, bx, smem, "
                f"[=]() {{ {name}<{ct}>({call}); }}); }}"
            )
    structs = (
        {
            t.replace("const", "").replace("*", "").strip()
            for params in sigs.values()
            for t, _ in params
            if t.endswith("*")
        }
        - set(_POINTEE)
        - {"T"}
    )
    wrappers += [f'extern "C" unsigned long SZ_{t}() {{ return sizeof({t}); }}' for t in structs]
    flags = ["-std=c++20", "-O1", "-ffp-contract=off", "-pthread"]
    so = build_shared(_PRELUDE + body + _LAUNCH + "\n".join(wrappers), flags, "cuda-emulation")
    _libraries[key] = (ctypes.CDLL(str(so)), sigs)
    return _libraries[key]


class EmulatedKernel:
    """One template instantiation, ``k(grid, block, args, shared_mem=)``."""

    def __init__(self, lib: Any, name: str, ctype: str, params: list[tuple[str, str]]):
        self.name = f"{name}<{ctype}>"
        self._fn = getattr(lib, f"L_{name}_{ctype}")
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.c_uint] * 4 + [ctypes.c_ulong, ctypes.c_void_p]
        self.params = [(re.sub(r"\bT\b", ctype, t), n) for t, n in params]
        self.launches = 0
        self._sizeof = {}
        for t, _ in self.params:
            pointee = t.replace("const", "").replace("*", "").strip()
            if t.endswith("*") and pointee not in _POINTEE:
                fn = getattr(lib, f"SZ_{pointee}")
                fn.restype = ctypes.c_ulong
                self._sizeof[pointee] = fn()

    def __call__(self, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0) -> None:
        if len(args) != len(self.params):
            raise TypeError(f"{self.name}: {len(args)} arguments for {len(self.params)} parameters")
        store = []
        for i, (a, (typ, pname)) in enumerate(zip(args, self.params, strict=True)):
            where = f"{self.name} argument {i} ({typ} {pname})"
            if typ.endswith("*"):
                pointee = typ.replace("const", "").replace("*", "").strip()
                if a is None:
                    store.append(ctypes.c_void_p(0))
                    continue
                if not isinstance(a, np.ndarray):
                    raise TypeError(f"{where}: got {type(a).__name__}")
                if pointee in self._sizeof:  # a parameter struct, as bytes
                    if a.dtype != np.uint8 or a.nbytes != self._sizeof[pointee]:
                        raise TypeError(
                            f"{where}: got {a.nbytes} bytes of {a.dtype}, the struct has "
                            f"{self._sizeof[pointee]}"
                        )
                elif a.dtype != _POINTEE[pointee] or not a.flags.c_contiguous:
                    raise TypeError(
                        f"{where}: got a {a.dtype} array, contiguous={a.flags.c_contiguous}"
                    )
                store.append(ctypes.c_void_p(a.ctypes.data if a.size else 0))
            else:
                want, ctype_ = _SCALAR[typ]
                if type(a) is not want:
                    raise TypeError(f"{where}: got {type(a).__name__}, want numpy {want.__name__}")
                store.append(ctype_(a.item()))
        if not (isinstance(grid, tuple) and isinstance(block, tuple) and len(block) == 1):
            raise TypeError(f"{self.name}: grid {grid!r} and block {block!r} must be tuples")
        g = (*grid, 1, 1)[:3]
        if not (1 <= block[0] <= 1024 and min(g) >= 1 and g[1] <= 65535 and g[2] <= 65535):
            raise ValueError(f"{self.name}: launch grid {g} block {block} out of range")
        if shared_mem > 48 * 1024:
            raise ValueError(f"{self.name}: {shared_mem} bytes of shared memory (48 KiB max)")
        ptrs = (ctypes.c_void_p * len(store))(*[ctypes.addressof(v) for v in store])
        self.launches += 1
        self._fn(g[0], g[1], g[2], block[0], shared_mem, ptrs)


class Emulator:
    """``function(source, name, name_expressions)`` compatible with ``nvrtc.function``."""

    def __init__(self) -> None:
        self._kernels: dict[tuple, EmulatedKernel] = {}

    def function(self, source: str, name: str, name_expressions=(), options=()) -> EmulatedKernel:
        lib, sigs = _library(source)
        base, ctype = re.fullmatch(r"(\w+)<(\w+)>", name).groups()
        key = (id(lib), base, ctype)
        if key not in self._kernels:
            self._kernels[key] = EmulatedKernel(lib, base, ctype, sigs[base])
        return self._kernels[key]

    def launches(self) -> dict[str, int]:
        """Launches so far of every kernel fetched, by ``name<type>``."""
        return {k.name: k.launches for k in self._kernels.values()}


def nan_empty(shape, dtype=np.float32) -> np.ndarray:
    """``np.empty`` that fills floats with NaN, so an element a kernel never writes shows."""
    a = np.empty(shape, dtype=dtype)
    if a.dtype.kind == "f":
        a.fill(np.nan)
    return a


def emulated_xp() -> types.SimpleNamespace:
    """NumPy as a CUDA kernel builder's ``xp``, with ``empty``/``empty_like`` filling floats
    with NaN (:func:`nan_empty`)."""
    xp = types.SimpleNamespace(**{k: getattr(np, k) for k in dir(np) if not k.startswith("_")})
    xp.empty = nan_empty
    xp.empty_like = lambda a: nan_empty(a.shape, a.dtype)
    return xp
