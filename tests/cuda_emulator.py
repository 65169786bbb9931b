"""Runs the CUDA C of providers_cuda's reduction, softmax and RMS-norm kernels on the CPU.

Machines without a GPU (this one, CI) cannot launch a kernel, but the
kernels' index arithmetic, splits, barriers and shuffles are where bugs
live. This emulator compiles a kernel body with g++ against host versions of
the few CUDA built-ins it uses and runs every launch block by block, each
CUDA thread a fiber (ucontext) on one OS thread:

* ``__syncthreads()`` parks a fiber until every thread of the block is
  parked there; a warp shuffle parks it until all 32 lanes of its warp are
  (a lane that has exited, or that waits at the block barrier instead, is
  reported as the bug it would be on a GPU);
* ``__shared__`` arrays are function statics (one block runs at a time);
* 16-byte vector loads and stores check their alignment;
* every array argument is copied into a buffer with 256 guard bytes of
  0xFF on both sides (a NaN in float32 and float16): a write out of bounds
  is reported, a read out of bounds poisons the result with NaN;
* argument types are checked against the kernel's parameters, as CuPy would
  silently pass the wrong width.

Fibers run in thread order or, with ``reverse=True``, in reverse, so a
missing barrier shows up in one of the two orders. Float arithmetic is IEEE
single precision without contraction (``-ffp-contract=off``), half floats
convert through ``_Float16`` with round-to-nearest-even, as on the GPU.

Why this is not ``cuda_emulation`` (one OS thread per CUDA thread, used by
the attention kernels): fibers make the thread order a choice (``reverse``),
so a missing barrier shows deterministically, and a lane stuck at the wrong
barrier is reported instead of hanging; the kernels here are built through
``compile_kernels(body, names)`` with 1-D grids. The attention kernels need
what only ``cuda_emulation`` has (see its docstring). The g++ build and its
cache are shared: ``gxx_build``.

:func:`install` points ``providers_cuda.ops.reduce_cuda`` at the emulator
(its ``compile_kernels`` and ``sm_count``), and :func:`make_plugin` offers a
provider, ``cudaemu``, whose kernels are the CUDA provider's kernel library
on NumPy arrays, declining what the CUDA provider declines.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib
import os
import shutil
import sys
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from gxx_build import build_shared

NAME = "cudaemu"
#: SM count the emulated device reports: small, so modest shapes reach the split paths.
EMULATED_SMS = 4
GUARD = 256

RUNTIME = r"""
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include <math.h>
#include <ucontext.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static

struct dim3 { unsigned x, y, z; };
static dim3 threadIdx = {0, 0, 0}, blockIdx = {0, 0, 0}, blockDim = {1, 1, 1}, gridDim = {1, 1, 1};
struct uint4 { unsigned int x, y, z, w; };
struct __half { uint16_t bits; };

static inline float __half2float(__half h) { _Float16 f; memcpy(&f, &h.bits, 2); return (float)f; }
static inline __half __float2half_rn(float v) {
  _Float16 f = (_Float16)v; __half h; memcpy(&h.bits, &f, 2); return h;
}
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline float __fmul_rn(float a, float b) { return a * b; }

namespace emu {
enum State { RUNNABLE, AT_BLOCK, AT_WARP, DONE };
struct Fiber { ucontext_t ctx; State state; };
static const size_t kStack = 128 * 1024;
static ucontext_t scheduler;
static std::vector<Fiber> fibers;
static char* stacks = nullptr;
static int capacity = 0, nthreads = 0, current = 0;
static bool reverse_order = false;
static std::function<void()> kernel_call;
static float exchange[32][32];
static std::string error;

static void fail(const std::string& what) { if (error.empty()) error = what; }

static void trampoline() {
  kernel_call();
  fibers[current].state = DONE;
  swapcontext(&fibers[current].ctx, &scheduler);
}

static void park(State s) {
  fibers[current].state = s;
  swapcontext(&fibers[current].ctx, &scheduler);
}

static float shfl_xor(float v, int lane_mask) {
  const int lane = current & 31, warp = current >> 5, src = lane ^ (lane_mask & 31);
  exchange[warp][lane] = v;
  park(AT_WARP);
  if (warp * 32 + src >= nthreads) fail("a shuffle reads a lane past the end of the block");
  const float r = exchange[warp][src];
  park(AT_WARP);
  return r;
}

static void check_aligned(const void* p) {
  if (reinterpret_cast<uintptr_t>(p) % 16) fail("a 16-byte vector access at a misaligned address");
}

static void run_block() {
  for (int t = 0; t < nthreads; ++t) {
    Fiber& f = fibers[t];
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = stacks + (size_t)t * kStack;
    f.ctx.uc_stack.ss_size = kStack;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, trampoline, 0);
    f.state = RUNNABLE;
  }
  for (;;) {
    for (int k = 0; k < nthreads; ++k) {
      const int t = reverse_order ? nthreads - 1 - k : k;
      if (fibers[t].state != RUNNABLE) continue;
      current = t;
      threadIdx.x = t;
      swapcontext(&scheduler, &fibers[t].ctx);
    }
    bool released = false;
    for (int w = 0; w * 32 < nthreads; ++w) {
      const int lanes = std::min(32, nthreads - w * 32);
      int at_warp = 0, exited = 0;
      for (int l = 0; l < lanes; ++l) {
        at_warp += fibers[w * 32 + l].state == AT_WARP;
        exited += fibers[w * 32 + l].state == DONE;
      }
      if (at_warp == 0) continue;
      if (at_warp != lanes) {
        fail(exited ? "a warp shuffles while some of its lanes have exited"
                    : "some lanes of a warp wait at a shuffle, others at __syncthreads");
        return;
      }
      for (int l = 0; l < lanes; ++l) fibers[w * 32 + l].state = RUNNABLE;
      released = true;
    }
    if (released) continue;
    int done = 0;
    for (int t = 0; t < nthreads; ++t) done += fibers[t].state == DONE;
    if (done == nthreads) return;
    if (done > 0) {
      fail("__syncthreads waits for threads that have exited");
      return;
    }
    for (int t = 0; t < nthreads; ++t) fibers[t].state = RUNNABLE;
  }
}

template <class... P, size_t... I>
static void call_with(void (*k)(P...), void** a, std::index_sequence<I...>) {
  k(*reinterpret_cast<std::remove_cv_t<std::remove_reference_t<P>>*>(a[I])...);
}

template <class... P>
static int launch(void (*k)(P...), long long grid, int block, void** args, int reverse) {
  error.clear();
  if (block < 1 || block > 1024) { fail("block size outside 1..1024"); return 1; }
  if (grid < 1 || grid > 2147483647LL) { fail("grid size outside 1..2^31-1"); return 1; }
  if (block > capacity) {
    free(stacks);
    stacks = static_cast<char*>(malloc((size_t)block * kStack));
    fibers.resize(block);
    capacity = block;
  }
  nthreads = block;
  reverse_order = reverse != 0;
  blockDim = {(unsigned)block, 1, 1};
  gridDim = {(unsigned)grid, 1, 1};
  kernel_call = [k, args] { call_with(k, args, std::index_sequence_for<P...>{}); };
  for (long long b = 0; b < grid && error.empty(); ++b) {
    blockIdx = {(unsigned)b, 0, 0};
    run_block();
  }
  return error.empty() ? 0 : 1;
}

template <class T> constexpr char code() {
  return std::is_pointer<T>::value               ? 'p'
         : std::is_same<T, int>::value           ? 'i'
         : std::is_same<T, long long>::value     ? 'q'
         : std::is_same<T, float>::value         ? 'f'
         : std::is_same<T, double>::value        ? 'd'
                                                 : '?';
}

template <class... P> static const char* signature(void (*)(P...)) {
  static const std::string s{code<std::remove_cv_t<P>>()...};
  return s.c_str();
}
}  // namespace emu

extern "C" const char* emu_error() { return emu::error.c_str(); }
"""

#: Host stand-ins for ``reduce_source.PRIMITIVES`` (same names, same behaviour).
PRIMITIVES = r"""
typedef long long i64;
static inline float to_f(float x) { return x; }
static inline float to_f(__half x) { return __half2float(x); }
template <typename T> T from_f(float x);
template <> inline float from_f<float>(float x) { return x; }
template <> inline __half from_f<__half>(float x) { return __float2half_rn(x); }
static inline uint4 load16(const void* p) {
  emu::check_aligned(p); uint4 u; memcpy(&u, p, 16); return u;
}
static inline void store16(void* p, const uint4& v) { emu::check_aligned(p); memcpy(p, &v, 16); }
static inline float shfl_xor(float v, int lane_mask) { return emu::shfl_xor(v, lane_mask); }
static inline float pos_inf() { return __int_as_float(0x7f800000); }
static inline void __syncthreads() { emu::park(emu::AT_BLOCK); }
// One block runs at a time, its fibers on one OS thread: plain memory is already coherent.
static inline void __threadfence() {}
static inline int atomicAdd(int* p, int v) { const int old = *p; *p = old + v; return old; }
template <typename T> static inline T __ldcg(const T* p) { return *p; }
// One launch at a time: there is no earlier grid to overlap or to wait for.
static inline void pdl_trigger() {}
static inline void pdl_wait() {}
static inline void prefetch_l2(const void*) {}
"""


class EmulatorError(RuntimeError):
    """A kernel did something that is a bug on a GPU (the message says what)."""


def why_unavailable() -> str | None:
    if shutil.which("g++") is None:
        return "g++ is not installed here (the CUDA kernel emulator compiles with it)"
    if not hasattr(ctypes, "CDLL") or os.name != "posix":
        return "the CUDA kernel emulator needs a POSIX system (ucontext fibers)"
    return None


_lock = threading.Lock()
_libs: dict[str, ctypes.CDLL] = {}
#: body -> every instantiation of it, so one build serves all of a body's requests.
ALL_NAMES: dict[str, tuple[str, ...]] = {}


def _build(body: str, names: Sequence[str]) -> ctypes.CDLL:
    wrappers = "".join(
        f'extern "C" int emu_launch_{i}(long long g, int b, void** a, int r) '
        f"{{ return emu::launch(&{n}, g, b, a, r); }}\n"
        f'extern "C" const char* emu_sig_{i}() {{ return emu::signature(&{n}); }}\n'
        for i, n in enumerate(names)
    )
    source = RUNTIME + PRIMITIVES + body + "\n" + wrappers
    flags = ["-std=c++17", "-O1", "-ffp-contract=off", "-fno-strict-aliasing"]
    so = build_shared(source, flags, "cuda-emulator", EmulatorError)
    lib = ctypes.CDLL(str(so))
    lib.emu_error.restype = ctypes.c_char_p
    return lib


class EmulatedKernel:
    """One kernel, called as CuPy calls a RawKernel: ``k((grid,), (block,), args)``."""

    reverse = False  # fiber order of every launch (set by the tests)

    def __init__(self, lib: ctypes.CDLL, index: int, name: str) -> None:
        self.name = name
        self._lib = lib
        self._launch = getattr(lib, f"emu_launch_{index}")
        self._launch.argtypes = [ctypes.c_longlong, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        self._launch.restype = ctypes.c_int
        sig = getattr(lib, f"emu_sig_{index}")
        sig.restype = ctypes.c_char_p
        self.signature = sig().decode()
        self.launches = 0

    def __call__(self, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0) -> None:
        if len(grid) != 1 or len(block) != 1 or shared_mem:
            raise EmulatorError(f"{self.name}: only 1-D launches without dynamic shared memory")
        if len(args) != len(self.signature):
            raise EmulatorError(
                f"{self.name}: {len(args)} arguments for {len(self.signature)} parameters"
            )
        values: list[Any] = []
        buffers: dict[tuple[int, int], tuple[np.ndarray, int, np.ndarray]] = {}
        for k, (a, code) in enumerate(zip(args, self.signature, strict=True)):
            values.append(self._convert(k, a, code, buffers))
        argv = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        with _lock:  # the runtime's scheduler state is global
            rc = self._launch(int(grid[0]), int(block[0]), argv, int(self.reverse))
            message = self._lib.emu_error().decode() if rc else ""
        self.launches += 1
        for (_, nbytes), (buf, off, dst) in buffers.items():
            lo, hi = buf[off - GUARD : off], buf[off + nbytes : off + nbytes + GUARD]
            if (lo != 0xFF).any() or (hi != 0xFF).any():
                message = message or f"wrote out of bounds of a {nbytes}-byte argument"
            new, old = buf[off : off + nbytes], dst.reshape(-1).view(np.uint8)
            if (new != old).any():
                if not dst.flags.writeable:
                    message = message or f"wrote into a read-only {nbytes}-byte argument"
                else:
                    old[:] = new
        if message:
            raise EmulatorError(f"{self.name} <<<{grid[0]}, {block[0]}>>>: {message}")

    def _convert(self, k: int, a: Any, code: str, buffers: dict) -> Any:
        where = f"{self.name}: argument {k}"
        if code == "p":
            if a is None:
                return ctypes.c_void_p(None)
            if not isinstance(a, np.ndarray):
                raise EmulatorError(f"{where} is a pointer but got {type(a).__name__}")
            if not a.flags.c_contiguous:
                raise EmulatorError(f"{where} is a strided view: the kernel reads it as dense")
            addr, nbytes = a.ctypes.data, a.nbytes
            key = (addr, nbytes)
            if key not in buffers:
                # The copy keeps the original's address modulo 64, so alignment tests agree.
                buf = np.full(nbytes + 2 * GUARD + 64, 0xFF, np.uint8)
                off = GUARD + (addr - buf.ctypes.data - GUARD) % 64
                buf[off : off + nbytes] = a.reshape(-1).view(np.uint8)
                buffers[key] = (buf, off, a)
            buf, off, _ = buffers[key]
            return ctypes.c_void_p(buf.ctypes.data + off)
        want = {"i": np.int32, "q": np.int64, "f": np.float32, "d": np.float64}.get(code)
        if want is None or type(a) is not want:
            expected = want.__name__ if want else f"of C type code {code!r}"
            raise EmulatorError(
                f"{where} must be {expected} (the parameter's type), got {type(a).__name__}"
            )
        kinds = {"i": ctypes.c_int32, "q": ctypes.c_int64, "f": ctypes.c_float}
        return kinds.get(code, ctypes.c_double)(a)


def compile_kernels(body: str, names: Sequence[str]) -> dict[str, EmulatedKernel]:
    """Stand-in for ``reduce_cuda.compile_kernels``: every instantiation of ``body`` at once."""
    every = ALL_NAMES.get(body, tuple(names))
    missing = [n for n in names if n not in every]
    if missing:
        raise EmulatorError(f"instantiations not listed for this body: {missing}")
    key = hashlib.sha1((body + "\0".join(every)).encode()).hexdigest()
    with _lock:
        lib = _libs.get(key)
        if lib is None:
            lib = _libs[key] = _build(body, every)
    return {n: EmulatedKernel(lib, every.index(n), n) for n in names}


def install(monkeypatch: Any) -> None:
    """Route the kernels' compilation and device query to the emulator for one test."""
    from onnxep.providers_cuda.ops import (
        norm_cuda,
        op_softmax,
        reduce_cuda,
        reduce_source,
    )

    ALL_NAMES.setdefault(reduce_source.REDUCE_BODY, reduce_source.ALL_REDUCE_NAMES)
    ALL_NAMES.setdefault(norm_cuda.NORM_BODY, norm_cuda.NORM_NAMES)
    ALL_NAMES.setdefault(op_softmax.SOFTMAX_BODY, op_softmax.SOFTMAX_NAMES)
    monkeypatch.setattr(reduce_cuda, "compile_kernels", compile_kernels)
    monkeypatch.setattr(reduce_cuda, "sm_count", lambda: EMULATED_SMS)


# --------------------------------------------------------------------------- the provider


def make_plugin() -> Any:
    """A plugin offering the ``cudaemu`` provider: the CUDA provider's kernel library on NumPy
    arrays, declining what the CUDA provider declines. Register it with
    ``onnxep.register_provider`` and take it away with ``unregister_plugin`` afterwards, so
    sessions without a provider list elsewhere never pick it."""
    from onnxep.providers import Decline, Provider, ProviderInfo, hookimpl
    from onnxep.providers_cuda.library import cuda_library
    from onnxep.providers_cuda.provider import CUDAProvider

    class _Emulated(Provider):
        def __init__(self, options: Any) -> None:
            super().__init__(NAME, options, device=NAME, xp=np)

        def claim(self, node: Any) -> Any:
            why = CUDAProvider.decline_reason(node)
            return Decline(why) if why else super().claim(node)

    class _Plugin:
        @hookimpl
        def onnxep_provider_info(self) -> Any:
            return ProviderInfo(name=NAME, device=NAME)

        @hookimpl
        def onnxep_create_provider(self, options: Any) -> Any:
            return _Emulated(options)

        @hookimpl
        def onnxep_kernels(self, provider: Any) -> Any:
            return cuda_library() if provider.name == NAME else None

    return _Plugin()


@contextlib.contextmanager
def registered() -> Iterator[str]:
    """The ``cudaemu`` provider registered for the block (the test skips where g++ cannot
    build the kernels); yields its name."""
    import onnxep
    from onnxep.plugins.host import unregister_plugin

    why = why_unavailable()
    if why:
        pytest.skip(why)
    plugin = make_plugin()
    onnxep.register_provider(plugin, name="cuda-emulator")
    try:
        yield NAME
    finally:
        unregister_plugin(plugin)


@contextlib.contextmanager
def registered_for(
    name: str, ops: Collection[tuple[str, str]], rewrites: Callable[[], list] | None = None
) -> Iterator[str]:
    """Provider ``name``: the CUDA kernel library on NumPy arrays claiming only ``ops``
    ((domain, op type); the rest of the library needs CuPy), so a whole model runs with those
    kernels emulated and every other node on the CPU. ``rewrites()`` makes the extended-level
    passes it contributes. Yields its name."""
    import onnxep
    from onnxep.plugins.host import unregister_plugin
    from onnxep.providers import Decline, Provider, ProviderInfo, hookimpl
    from onnxep.providers_cuda.library import cuda_library

    class _Some(Provider):
        def __init__(self, options: Any) -> None:
            super().__init__(name, options, device=name, xp=np)

        def claim(self, node: Any) -> Any:
            if (node.domain.replace("ai.onnx", ""), node.op_type) not in ops:
                return Decline(f"{name} emulates only {len(ops)} ops")
            return super().claim(node)

    class _Plugin:
        @hookimpl
        def onnxep_provider_info(self) -> Any:
            return ProviderInfo(name=name, device=name)

        @hookimpl
        def onnxep_create_provider(self, options: Any) -> Any:
            return _Some(options)

        @hookimpl
        def onnxep_kernels(self, provider: Any) -> Any:
            return cuda_library() if provider.name == name else None

        @hookimpl
        def onnxep_graph_rewrites(self, provider: Any, level: str) -> Any:
            mine = level == "extended" and provider is not None and provider.name == name
            return rewrites() if mine and rewrites is not None else None

    plugin = _Plugin()
    onnxep.register_provider(plugin, name=f"{name}-plugin")
    try:
        yield name
    finally:
        unregister_plugin(plugin)


#: The GPU tests, whose cases and launch counters the emulated tests reuse.
CUDA_TESTS = Path(__file__).resolve().parent / "cuda"


def gpu_test_module(name: str) -> ModuleType:
    """Module ``name`` of ``tests/cuda`` (importable as its tests import each other)."""
    if str(CUDA_TESTS) not in sys.path:
        sys.path.insert(0, str(CUDA_TESTS))
    return importlib.import_module(name)


# -- fixtures the emulated-kernel test modules share (``from cuda_emulator import ...``) ----


@pytest.fixture(scope="module")
def provider() -> Iterator[str]:
    """The emulating provider, registered for the module's sessions."""
    with registered() as name:
        yield name


@pytest.fixture
def emulated(provider: str, monkeypatch: Any) -> str:
    """The CUDA op modules' compiler and device queries pointed at the emulator."""
    install(monkeypatch)
    return provider


@pytest.fixture(params=[False, True], ids=["threads-in-order", "threads-reversed"])
def fiber_order(request: Any, monkeypatch: Any) -> None:
    """Each test twice: the emulated threads run in order, then reversed."""
    monkeypatch.setattr(EmulatedKernel, "reverse", request.param)
