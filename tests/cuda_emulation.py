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

Limits: kernels are templates ``template <typename T, ...> __global__ void
__launch_bounds__(...) name(...)``, instantiated for ``float``/``__half`` when
``T`` is the only parameter, else as the ``name_expressions`` list them;
shuffles and the tensor-core product (``tc_mma``, emulated with the PTX ISA's
m16n8k16 fragment layout) must be warp-uniform and blocks a multiple of 32
threads; races between blocks cannot show. A 16-byte load at a misaligned
address fails the launch. Compiled with ``-ffp-contract=off``, as NVRTC is asked to keep
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
struct Warp { std::barrier<> bar{32}; float vals[32]; unsigned ta[32][4], tb[32][2]; };
std::atomic<const char*> g_fault{nullptr};
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
struct uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
"""

#: Host versions of the tensor-core primitives (``_decode_tc_cuda.TC_PRIMITIVES``): the
#: product is computed from every lane's fragments, placed as the PTX ISA lays out
#: mma.m16n8k16 (A element (r, k): lane 4 * (r % 8) + (k % 8) / 2, word (r >= 8) + 2 * (k >= 8);
#: B element (k, n): lane 4 * n + (k % 8) / 2, word k >= 8; the half is k % 2; C element
#: (r, n): lane 4 * (r % 8) + n / 2, float 2 * (r >= 8) + n % 2), summed in k order.
_HOST_TC = r"""
inline float tc_half(unsigned w, int hi) {
  const uint16_t bits = hi ? (uint16_t)(w >> 16) : (uint16_t)(w & 0xffffu);
  _Float16 h;
  memcpy(&h, &bits, 2);
  return (float)h;
}
inline void tc_mma(float* d, const unsigned* a, const unsigned* b) {
  Warp& w = *(*g_warps)[threadIdx.x / 32];
  const int l = threadIdx.x % 32, g = l >> 2, t = l & 3;
  for (int i = 0; i < 4; ++i) w.ta[l][i] = a[i];
  for (int i = 0; i < 2; ++i) w.tb[l][i] = b[i];
  w.bar.arrive_and_wait();
  for (int i = 0; i < 4; ++i) {
    const int r = g + 8 * (i >> 1), n = 2 * t + (i & 1);
    float acc = 0.f;
    for (int k = 0; k < 16; ++k) {
      const float x = tc_half(w.ta[(r % 8) * 4 + (k % 8) / 2][(r >= 8) + 2 * (k >= 8)], k & 1);
      const float y = tc_half(w.tb[n * 4 + (k % 8) / 2][k >= 8], k & 1);
      acc += x * y;
    }
    d[i] += acc;
  }
  w.bar.arrive_and_wait();
}
inline void tc_mma_top(float* d, unsigned a0, unsigned a2, const unsigned* b) {
  const unsigned a[4] = {a0, 0u, a2, 0u};
  float full[4] = {d[0], d[1], 0.f, 0.f};
  tc_mma(full, a, b);
  d[0] = full[0];
  d[1] = full[1];
}
inline unsigned tc_pack(float lo, float hi) {
  const _Float16 l = (_Float16)lo, h = (_Float16)hi;
  uint16_t bl, bh;
  memcpy(&bl, &l, 2);
  memcpy(&bh, &h, 2);
  return (unsigned)bl | ((unsigned)bh << 16);
}
inline uint4 tc_load(const void* p) {
  if (reinterpret_cast<uintptr_t>(p) % 16) g_fault = "a 16-byte load at a misaligned address";
  uint4 u;
  memcpy(&u, p, 16);
  return u;
}
inline unsigned tc_perm(unsigned x, unsigned y, unsigned s) {
  const unsigned long long v = ((unsigned long long)y << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xffu) << (8 * i);
  return r;
}
inline void tc_order() {}
"""

_LAUNCH = r"""
static int emu_launch(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned long smem,
                      const std::function<void()>& body) {
  g_fault = nullptr;
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
  return g_fault ? 1 : 0;
}
extern "C" const char* emu_fault() { return g_fault ? g_fault.load() : ""; }
"""

_KERNEL = re.compile(
    r"template <([^>]*)>\s*__global__ void __launch_bounds__\([^)]*\) (\w+)\((.*?)\)\s*\{", re.S
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


def _signatures(source: str) -> dict[str, tuple[bool, list[tuple[str, str]]]]:
    """Each kernel's name -> (whether ``T`` is its only template parameter, its parameters)."""
    sigs = {}
    for m in _KERNEL.finditer(source):
        params = []
        for p in m.group(3).split(","):
            typ, name = " ".join(p.replace("__restrict__", "").split()).rsplit(" ", 1)
            params.append((typ.replace(" *", "*"), name))
        sigs[m.group(2)] = (m.group(1).strip() == "typename T", params)
    return sigs


def _instantiations(sigs: dict, name_expressions) -> dict[str, tuple[str, str, list]]:
    """``name<args>`` -> (kernel, its element type, parameters with T replaced)."""
    out = {}
    listed = {}
    for e in name_expressions:
        base, args = re.fullmatch(r"(\w+)<(.*)>", e).groups()
        listed.setdefault(base, []).append(args)
    for name, (plain, params) in sigs.items():
        for args in [*_ELEMENT] if plain else listed.get(name, []):
            ct = args.split(",")[0].strip()
            typed = [(re.sub(r"\bT\b", ct, t), n) for t, n in params]
            out[f"{name}<{args}>"] = (name, ct, typed)
    return out


def _wrapper_name(inst: str) -> str:
    return "L_" + re.sub(r"\W+", "_", inst).strip("_")


def _host_blocks() -> dict[str, str]:
    """Device-only blocks of kernel sources -> their host versions."""
    from onnxep.providers_cuda.ops import _decode_tc_cuda

    return {_decode_tc_cuda.TC_PRIMITIVES: _HOST_TC}


def _library(source: str, name_expressions=()):
    key = hashlib.sha1((source + "\0".join(name_expressions)).encode()).hexdigest()[:16]
    if key in _libraries:
        return _libraries[key]
    sigs = _signatures(source)
    body = source.replace("#include <cuda_fp16.h>", "").replace(
        "extern __shared__ float smem[];", "float* smem = g_smem;"
    )
    for device, host in _host_blocks().items():
        body = body.replace(device, host)
    insts = _instantiations(sigs, name_expressions)
    wrappers = []
    for inst, (_, _, typed) in insts.items():
        call = ", ".join(f"*({t}*)a[{i}]" for i, (t, _) in enumerate(typed))
        wrappers.append(
            f'extern "C" int {_wrapper_name(inst)}(unsigned gx, unsigned gy, unsigned gz, '
            f"unsigned bx, unsigned long smem, void** a) {{ return emu_launch(gx, gy, gz, bx, "
            f"smem, [=]() {{ {inst}({call}); }}); }}"
        )
    structs = (
        {
            t.replace("const", "").replace("*", "").strip()
            for _, params in sigs.values()
            for t, _ in params
            if t.endswith("*")
        }
        - set(_POINTEE)
        - {"T"}
    )
    wrappers += [f'extern "C" unsigned long SZ_{t}() {{ return sizeof({t}); }}' for t in structs]
    flags = ["-std=c++20", "-O1", "-ffp-contract=off", "-pthread"]
    so = build_shared(_PRELUDE + body + _LAUNCH + "\n".join(wrappers), flags, "cuda-emulation")
    lib = ctypes.CDLL(str(so))
    lib.emu_fault.restype = ctypes.c_char_p
    _libraries[key] = (lib, insts)
    return _libraries[key]


class EmulatedKernel:
    """One template instantiation, ``k(grid, block, args, shared_mem=)``."""

    def __init__(self, lib: Any, inst: str, params: list[tuple[str, str]]):
        self.name = inst
        self._lib = lib
        self._fn = getattr(lib, _wrapper_name(inst))
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.c_uint] * 4 + [ctypes.c_ulong, ctypes.c_void_p]
        self.params = params
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
        if self._fn(g[0], g[1], g[2], block[0], shared_mem, ptrs):
            raise RuntimeError(f"{self.name}: {self._lib.emu_fault().decode()}")


class Emulator:
    """``function(source, name, name_expressions)`` compatible with ``nvrtc.function``."""

    def __init__(self) -> None:
        self._kernels: dict[tuple, EmulatedKernel] = {}

    def function(self, source: str, name: str, name_expressions=(), options=()) -> EmulatedKernel:
        lib, insts = _library(source, tuple(name_expressions))
        inst = re.sub(r"\s*,\s*", ", ", name)
        key = (id(lib), inst)
        if key not in self._kernels:
            if inst not in insts:
                raise KeyError(f"{name} is not an instantiation of this source: {sorted(insts)}")
            self._kernels[key] = EmulatedKernel(lib, inst, insts[inst][2])
        return self._kernels[key]

    def launches(self) -> dict[str, int]:
        """Launches so far of every kernel fetched, by ``name<type>``."""
        out: dict[str, int] = {}
        for k in self._kernels.values():  # one name may be in several sources' libraries
            out[k.name] = out.get(k.name, 0) + k.launches
        return out


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
