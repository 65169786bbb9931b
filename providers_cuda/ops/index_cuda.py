"""What the CUDA index kernels share: device primitives, the error report, the launch door.

Gather, GatherElements, GatherND, ScatterElements and ScatterND check every
index where they read it, on the device: an index outside ``[-d, d-1]``
reads or writes nothing (a gather writes zeros there) and is recorded in the
provider's error flag (``providers_cuda/error_flag.py``), which the provider
reads where it synchronizes anyway. So a step reads nothing back on the
host, costs one raw launch (a scatter adds one device-to-device copy of its
data) and can be captured into a CUDA graph.

Copies move whole elements as unsigned integers of the element's width, or
as wider units (up to 16 bytes) where a gathered row allows, so every dtype
of width 1, 2, 4, 8 or 16 gathers and plain-scatters through the same
kernels; scatter reductions compute in the element type (float16 in float32,
rounded once per update, as NumPy does).

:data:`PRIMITIVES` is the only block naming CUDA built-ins (atomics, half
conversions, bit casts); the tests' kernel emulator swaps it for host
versions of the same names and compiles the rest as it is. Builders reach
the device only through :func:`device_for`, which the emulator also stands in
for.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from onnxep.providers.node import NodeInfo

from .. import error_flag

#: Threads per block of every index kernel (grid-stride loops).
BLOCK = 256
#: Blocks per SM a launch may use; more work loops inside the kernel.
BLOCKS_PER_SM = 32
#: Collapsed dims an element-wise index op takes (GatherElements/ScatterElements), and
#: tuple length a GatherND/ScatterND takes; more falls back to the generic kernel.
MAX_DIMS = 6

#: Unsigned types copied per thread, by width in bytes.
UNITS = {
    1: "unsigned char",
    2: "unsigned short",
    4: "unsigned int",
    8: "unsigned long long",
    16: "uint4",
}
#: Index element types, by NumPy dtype.
INDEX_TYPES = {np.dtype(np.int32): "int", np.dtype(np.int64): "long long"}
#: Scatter reductions: ONNX name -> the kernels' OP code.
REDUCTION_CODES = {"none": 0, "add": 1, "mul": 2, "max": 3, "min": 4}
#: Element types the scatter reductions compute in.
REDUCE_TYPES = {
    np.dtype(np.float32): "float",
    np.dtype(np.float16): "__half",
    np.dtype(np.float64): "double",
    np.dtype(np.int32): "int",
    np.dtype(np.int64): "long long",
}

PRIMITIVES = r"""
#include <cuda_fp16.h>

// The first thread to find a bad index owns the record.
__device__ __forceinline__ bool ix_claim(int* flag) { return atomicCAS(flag, 0, 1) == 0; }

__device__ __forceinline__ float ix_h2f(__half x) { return __half2float(x); }
__device__ __forceinline__ __half ix_f2h(float x) { return __float2half_rn(x); }

// Bit views of the reducible element types, for compare-and-swap loops.
__device__ __forceinline__ unsigned short ix_bits(__half x) { return __half_as_ushort(x); }
__device__ __forceinline__ unsigned int ix_bits(float x) { return __float_as_uint(x); }
__device__ __forceinline__ unsigned long long ix_bits(double x) {
  return (unsigned long long)__double_as_longlong(x);
}
__device__ __forceinline__ unsigned int ix_bits(int x) { return (unsigned int)x; }
__device__ __forceinline__ unsigned long long ix_bits(long long x) {
  return (unsigned long long)x;
}
__device__ __forceinline__ void ix_unbits(unsigned short b, __half* x) { *x = __ushort_as_half(b); }
__device__ __forceinline__ void ix_unbits(unsigned int b, float* x) { *x = __uint_as_float(b); }
__device__ __forceinline__ void ix_unbits(unsigned long long b, double* x) {
  *x = __longlong_as_double((long long)b);
}
__device__ __forceinline__ void ix_unbits(unsigned int b, int* x) { *x = (int)b; }
__device__ __forceinline__ void ix_unbits(unsigned long long b, long long* x) { *x = (long long)b; }

__device__ __forceinline__ unsigned short ix_cas(unsigned short* p, unsigned short e,
                                                 unsigned short d) {
  return atomicCAS(p, e, d);
}
__device__ __forceinline__ unsigned int ix_cas(unsigned int* p, unsigned int e, unsigned int d) {
  return atomicCAS(p, e, d);
}
__device__ __forceinline__ unsigned long long ix_cas(unsigned long long* p, unsigned long long e,
                                                     unsigned long long d) {
  return atomicCAS(p, e, d);
}

// Native atomics where the hardware has them (the rest loop on ix_cas).
__device__ __forceinline__ void ix_atomic_add(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void ix_atomic_add(double* p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void ix_atomic_add(int* p, int v) { atomicAdd(p, v); }
__device__ __forceinline__ void ix_atomic_add(long long* p, long long v) {
  atomicAdd((unsigned long long*)p, (unsigned long long)v);
}
__device__ __forceinline__ void ix_atomic_max(int* p, int v) { atomicMax(p, v); }
__device__ __forceinline__ void ix_atomic_max(long long* p, long long v) { atomicMax(p, v); }
__device__ __forceinline__ void ix_atomic_min(int* p, int v) { atomicMin(p, v); }
__device__ __forceinline__ void ix_atomic_min(long long* p, long long v) { atomicMin(p, v); }
"""

COMMON = r"""
enum { IX_NONE = 0, IX_ADD = 1, IX_MUL = 2, IX_MAX = 3, IX_MIN = 4 };

// An index against an axis of length dim: counted from the end when negative, -1 when out
// of [-dim, dim-1].
__device__ __forceinline__ long long ix_norm(long long v, long long dim) {
  const long long i = v < 0 ? v + dim : v;
  return (i < 0 || i >= dim) ? -1 : i;
}

__device__ __forceinline__ void ix_put64(int* w, long long v) {
  const unsigned long long u = (unsigned long long)v;
  w[0] = (int)(unsigned int)(u & 0xffffffffull);
  w[1] = (int)(unsigned int)(u >> 32);
}

// Record a bad index unless an earlier one is recorded (layout: providers_cuda/error_flag.py).
__device__ void ix_report(int* flag, long long node, long long axis, long long value,
                          long long pos, long long dim, long long count) {
  if (!ix_claim(flag)) return;
  flag[1] = (int)node;
  flag[2] = (int)axis;
  ix_put64(flag + 4, value);
  ix_put64(flag + 6, pos);
  ix_put64(flag + 8, dim);
  ix_put64(flag + 10, count);
}

// Offset in data (strides s) of element o of an index array of dims n, with its coordinate
// on collapsed dim ax replaced by the index i. Unused leading dims have n = 1, s = 0.
__device__ __forceinline__ long long ix_element_offset(long long o, const long long* n,
                                                       const long long* s, long long ax,
                                                       long long i) {
  long long off = 0;
#pragma unroll
  for (int d = 5; d >= 0; --d) {
    const long long q = o / n[d];
    off += (d == ax ? i : o - q * n[d]) * s[d];
    o = q;
  }
  return off;
}

template <typename T> struct IxVal {
  typedef T V;
  static __device__ __forceinline__ V get(T x) { return x; }
  static __device__ __forceinline__ T put(V v) { return v; }
};
template <> struct IxVal<__half> {
  typedef float V;
  static __device__ __forceinline__ float get(__half x) { return ix_h2f(x); }
  static __device__ __forceinline__ __half put(float v) { return ix_f2h(v); }
};

// One reduction step; NaN wins max and min, as in NumPy.
template <int OP, typename V> __device__ __forceinline__ V ix_op(V a, V b) {
  if (OP == IX_ADD) return a + b;
  if (OP == IX_MUL) return a * b;
  if (OP == IX_MAX) return (a > b || a != a) ? a : b;
  return (a < b || a != a) ? a : b;
}
// Integer sums and products wrap, as NumPy's do.
template <> __device__ __forceinline__ int ix_op<IX_ADD, int>(int a, int b) {
  return (int)((unsigned int)a + (unsigned int)b);
}
template <> __device__ __forceinline__ int ix_op<IX_MUL, int>(int a, int b) {
  return (int)((unsigned int)a * (unsigned int)b);
}
template <> __device__ __forceinline__ long long ix_op<IX_ADD, long long>(long long a,
                                                                          long long b) {
  return (long long)((unsigned long long)a + (unsigned long long)b);
}
template <> __device__ __forceinline__ long long ix_op<IX_MUL, long long>(long long a,
                                                                          long long b) {
  return (long long)((unsigned long long)a * (unsigned long long)b);
}

// *p = *p (OP) v, atomically: a compare-and-swap loop on the element's bits...
template <int OP, typename T> struct IxCombine {
  static __device__ __forceinline__ void apply(T* p, T v) {
    typedef decltype(ix_bits(v)) B;
    B* bp = reinterpret_cast<B*>(p);
    B seen = *bp;
    for (;;) {
      T cur;
      ix_unbits(seen, &cur);
      const T next = IxVal<T>::put(ix_op<OP>(IxVal<T>::get(cur), IxVal<T>::get(v)));
      const B prev = ix_cas(bp, seen, ix_bits(next));
      if (prev == seen) return;
      seen = prev;
    }
  }
};
// ...or one native atomic where there is one.
#define IX_NATIVE(OPC, T, FN)                                              \
  template <> struct IxCombine<OPC, T> {                                   \
    static __device__ __forceinline__ void apply(T* p, T v) { FN(p, v); } \
  };
IX_NATIVE(IX_ADD, float, ix_atomic_add)
IX_NATIVE(IX_ADD, double, ix_atomic_add)
IX_NATIVE(IX_ADD, int, ix_atomic_add)
IX_NATIVE(IX_ADD, long long, ix_atomic_add)
IX_NATIVE(IX_MAX, int, ix_atomic_max)
IX_NATIVE(IX_MAX, long long, ix_atomic_max)
IX_NATIVE(IX_MIN, int, ix_atomic_min)
IX_NATIVE(IX_MIN, long long, ix_atomic_min)
"""


# --------------------------------------------------------------------------- the device door


Launch = Callable[[int, int, tuple, int], None]


class Device(Protocol):
    """Where index kernels run: CuPy on a GPU, or the tests' host emulator."""

    sms: int

    def kernels(self, body: str, names: Sequence[str], signature: str) -> dict[str, Launch]:
        """``{name: launch(grid, block, args, stream)}`` for ``PRIMITIVES + body``."""
        ...

    def address(self, a: Any) -> Any:
        """What a kernel's pointer argument is given for array ``a``."""
        ...

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any: ...

    def upload(self, host: np.ndarray) -> Any:
        """A device copy of host array ``host`` (made outside a capture: tables kept)."""
        ...

    def copy(self, dst: Any, src: Any) -> None:
        """Queue ``dst[...] = src`` (same shape and dtype, both C-contiguous)."""
        ...

    def contiguous(self, a: Any) -> bool: ...

    def aligned(self, a: Any, width: int) -> bool:
        """Whether array ``a`` starts on a multiple of ``width`` bytes."""
        ...

    def ascontiguous(self, a: Any) -> Any: ...

    def stream(self) -> int: ...


class CupyDevice:
    """The GPU: NVRTC kernels launched straight through the driver (``launch.Launcher``),
    arrays from the current CuPy pool, copies on the current stream."""

    _D2D = 3  # cudaMemcpyDeviceToDevice

    def __init__(self) -> None:
        import cupy

        from ..elementwise import c_contiguous, stream_ptr_fn
        from .attention_cuda import sm_count

        self._cupy = cupy
        self.sms = sm_count()
        self.empty = cupy.ndarray  # allocates from the current pool
        self.upload = cupy.asarray
        self.contiguous = c_contiguous()
        self.ascontiguous = cupy.ascontiguousarray
        self.stream = stream_ptr_fn()
        self._memcpy = cupy.cuda.runtime.memcpyAsync

    def kernels(self, body: str, names: Sequence[str], signature: str) -> dict[str, Launch]:
        from .. import nvrtc
        from ..launch import Launcher

        source = PRIMITIVES + body
        return {n: Launcher(nvrtc.function(source, n, tuple(names)), signature) for n in names}

    @staticmethod
    def address(a: Any) -> int:
        return a.data.ptr

    @staticmethod
    def aligned(a: Any, width: int) -> bool:
        return a.data.ptr % width == 0

    def copy(self, dst: Any, src: Any) -> None:
        if src.nbytes:
            self._memcpy(dst.data.ptr, src.data.ptr, src.nbytes, self._D2D, self.stream())


_cupy_devices: dict[int, CupyDevice] = {}


def device_for(xp: Any) -> Device | None:
    """The device index kernels run on for array namespace ``xp`` (None: not CuPy's)."""
    base = getattr(xp, "__onnxep_base__", xp)
    if getattr(base, "__name__", "") != "cupy":
        return None
    dev = base.cuda.runtime.getDevice()
    found = _cupy_devices.get(dev)
    if found is None:
        found = _cupy_devices[dev] = CupyDevice()
    return found


# --------------------------------------------------------------------------- building


@dataclass(frozen=True)
class Variant:
    """One launch of a planned call: the kernel, its grid and its scalar arguments."""

    launch: Launch
    grid: int
    tail: tuple[int, ...]


@dataclass(frozen=True)
class IndexKernels:
    """What a builder needs to launch: the device, the flag (and its kernel argument) and the
    id the flag's record names the node by."""

    device: Device
    flag: error_flag.ErrorFlag
    flag_arg: Any
    node_id: int

    def note_shape(self, shape: tuple[int, ...]) -> None:
        """Remember the indices' shape, so an error can say where the bad index sits."""
        self.flag.shapes[self.node_id] = shape


def prepare(node: NodeInfo, xp: Any) -> IndexKernels | None:
    """Device and error flag for ``node``'s kernel, or None when the node should run the generic
    kernel: not on CuPy, or built outside a provider (no error flag to report to)."""
    device = device_for(xp)
    flag = error_flag.current()
    if device is None or flag is None:
        return None
    node_id = flag.register(node.op_type, node.name)
    return IndexKernels(device, flag, device.address(flag.words), node_id)


def grid_for(total: int, sms: int) -> int:
    """Blocks of a grid-stride launch over ``total`` items."""
    return max(1, min(-(-total // BLOCK), sms * BLOCKS_PER_SM))


def unit_width(row_bytes: int) -> int:
    """The widest copy unit (a power of two up to 16 bytes) dividing a row of ``row_bytes``."""
    w = 16
    while w > 1 and row_bytes % w:
        w //= 2
    return w


def template_name(kernel: str, *args: str | int) -> str:
    return f"{kernel}<{', '.join(str(a) for a in args)}>"


def padded(values: Sequence[int], fill: int) -> tuple[int, ...]:
    """``values`` with ``fill`` in front, MAX_DIMS long."""
    return (fill,) * (MAX_DIMS - len(values)) + tuple(values)


def trailing_padded(values: Sequence[int], fill: int) -> tuple[int, ...]:
    """``values`` with ``fill`` after them, MAX_DIMS long (GatherND/ScatterND's indexed dims)."""
    return tuple(values) + (fill,) * (MAX_DIMS - len(values))


def collapse_elements(
    index_shape: Sequence[int], data_shape: Sequence[int], axis: int
) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """``(dims, strides, ax)``: GatherElements/ScatterElements addressing with fewer dims.

    Element ``o`` of the (C-contiguous) indices, unravelled over ``dims``,
    sits in data at ``sum(c_d * strides[d])`` with the coordinate on ``ax``
    replaced by the index. Size-1 dims other than the axis are dropped, and
    neighbours off the axis merge where the inner one spans all of data's
    length (then data's strides line up). The result is padded to MAX_DIMS
    at the front; longer results are returned unpadded (the caller falls back).
    """
    strides = []
    acc = 1
    for d in reversed(data_shape):
        strides.append(acc)
        acc *= d
    strides.reverse()
    dims: list[int] = []
    steps: list[int] = []
    ax = -1
    for d, n in enumerate(index_shape):
        if d == axis:
            dims.append(n)
            steps.append(strides[d])
            ax = len(dims) - 1
            continue
        if n == 1:
            continue
        # the previous dim (not the axis) steps over exactly n of this one: one dim
        if dims and len(dims) - 1 != ax and steps[-1] == n * strides[d]:
            dims[-1] *= n
            steps[-1] = strides[d]
            continue
        dims.append(n)
        steps.append(strides[d])
    if len(dims) > MAX_DIMS:
        return tuple(dims), tuple(steps), ax
    pad = MAX_DIMS - len(dims)
    return padded(dims, 1), padded(steps, 0), ax + pad


def size(shape: Sequence[int]) -> int:
    return math.prod(shape)


def element_type(reduction: str, dtype: np.dtype) -> str | None:
    """A scatter kernel's element type for ``dtype`` under ``reduction``, or None (generic
    kernel): plain stores copy bits of the element's width, reductions compute in its type."""
    if reduction == "none":
        return UNITS.get(dtype.itemsize)
    return REDUCE_TYPES.get(dtype)


def reduction_names(kernel: str, reduction: str) -> tuple[str, ...]:
    """The instantiations of scatter ``kernel`` a node with ``reduction`` may launch."""
    code = REDUCTION_CODES[reduction]
    types = UNITS.values() if reduction == "none" else REDUCE_TYPES.values()
    return tuple(template_name(kernel, t, i, code) for t in types for i in INDEX_TYPES.values())


def all_reduction_names(kernel: str) -> tuple[str, ...]:
    """Every instantiation of scatter ``kernel``, over all reductions."""
    return tuple(n for r in REDUCTION_CODES for n in reduction_names(kernel, r))


# --------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class Plan:
    """One input signature's launches: ``wide`` moves units of ``width`` bytes and runs when
    the array it reads rows of is aligned to them, ``narrow`` moves single elements (the same
    launch where there is one choice); both None: nothing to launch."""

    out_shape: tuple[int, ...]
    width: int
    wide: Variant | None
    narrow: Variant | None

    @staticmethod
    def single(out_shape: tuple[int, ...], launch: Variant | None) -> Plan:
        """A plan with one launch whatever the alignment (or none)."""
        return Plan(tuple(out_shape), 1, launch, launch)

    def pick(self, device: Device, rows: Any) -> Variant:
        """The launch for an input whose rows are read from ``rows``."""
        if self.wide is self.narrow:
            return self.wide
        return self.wide if device.aligned(rows, self.width) else self.narrow


def unit_plan(
    k: IndexKernels,
    kernels: dict[str, Launch],
    out_shape: tuple[int, ...],
    widths: tuple[int, int],
    row_bytes: int,
    rows: int,
    launch_for: Callable[[int, int, int], tuple[str, tuple[int, ...]]],
) -> Plan:
    """A :class:`Plan` copying ``rows`` rows of ``row_bytes`` in units of ``widths`` (wide,
    then narrow); ``launch_for(width, units_per_row, total_units)`` names the instantiation
    and gives its scalar arguments."""
    variants = []
    for width in widths:
        units = row_bytes // width
        total = rows * units
        name, tail = launch_for(width, units, total)
        variants.append(Variant(kernels[name], grid_for(total, k.device.sms), tail))
    return Plan(tuple(out_shape), widths[0], *variants)


# --------------------------------------------------------------------------- running


def _contiguous(dev: Device, a: Any) -> Any:
    return a if dev.contiguous(a) else dev.ascontiguous(a)


def gather_runner(
    k: IndexKernels, plans: Callable[..., Plan | None], fallback: Callable[..., tuple]
) -> Callable[[Any, Any], tuple]:
    """``run(data, indices)`` for a gather: a fresh output, then the plan's launch over
    ``(data, indices, out, flag, *tail)``; no plan runs ``fallback``."""
    dev = k.device
    address, empty, stream, flag_arg = dev.address, dev.empty, dev.stream, k.flag_arg

    def run(x: Any, indices: Any) -> tuple:
        p = plans(x.shape, x.dtype, indices.shape, indices.dtype)
        if p is None:
            return fallback(x, indices)
        out = empty(p.out_shape, x.dtype)
        if p.wide is None:
            return (out,)
        x, indices = _contiguous(dev, x), _contiguous(dev, indices)
        v = p.pick(dev, x)
        v.launch(v.grid, BLOCK, (address(x), address(indices), address(out), flag_arg, *v.tail),
                 stream())  # fmt: skip
        k.note_shape(indices.shape)
        return (out,)

    return run


def scatter_runner(
    k: IndexKernels, plans: Callable[..., Plan | None], fallback: Callable[..., tuple]
) -> Callable[[Any, Any, Any], tuple]:
    """``run(data, indices, updates)`` for a scatter: the output starts as a device copy of
    data (inputs may be shared constants, never written), then the plan's launch over
    ``(out, indices, updates, flag, *tail)``; no plan runs ``fallback``."""
    dev = k.device
    address, empty, stream, flag_arg = dev.address, dev.empty, dev.stream, k.flag_arg

    def run(data: Any, indices: Any, updates: Any) -> tuple:
        p = plans(data.shape, data.dtype, indices.shape, indices.dtype, updates.shape,
                  updates.dtype)  # fmt: skip
        if p is None:
            return fallback(data, indices, updates)
        out = empty(data.shape, data.dtype)
        dev.copy(out, _contiguous(dev, data))
        if p.wide is None:
            return (out,)
        indices, updates = _contiguous(dev, indices), _contiguous(dev, updates)
        v = p.pick(dev, updates)
        args = (address(out), address(indices), address(updates), flag_arg, *v.tail)
        v.launch(v.grid, BLOCK, args, stream())
        k.note_shape(indices.shape)
        return (out,)

    return run
