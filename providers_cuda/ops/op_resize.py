"""Resize on CUDA: the generic plan's tables on the device, one raw launch per resized axis.

The host builds the plan once per (input shape, roi, scales, sizes) with the
generic builder (``ResizeAttrs.plan``: the coordinate maths is written once),
turns it into device tables and uploads them once; a run then only launches
kernels on the provider's stream, so the step can be recorded in a CUDA graph.

* nearest: one launch for every resized axis. The output is unravelled over
  at most :data:`MAX_DIMS` collapsed dims (neighbouring unresized axes merge);
  each resized dim has a table of input offsets per output coordinate, -1
  where tf_crop_and_resize extrapolates. Elements are copied as unsigned
  integers of their width, so every dtype of 1, 2, 4 or 8 bytes goes through.
* linear and cubic: one launch per resized axis, over the axis' taps
  (``ResizeTaps``: input offsets and weights per output position), in
  float32 (float64 for float64), float16, uint8 and int8 widened on load;
  intermediate results stay in the compute dtype and integers round and
  saturate once at the end, as the generic kernel's do. Where
  tf_crop_and_resize extrapolates, one more launch writes the value.

Every index is checked on the host when its table is built (:func:`_checked`);
an unresized dim's coordinate runs over the input's own extent, so a kernel
never reads outside its input. Tables a capture has recorded are
kept as long as the node (a graph bakes their addresses in). Other dtypes
(linear/cubic on wider integers, 16-byte elements) and more collapsed dims run the
generic kernel, marked not capture-safe with the reason when the dtype is
known at build time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxep.providers.bounds import capturing
from onnxep.providers.kernel import kernel, not_capture_safe
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops import op_resize as generic
from onnxep.providers.ops.nn import ResizePlan, compute_dtype

from . import index_cuda as ix

#: Collapsed dims a launch unravels; more run the generic kernel.
MAX_DIMS = 8
#: Plans kept per node before those no capture recorded are dropped.
MAX_PLANS = 64

BODY = r"""
// Offset in the input of output element o (geometry g: dims, strides, table offsets, tables;
// see op_resize.py), or -1 where a table says the element is extrapolated.
template <typename I>
__device__ __forceinline__ I rs_source(I o, const long long* __restrict__ g, I rank) {
  I src = 0;
  for (I d = rank - 1; d >= 0; --d) {
    const I n = (I)g[d];
    const I q = o / n;
    const I c = o - q * n;
    o = q;
    const long long t = g[2 * rank + d];
    if (t < 0) {
      src += c * (I)g[rank + d];
    } else {
      const long long e = g[t + c];
      if (e < 0) return -1;
      src += (I)e;
    }
  }
  return src;
}

// Nearest over every resized axis at once: a copy of element units U.
template <typename U, typename I>
__global__ void rs_nearest(const U* __restrict__ x, U* __restrict__ y,
                           const long long* __restrict__ g, long long total, long long rank,
                           long long fill) {
  const I step = (I)blockDim.x * gridDim.x;
  for (I o = (I)blockIdx.x * blockDim.x + threadIdx.x; o < (I)total; o += step) {
    const I s = rs_source<I>(o, g, (I)rank);
    y[o] = s < 0 ? (U)fill : x[s];
  }
}

// The extrapolation value where any axis' table says so (after the tap launches).
template <typename U, typename I>
__global__ void rs_fill(U* __restrict__ y, const long long* __restrict__ g, long long total,
                        long long rank, long long fill) {
  const I step = (I)blockDim.x * gridDim.x;
  for (I o = (I)blockIdx.x * blockDim.x + threadIdx.x; o < (I)total; o += step) {
    if (rs_source<I>(o, g, (I)rank) < 0) y[o] = (U)fill;
  }
}

__device__ __forceinline__ float rs_load(const float* p) { return *p; }
__device__ __forceinline__ float rs_load(const __half* p) { return ix_h2f(*p); }
__device__ __forceinline__ double rs_load(const double* p) { return *p; }
__device__ __forceinline__ float rs_load(const unsigned char* p) { return (float)*p; }
__device__ __forceinline__ float rs_load(const signed char* p) { return (float)*p; }
__device__ __forceinline__ void rs_store(float* p, float v) { *p = v; }
__device__ __forceinline__ void rs_store(__half* p, float v) { *p = ix_f2h(v); }
__device__ __forceinline__ void rs_store(double* p, double v) { *p = v; }
// Integers round half to even and saturate, as the generic kernel's round-and-clip does.
__device__ __forceinline__ void rs_store(unsigned char* p, float v) {
  *p = (unsigned char)fminf(fmaxf(rintf(v), 0.0f), 255.0f);
}
__device__ __forceinline__ void rs_store(signed char* p, float v) {
  *p = (signed char)fminf(fmaxf(rintf(v), -128.0f), 127.0f);
}

// One resized axis: x is (pre, n_in, post), y (pre, n_out, post); output row j reads input
// offsets off[j, k] (index * post, checked on the host) with weights w[j, k], k < taps.
template <typename TI, typename TO, typename W, typename I>
__global__ void rs_taps(const TI* __restrict__ x, TO* __restrict__ y,
                        const long long* __restrict__ off, const W* __restrict__ w,
                        long long total, long long n_out, long long n_in, long long post,
                        long long taps) {
  const I step = (I)blockDim.x * gridDim.x;
  const I no = (I)n_out, ps = (I)post, k = (I)taps;
  const I plane = (I)n_in * ps;
  for (I o = (I)blockIdx.x * blockDim.x + threadIdx.x; o < (I)total; o += step) {
    const I q = o % ps;
    const I r = o / ps;
    const I j = r % no;
    const TI* base = x + (r / no) * plane + q;
    const long long* oj = off + j * k;
    const W* wj = w + j * k;
    W acc = 0;
    for (I t = 0; t < k; ++t) acc += wj[t] * (W)rs_load(base + (I)oj[t]);
    rs_store(y + o, acc);
  }
}
"""

_UNITS = {n: ix.UNITS[n] for n in (1, 2, 4, 8)}
_INDEX = ("int", "long long")
#: Linear/cubic element types: NumPy dtype -> C type (8-bit images included).
_TAP_TYPES = {
    np.dtype(np.float16): "__half",
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
    np.dtype(np.uint8): "unsigned char",
    np.dtype(np.int8): "signed char",
}
#: (input, output) element pairs a tap launch may take: first, middle and last axes.
_TAP_PAIRS = (
    (np.float16, np.float16),
    (np.float16, np.float32),
    (np.float32, np.float32),
    (np.float32, np.float16),
    (np.float64, np.float64),
    (np.uint8, np.uint8),
    (np.uint8, np.float32),
    (np.float32, np.uint8),
    (np.int8, np.int8),
    (np.int8, np.float32),
    (np.float32, np.int8),
)


def _tap_name(ti: Any, to: Any, index: str) -> str:
    w = "double" if np.dtype(ti) == np.float64 else "float"
    return ix.template_name("rs_taps", _TAP_TYPES[np.dtype(ti)], _TAP_TYPES[np.dtype(to)], w, index)


NAMES = (
    *(ix.template_name(k, u, i) for k in ("rs_nearest", "rs_fill") for u in _UNITS.values()
      for i in _INDEX),
    *(_tap_name(a, b, i) for a, b in _TAP_PAIRS for i in _INDEX),
)  # fmt: skip
#: Every kernel takes pointers then int64 scalars (``launch.Launcher``'s direct codes).
SIGNATURES = {"rs_nearest": "ppp" + "qqq", "rs_fill": "pp" + "qqq", "rs_taps": "pppp" + "qqqqq"}


def dtype_refusal(mode: str, dtype: np.dtype) -> str | None:
    """Why this kernel leaves a ``mode`` resize of ``dtype`` to the generic kernel, or None."""
    if mode == "nearest":
        if dtype.itemsize in _UNITS:
            return None
        return f"nearest copies elements of 1, 2, 4 or 8 bytes, not {dtype.itemsize} ({dtype})"
    if dtype in _TAP_TYPES:
        return None
    return f"{mode} interpolates float16, float32, float64, uint8 and int8, not {dtype}"


# --------------------------------------------------------------------------- host tables


def _strides(shape: tuple[int, ...]) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return out[::-1]


def _checked(index: np.ndarray, n_in: int, what: str) -> np.ndarray:
    """``index`` as int64, after checking every entry is inside the axis, ``[0, n_in)``: a
    kernel reads the input there."""
    e = np.ascontiguousarray(index, dtype=np.int64)
    bad = (e < 0) | (e >= n_in)
    if bad.any():
        raise AssertionError(f"Resize: {what} index {int(e[bad][0])} outside [0, {n_in})")
    return e


def _geometry(
    out_shape: tuple[int, ...],
    tables: dict[int, np.ndarray],
    steps: list[int],
) -> tuple[np.ndarray, int] | None:
    """The geometry table of a launch over ``out_shape``: collapsed dims, strides ``steps``
    (per axis), table offsets, then the tables (per resized axis: one entry per output
    coordinate, -1 where extrapolated); and its rank. None: more than MAX_DIMS dims."""
    dims: list[int] = []
    strides: list[int] = []
    tabs: list[np.ndarray | None] = []
    for a, n in enumerate(out_shape):
        t = tables.get(a)
        if t is None:
            if n == 1:
                continue
            if dims and tabs[-1] is None and strides[-1] == n * steps[a]:
                dims[-1] *= n  # the previous unresized dim steps over exactly this one
                strides[-1] = steps[a]
                continue
        dims.append(n)
        strides.append(steps[a])
        tabs.append(None if t is None else np.ascontiguousarray(t, dtype=np.int64))
    if not dims:
        dims, strides, tabs = [1], [0], [None]
    if len(dims) > MAX_DIMS:
        return None
    rank = len(dims)
    offsets, parts, at = [], [], 3 * rank
    for t in tabs:
        offsets.append(-1 if t is None else at)
        if t is not None:
            parts.append(t)
            at += len(t)
    head = np.array([*dims, *strides, *offsets], np.int64)
    return np.concatenate([head, *parts]), rank


def _fill_bits(value: float, dtype: np.dtype) -> int:
    """The extrapolation value in ``dtype``, as the signed int64 of its bits."""
    bits = np.array(value, dtype).view(f"u{dtype.itemsize}")
    return int(bits.astype(np.uint64).view(np.int64))


def _index_type(*sizes: int) -> str:
    return "int" if max(sizes) < 2**31 else "long long"


@dataclass
class Launch:
    """One kernel launch of a plan; ``tables`` (device arrays) are its pointer arguments
    after the input and output."""

    kernel: str
    total: int
    tables: tuple[Any, ...]
    tail: tuple[int, ...]
    out_dtype: np.dtype
    out_shape: tuple[int, ...]


@dataclass
class DevicePlan:
    """A node's launches for one input key: each launch reads the previous one's output
    (the first reads the input); a ``rs_fill`` launch writes into the last output.
    ``out_shape`` with no launches: an empty or unchanged result."""

    out_shape: tuple[int, ...]
    launches: list[Launch]
    pinned: bool = False  # a capture recorded its tables: never dropped


def _nearest_plan(x_shape, dtype, plan: ResizePlan, extrap: float, upload) -> DevicePlan | None:
    out = tuple(plan.out_shape)
    steps = _strides(x_shape)
    masks = dict(plan.outside)
    tables = {}
    for a, _, idx in plan.axes_ops:
        t = _checked(idx, x_shape[a], f"axis {a}") * steps[a]
        if a in masks:
            t = np.where(masks[a], -1, t)
        tables[a] = t
    geo = _geometry(out, tables, steps)
    if geo is None:
        return None
    g, rank = geo
    total = math.prod(out)
    name = ix.template_name("rs_nearest", _UNITS[dtype.itemsize],
                            _index_type(total, math.prod(x_shape)))  # fmt: skip
    tail = (total, rank, _fill_bits(extrap, dtype))
    return DevicePlan(out, [Launch(name, total, (upload(g),), tail, dtype, out)])


def _taps_plan(x_shape, dtype, plan: ResizePlan, extrap: float, upload) -> DevicePlan | None:
    cdt = compute_dtype(dtype)
    wdt = np.float64 if cdt == np.float64 else np.float32
    shape = list(x_shape)
    launches: list[Launch] = []
    last = len(plan.axes_ops) - 1
    for i, (a, _, taps) in enumerate(plan.axes_ops):
        n_in, post = shape[a], math.prod(shape[a + 1 :])
        off = _checked(taps.index, n_in, f"axis {a} tap") * post
        n_out, k = taps.index.shape
        in_total = math.prod(shape)
        shape[a] = n_out
        total = math.prod(shape)
        ti = dtype if i == 0 else cdt
        to = dtype if i == last else cdt
        name = _tap_name(ti, to, _index_type(total, in_total, off.size))
        w = np.ascontiguousarray(taps.weights, dtype=wdt)
        tables = (upload(off.reshape(-1)), upload(w.reshape(-1)))
        tail = (total, n_out, n_in, post, k)
        launches.append(Launch(name, total, tables, tail, np.dtype(to), tuple(shape)))
    out = tuple(shape)
    if plan.outside:
        masks = {a: np.where(m, -1, 0) for a, m in plan.outside}
        geo = _geometry(out, masks, [0] * len(out))
        if geo is None:
            return None
        g, rank = geo
        total = math.prod(out)
        name = ix.template_name("rs_fill", _UNITS[dtype.itemsize], _index_type(total))
        if dtype.kind in "iu":  # the value goes through the compute dtype's round and clip
            info = np.iinfo(dtype)
            extrap = float(np.clip(np.round(np.float32(extrap)), info.min, info.max))
        tail = (total, rank, _fill_bits(extrap, dtype))
        launches.append(Launch(name, total, (upload(g),), tail, dtype, out))
    return DevicePlan(out, launches)


def device_plan(
    attrs: generic.ResizeAttrs, key: tuple, dtype: np.dtype, upload: Callable[[Any], Any]
) -> DevicePlan | None:
    """The launches for input key ``key`` (``ResizeAttrs.key``) and ``dtype``, tables
    uploaded through ``upload``; None: the generic kernel runs it."""
    if dtype_refusal(attrs.mode, dtype) is not None:
        return None
    plan = attrs.plan(key)
    x_shape = key[0]
    if any(op == "empty" for _, op, _ in plan.axes_ops):
        empty = {a for a, op, _ in plan.axes_ops if op == "empty"}
        shape = tuple(0 if a in empty else n for a, n in enumerate(plan.out_shape))
        return DevicePlan(shape, [])
    if not plan.axes_ops or math.prod(plan.out_shape) == 0:
        return DevicePlan(tuple(plan.out_shape), [])
    make = _nearest_plan if attrs.mode == "nearest" else _taps_plan
    return make(x_shape, dtype, plan, attrs.extrapolation_value, upload)


# --------------------------------------------------------------------------- running


def _refusal_note(why: str) -> str:
    return f"Resize: {why}, so the generic kernel runs it (its tables upload on each run)"


def _arity(run: Callable, legacy: bool) -> Callable:
    """``run(x, roi, scales, sizes)`` as Resize-10's and Upsample's ``run(x, scales)``."""
    if not legacy:
        return run

    def legacy_run(x, scales=None):
        return run(x, None, scales, None)

    return legacy_run


def resize_runner(node: NodeInfo, xp: Any, attrs: generic.ResizeAttrs, legacy: bool = False):
    """The node's run through the device plans; the generic kernel where the device or the
    dtype rules them out."""
    fallback = generic.attrs_run(xp, attrs)
    dev = ix.device_for(xp)
    if dev is None:
        return _arity(fallback, legacy)
    x_info = node.inputs[0] if node.inputs else None
    if x_info is not None and x_info.dtype is not None:
        why = dtype_refusal(attrs.mode, np.dtype(x_info.dtype))
        if why is not None:
            return not_capture_safe(_arity(fallback, legacy), _refusal_note(why))
    launchers: dict[str, Callable] = {}
    plans: dict[tuple, DevicePlan | None] = {}
    address, empty, stream = dev.address, dev.empty, dev.stream

    def launcher(name: str) -> Callable:
        fn = launchers.get(name)
        if fn is None:  # one kernel family (one signature) compiled on first use
            family = name[: name.index("<")]
            names = tuple(n for n in NAMES if n.startswith(family + "<"))
            launchers.update(dev.kernels(BODY, names, SIGNATURES[family]))
            fn = launchers[name]
        return fn

    def plan_for(key: tuple, dtype: np.dtype) -> DevicePlan | None:
        full = (key, dtype)
        p = plans.get(full, False)
        if p is not False:
            return p
        if capturing(xp):
            raise RuntimeError(
                f"Resize {node.name!r}: a new input shape inside a CUDA graph capture "
                "(its tables upload on its first run); the step runs eagerly instead"
            )
        if len(plans) >= MAX_PLANS:
            for k in [k for k, v in plans.items() if v is None or not v.pinned]:
                del plans[k]
        p = plans[full] = device_plan(attrs, key, dtype, dev.upload)
        return p

    def run(x, roi=None, scales=None, sizes=None):
        p = plan_for(attrs.key(x.shape, roi, scales, sizes), np.dtype(x.dtype))
        if p is None:
            return fallback(x, roi, scales, sizes)
        src = x if dev.contiguous(x) else dev.ascontiguous(x)
        if not p.launches:
            y = empty(p.out_shape, x.dtype)
            if p.out_shape == tuple(x.shape):
                dev.copy(y, src)  # nothing resized: a device copy, never the input itself
            return (y,)
        if not p.pinned and capturing(xp):
            p.pinned = True  # the graph bakes in the tables' addresses
        y = src
        for ln in p.launches:
            grid = ix.grid_for(ln.total, dev.sms)
            if ln.kernel.startswith("rs_fill"):
                args = (address(y), *map(address, ln.tables), *ln.tail)
            else:
                y = empty(ln.out_shape, ln.out_dtype)
                args = (address(src), address(y), *map(address, ln.tables), *ln.tail)
                src = y
            launcher(ln.kernel)(grid, ix.BLOCK, args, stream())
        return (y,)

    return _arity(run, legacy)


@kernel("Resize", since=10, host_inputs=(1,))
def resize_10(node: NodeInfo, xp: Any):
    return resize_runner(node, xp, generic.legacy_attrs(generic.resize_10_mode(node)), True)


@kernel("Resize", since=(11, 13, 18, 19), host_inputs=(1, 2, 3))
def resize(node: NodeInfo, xp: Any):
    return resize_runner(node, xp, generic.resize_attrs(node))
