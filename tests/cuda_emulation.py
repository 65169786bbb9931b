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

Limits: templates must be ``template <typename T, ...> __global__ void
__launch_bounds__(N) name(...)``; a kernel templated on ``T`` alone is built for
``float``/``__half``, one with more template arguments (or ``T = bf16_t``) for
the instantiations asked for; shuffles must be warp-uniform and blocks a
multiple of 32 threads; races between blocks cannot show. Compiled with
``-ffp-contract=off``, as NVRTC is asked to keep the ``__f*_rn`` products
separate (the build and its cache: ``gxx_build``).

Warp-level matrix instructions (the source's ``#ifndef ONNXEP_EMULATOR``
block holds their PTX; the prelude defines ``ONNXEP_EMULATOR`` and these):

* ``mma16816<T>(d, a, b0, b1)``: ``mma.sync.aligned.m16n8k16.row.col.f32``
  with fp16/bf16 operands. The 32 lanes' fragments meet in a per-warp buffer
  behind the warp barrier and each lane computes its own four outputs from
  the fragment layouts of the PTX ISA (groupID ``g = lane / 4``, ``t = lane %
  4``: A register ``r`` holds row ``g + 8 (r & 1)``, columns ``2t + 8 (r >> 1)``
  and ``+1``; B register ``r`` rows ``2t + 8r``, ``+1`` of column ``g``; C ``i``
  row ``g + 8 (i >> 1)``, column ``2t + (i & 1)``; the lower index in the low
  half), so a fragment built in the wrong layout gives a wrong product;
* ``ldsm_x4`` / ``ldsm_x4_t``: ``ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16``
  (lanes ``8i..8i+7`` address matrix ``i``'s rows; register ``i`` of lane ``l``
  gets row ``l / 4``, elements ``2 (l % 4)``, ``+1``, or the transpose); each
  address must be 16-byte aligned and inside the dynamic shared memory;
* ``cp_async16`` / ``cp_async_commit`` / ``cp_async_wait_all``: the copy is
  queued and only lands at the wait, so shared memory read before the wait
  (or before the barrier that publishes other threads' copies) still holds
  the NaN fill; sources must lie inside an argument array, destinations in
  shared memory, both 16-byte aligned, and nothing may be pending when a
  thread exits.

A source may also keep its device-only primitives in one named block that
the emulator swaps for host versions: ``decode_tc_cuda.TC_PRIMITIVES``
(``tc_mma``: the same m16n8k16 product from every lane's fragments, placed as
the PTX ISA lays them out; ``tc_load``: a 16-byte load that fails the launch at
a misaligned address).

A kernel's dynamic shared memory may pass 48 KiB once the kernel's
``max_dynamic_shared_size_bytes`` is raised, as CuPy's attribute does (up to
the 227 KiB an H200 block may opt in to). A misuse is reported as a
``RuntimeError`` naming it.

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

import ml_dtypes
import numpy as np
from gxx_build import build_shared

_PRELUDE = r"""
#define ONNXEP_EMULATOR 1
#include <math.h>
#include <string.h>
#include <stdint.h>
#include <atomic>
#include <barrier>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
struct dim3 { unsigned x = 1, y = 1, z = 1; };
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
float* g_smem = nullptr;
size_t g_smem_bytes = 0;
std::barrier<>* g_block_barrier = nullptr;
struct Warp {
  std::barrier<> bar{32};
  float vals[32];
  unsigned words[32][6];  // mma fragments
  const void* ptrs[32];   // ldmatrix row addresses
  unsigned ta[32][4], tb[32][2];  // tc_mma fragments (_HOST_TC)
};
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
inline unsigned short __half_as_ushort(__half h) { unsigned short u; memcpy(&u, &h, 2); return u; }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }

// -- misuse reports (the first one wins; the launch then fails with it) --
std::mutex g_error_lock;
std::string g_error;
inline void emu_fail(const std::string& what) {
  std::lock_guard<std::mutex> hold(g_error_lock);
  if (g_error.empty()) g_error = what;
}
extern "C" const char* emu_error() { return g_error.c_str(); }
// The argument arrays' byte ranges, so asynchronous copies can be checked against them.
std::vector<std::pair<uintptr_t, uintptr_t>> g_ranges;
extern "C" void emu_set_ranges(int n, const unsigned long long* lo, const unsigned long long* hi) {
  g_ranges.clear();
  for (int i = 0; i < n; ++i) g_ranges.emplace_back((uintptr_t)lo[i], (uintptr_t)hi[i]);
}
inline bool emu_in_args(const void* p, size_t n) {
  const uintptr_t a = (uintptr_t)p;
  for (const auto& r : g_ranges)
    if (a >= r.first && a + n <= r.second) return true;
  return false;
}
inline bool emu_in_smem(const void* p, size_t n) {
  const uintptr_t a = (uintptr_t)p, s = (uintptr_t)g_smem;
  return a >= s && a + n <= s + g_smem_bytes;
}
inline Warp& emu_warp() { return *(*g_warps)[threadIdx.x / 32]; }

// -- cp.async: queued per thread, landing only at the wait --
struct EmuCopy { void* dst; const void* src; bool valid; };
thread_local std::vector<EmuCopy> t_copies;
inline void cp_async16(void* dst, const void* src, bool valid) {
  if (!emu_in_smem(dst, 16) || ((uintptr_t)dst & 15))
    emu_fail("cp.async: destination outside the dynamic shared memory or not 16-byte aligned");
  else if (valid && (!emu_in_args(src, 16) || ((uintptr_t)src & 15)))
    emu_fail("cp.async: source outside every argument array or not 16-byte aligned");
  else
    t_copies.push_back({dst, src, valid});
}
inline void cp_async_commit() {}
inline void cp_async_wait_all() {
  for (const EmuCopy& c : t_copies) {
    if (c.valid) memcpy(c.dst, c.src, 16); else memset(c.dst, 0, 16);
  }
  t_copies.clear();
}

// -- ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16 --
inline void emu_ldsm(unsigned (&r)[4], const void* p, bool trans) {
  Warp& w = emu_warp();
  const int l = threadIdx.x % 32;
  if (!emu_in_smem(p, 16) || ((uintptr_t)p & 15)) {
    emu_fail("ldmatrix: a row address outside the dynamic shared memory or not 16-byte aligned");
    p = g_smem;
  }
  w.ptrs[l] = p;
  w.bar.arrive_and_wait();
  for (int m = 0; m < 4; ++m) {
    unsigned short e[2];
    for (int h = 0; h < 2; ++h) {
      const int row = trans ? 2 * (l % 4) + h : l / 4, col = trans ? l / 4 : 2 * (l % 4) + h;
      memcpy(&e[h], (const char*)w.ptrs[8 * m + row] + 2 * col, 2);
    }
    r[m] = (unsigned)e[0] | ((unsigned)e[1] << 16);
  }
  w.bar.arrive_and_wait();
}
inline void ldsm_x4(unsigned (&r)[4], const void* p) { emu_ldsm(r, p, false); }
inline void ldsm_x4_t(unsigned (&r)[4], const void* p) { emu_ldsm(r, p, true); }

// -- mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32, d += a * b --
template <typename T> inline float emu_elem(unsigned word, int high) {
  const unsigned short bits = high ? (unsigned short)(word >> 16) : (unsigned short)word;
  T e;
  memcpy(&e, &bits, 2);
  return to_f(e);  // found at instantiation: the source defines to_f for its types
}
template <typename T>
inline void mma16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  Warp& w = emu_warp();
  const int l = threadIdx.x % 32, g = l / 4, t = l % 4;
  for (int i = 0; i < 4; ++i) w.words[l][i] = a[i];
  w.words[l][4] = b0;
  w.words[l][5] = b1;
  w.bar.arrive_and_wait();
  float out[4];
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
    float acc = 0.f;
    for (int kk = 0; kk < 16; ++kk) {
      // A[row][kk]: lane 4 (row % 8) + (kk % 8) / 2, register (row >= 8) + 2 (kk >= 8)
      const float x = emu_elem<T>(w.words[4 * (row % 8) + (kk % 8) / 2][(row / 8) + 2 * (kk / 8)],
                                  kk & 1);
      // B[kk][col]: lane 4 col + (kk % 8) / 2, register kk >= 8
      const float y = emu_elem<T>(w.words[4 * col + (kk % 8) / 2][4 + kk / 8], kk & 1);
      acc += x * y;
    }
    out[i] = d[i] + acc;
  }
  w.bar.arrive_and_wait();
  for (int i = 0; i < 4; ++i) d[i] = out[i];
}
struct uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
struct alignas(16) float4 { float x, y, z, w; };
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
"""

#: Host versions of the tensor-core primitives (``decode_tc_cuda.TC_PRIMITIVES``): the
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
  if (reinterpret_cast<uintptr_t>(p) % 16) emu_fail("a 16-byte load at a misaligned address");
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
// One launch at a time: no kernel after it to let start early.
inline void tc_pdl_trigger() {}
inline void tc_pdl_wait() {}
"""

_LAUNCH = r"""
static int emu_launch(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned long smem,
                      const std::function<void()>& body) {
  gridDim = dim3{gx, gy, gz};
  blockDim = dim3{bx, 1, 1};
  g_error.clear();
  std::vector<unsigned char> sm(smem + 64);
  g_smem_bytes = smem;
  for (unsigned z = 0; z < gz && g_error.empty(); ++z)
    for (unsigned y = 0; y < gy && g_error.empty(); ++y)
      for (unsigned x = 0; x < gx && g_error.empty(); ++x) {
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
            if (!t_copies.empty()) emu_fail("cp.async copies still pending when a thread exits");
            t_copies.clear();
          });
        for (auto& th : ts) th.join();
      }
  return g_error.empty() ? 0 : 1;
}
"""

_KERNEL = re.compile(
    r"template <typename T((?:, int \w+)*)>\s*__global__ void __launch_bounds__\(\d+\) (\w+)"
    r"\((.*?)\)\s*\{",
    re.S,
)
_ELEMENT = {"float": np.float32, "__half": np.float16}
_SCALAR = {"int": (np.int32, ctypes.c_int32), "long long": (np.int64, ctypes.c_int64),
           "float": (np.float32, ctypes.c_float)}  # fmt: skip
#: Pointer element types and the array dtypes each accepts (bf16_t: ml_dtypes' bfloat16, or
#: its bits as uint16, as the GPU tests hand CuPy arrays).
_POINTEE = {"int": (np.int32,), "long long": (np.int64,), "float": (np.float32,),
            "__half": (np.float16,), "unsigned char": (np.uint8,), "unsigned": (np.uint32,),
            "bf16_t": (np.dtype(ml_dtypes.bfloat16), np.uint16)}  # fmt: skip
#: Dynamic shared memory a kernel may opt in to (an H200 block's limit).
OPT_IN_LIMIT = 227 * 1024

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
    """Per kernel: whether it is templated on ``T`` alone, and its parameters."""
    sigs = {}
    for m in _KERNEL.finditer(source):
        params = []
        for p in m.group(3).split(","):
            typ, name = " ".join(p.replace("__restrict__", "").split()).rsplit(" ", 1)
            params.append((typ.replace(" *", "*"), name))
        sigs[m.group(2)] = (not m.group(1), params)
    return sigs


def _symbol(instance: str) -> str:
    return "L_" + re.sub(r"\W", "_", instance)


def _split(instance: str) -> tuple[str, str]:
    """``name<T, ...>`` -> (name, T)."""
    base, args = re.fullmatch(r"(\w+)<(.+)>", instance).groups()
    return base, args.split(",")[0].strip()


def _host_blocks() -> dict[str, str]:
    """Device-only blocks of kernel sources -> their host versions."""
    from onnxep.providers_cuda.ops import decode_tc_cuda

    return {decode_tc_cuda.TC_PRIMITIVES: _HOST_TC}


def _library(source: str, extra: tuple[str, ...] = ()):
    """The built source: every ``T``-only kernel for float and __half, plus ``extra``."""
    key = hashlib.sha1((source + "\0".join(extra)).encode()).hexdigest()[:16]
    if key in _libraries:
        return _libraries[key]
    sigs = _signatures(source)
    body = source.replace("#include <cuda_fp16.h>", "").replace(
        "extern __shared__ float smem[];", "float* smem = g_smem;"
    )
    for device, host in _host_blocks().items():
        body = body.replace(device, host)
    instances = [f"{n}<{ct}>" for n, (plain, _) in sigs.items() if plain for ct in _ELEMENT]
    instances += [e for e in extra if e not in instances]
    wrappers = []
    for inst in instances:
        name, ct = _split(inst)
        types = [re.sub(r"\bT\b", ct, t) for t, _ in sigs[name][1]]
        call = ", ".join(f"*({t}*)a[{i}]" for i, t in enumerate(types))
        wrappers.append(
            f'extern "C" int {_symbol(inst)}(unsigned gx, unsigned gy, unsigned gz, unsigned bx,'
            f" unsigned long smem, void** a) {{ return emu_launch(gx, gy, gz, bx, smem, "
            f"[=]() {{ {inst}({call}); }}); }}"
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
    lib.emu_error.restype = ctypes.c_char_p
    lib.emu_set_ranges.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    _libraries[key] = (lib, sigs)
    return _libraries[key]


class EmulatedKernel:
    """One template instantiation, ``k(grid, block, args, shared_mem=)``."""

    def __init__(self, lib: Any, instance: str, params: list[tuple[str, str]]):
        self.name = instance
        ctype = _split(instance)[1]
        self._lib = lib
        self._fn = getattr(lib, _symbol(instance))
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.c_uint] * 4 + [ctypes.c_ulong, ctypes.c_void_p]
        self.params = [(re.sub(r"\bT\b", ctype, t), n) for t, n in params]
        self.launches = 0
        #: as CuPy's RawKernel attribute: raise it to launch with more than 48 KiB
        self.max_dynamic_shared_size_bytes = 0
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
        store, ranges = [], []
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
                elif a.dtype not in _POINTEE[pointee] or not a.flags.c_contiguous:
                    raise TypeError(
                        f"{where}: got a {a.dtype} array, contiguous={a.flags.c_contiguous}"
                    )
                store.append(ctypes.c_void_p(a.ctypes.data if a.size else 0))
                if a.size:
                    ranges.append((a.ctypes.data, a.ctypes.data + a.nbytes))
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
        limit = max(48 * 1024, self.max_dynamic_shared_size_bytes)
        if shared_mem > limit or limit > OPT_IN_LIMIT:
            raise ValueError(
                f"{self.name}: {shared_mem} bytes of shared memory (limit {limit}: 48 KiB, or "
                f"what max_dynamic_shared_size_bytes opts in to, at most {OPT_IN_LIMIT})"
            )
        ptrs = (ctypes.c_void_p * len(store))(*[ctypes.addressof(v) for v in store])
        lo = (ctypes.c_ulonglong * max(1, len(ranges)))(*[r[0] for r in ranges])
        hi = (ctypes.c_ulonglong * max(1, len(ranges)))(*[r[1] for r in ranges])
        self.launches += 1
        self._lib.emu_set_ranges(len(ranges), lo, hi)
        if self._fn(g[0], g[1], g[2], block[0], shared_mem, ptrs):
            why = self._lib.emu_error().decode()
            raise RuntimeError(f"{self.name} <<<{g}, {block[0]}>>>: {why}")


class Emulator:
    """``function(source, name, name_expressions)`` compatible with ``nvrtc.function``."""

    def __init__(self) -> None:
        self._kernels: dict[tuple, EmulatedKernel] = {}

    def function(self, source: str, name: str, name_expressions=(), options=()) -> EmulatedKernel:
        base, ctype = _split(name)
        plain = _signatures(source)[base][0] and ctype in _ELEMENT
        lib, sigs = _library(source, () if plain else (name,))
        key = (id(lib), name)
        if key not in self._kernels:
            self._kernels[key] = EmulatedKernel(lib, name, sigs[base][1])
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
