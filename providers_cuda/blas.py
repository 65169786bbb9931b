"""Matrix products through cuBLAS, callable inside CUDA stream capture.

CuPy's own cuBLAS wrappers (``cupy.matmul`` and every low-level function in
``cupy_backends.cuda.libs.cublas``) call ``setStream`` first, and CuPy's
``setStream`` refuses while the stream is being captured. This module calls
libcublas directly through ctypes, on a handle of its own per thread and
device, with the stream and a workspace set before the call, which is what
cuBLAS documents for graph capture: no call here allocates, synchronizes or
reads device memory on the host once the handle and the stream's workspace
exist (both are made on the first call on a stream, outside capture).

The library is the very copy CuPy loaded (found in the process's memory
map), so the handle and CuPy's arrays share one CUDA context.

``matmul(a, b, out=None)`` has ``numpy.matmul`` semantics for float32,
float16 and float64: 1-D operands, 2-D, and batched operands with broadcast
batch dims. float16 runs on tensor cores with float32 accumulation; float32
computes in plain float32 (no TF32), so results match the CPU within float32
tolerances, unless the run allows TF32 (the provider's ``use_tf32`` option,
:mod:`.math_mode`); float64 in float64.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import sys
import threading
from typing import Any

import numpy as np

from .math_mode import tf32

__all__ = ["BlasError", "SUPPORTED", "SUPPORTED_DTYPES", "gemm", "matmul", "supports"]

#: dtype names this module multiplies; others go to a generic kernel.
SUPPORTED_DTYPES = frozenset({"float32", "float16", "float64"})
#: The same as NumPy dtypes, for ``x.dtype in SUPPORTED`` on a run's path: a set lookup,
#: where ``x.dtype.name`` builds its string anew (microseconds a call).
SUPPORTED = frozenset(np.dtype(n) for n in SUPPORTED_DTYPES)
_NAMES = {np.dtype(n): n for n in SUPPORTED_DTYPES}

# cuBLAS / CUDA enum values (cublas_api.h, library_types.h).
OP_N, OP_T = 0, 1
CUDA_R_32F, CUDA_R_64F, CUDA_R_16F = 0, 1, 2
_COMPUTE_32F, _COMPUTE_64F, _COMPUTE_32F_FAST_TF32 = 68, 70, 77
_GEMM_DEFAULT = -1
_INT_MAX = 2**31 - 1
_DTYPE_CODE = {"float32": CUDA_R_32F, "float16": CUDA_R_16F, "float64": CUDA_R_64F}
_COMPUTE = {"float32": _COMPUTE_32F, "float16": _COMPUTE_32F, "float64": _COMPUTE_64F}
# alpha and beta have the compute type's C type.
_SCALAR = {"float32": ctypes.c_float, "float16": ctypes.c_float, "float64": ctypes.c_double}

# Host scalars (the handle keeps cuBLAS's default host pointer mode): read at
# call time, and captured by value into a graph. Constants live for the process.
_CONSTANTS: dict[tuple[type, float], Any] = {
    (t, v): t(v) for t in (ctypes.c_float, ctypes.c_double) for v in (0.0, 1.0)
}


class BlasError(RuntimeError):
    """cuBLAS could not be loaded or a call failed; the message says which and why."""


def supports(dtype: Any) -> bool:
    """Whether :func:`matmul` handles operands of ``dtype``."""
    if dtype in SUPPORTED:
        return True
    return getattr(dtype, "name", str(dtype)) in SUPPORTED_DTYPES


# -- loading libcublas -------------------------------------------------------------


def _loaded_cublas_path() -> str | None:
    """The libcublas this process already loaded (CuPy's), from /proc/self/maps."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                base = os.path.basename(path)
                if base.startswith("libcublas.so"):
                    return path
    except OSError:
        return None
    return None


def _candidates() -> list[str]:
    import cupy

    major = cupy.cuda.runtime.runtimeGetVersion() // 1000
    if sys.platform == "win32":
        return [f"cublas64_{major}.dll", "cublas64_12.dll", "cublas64_13.dll"]
    names = [f"libcublas.so.{major}", "libcublas.so"]
    found = ctypes.util.find_library("cublas")
    if found:
        names.append(found)
    return names


class _Lib:
    """libcublas's entry points with their C signatures."""

    def __init__(self) -> None:
        import cupy

        # Make CuPy load its cuBLAS first, so the lookup below finds that copy.
        cupy.cuda.device.get_cublas_handle()
        tried: list[str] = []
        lib = None
        path = _loaded_cublas_path()
        for name in ([path] if path else []) + _candidates():
            try:
                lib = ctypes.CDLL(name)
                break
            except OSError as exc:
                tried.append(f"{name}: {exc}")
        if lib is None:
            raise BlasError(
                "could not load libcublas (tried " + "; ".join(tried) + "); install the "
                "CUDA toolkit's cuBLAS or the nvidia-cublas wheel matching your CuPy"
            )
        self.path = getattr(lib, "_name", "?")
        vp, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
        self.create = self._fn(lib, "cublasCreate_v2", [ctypes.POINTER(vp)])
        self.set_stream = self._fn(lib, "cublasSetStream_v2", [vp, vp])
        self.set_workspace = self._fn(lib, "cublasSetWorkspace_v2", [vp, vp, ctypes.c_size_t])
        self.gemm_ex = self._fn(
            lib,
            "cublasGemmEx",
            [vp, i32, i32, i32, i32, i32, vp, vp, i32, i32, vp, i32, i32, vp, vp, i32, i32]
            + [i32, i32],
        )
        self.gemm_strided_batched_ex = self._fn(
            lib,
            "cublasGemmStridedBatchedEx",
            [vp, i32, i32, i32, i32, i32, vp, vp, i32, i32, i64, vp, i32, i32, i64, vp, vp, i32]
            + [i32, i64, i32, i32, i32],
        )

    @staticmethod
    def _fn(lib: Any, name: str, argtypes: list[Any]) -> Any:
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
        return fn


_lib: _Lib | None = None
_lib_lock = threading.Lock()


def _library() -> _Lib:
    global _lib
    if _lib is None:
        with _lib_lock:
            if _lib is None:
                _lib = _Lib()
    return _lib


_STATUS = {
    1: "CUBLAS_STATUS_NOT_INITIALIZED",
    3: "CUBLAS_STATUS_ALLOC_FAILED",
    7: "CUBLAS_STATUS_INVALID_VALUE",
    8: "CUBLAS_STATUS_ARCH_MISMATCH",
    11: "CUBLAS_STATUS_MAPPING_ERROR",
    13: "CUBLAS_STATUS_EXECUTION_FAILED",
    14: "CUBLAS_STATUS_INTERNAL_ERROR",
    15: "CUBLAS_STATUS_NOT_SUPPORTED",
}


def _check(status: int, what: str) -> None:
    if status != 0:
        raise BlasError(f"{what} failed: {_STATUS.get(status, status)}")


# -- handles and workspaces ----------------------------------------------------------


def _workspace_bytes() -> int:
    """cuBLAS's advice: 32 MiB on Hopper and later, 4 MiB before."""
    import cupy

    major = cupy.cuda.Device().compute_capability[:-1] or "0"
    return (32 if int(major) >= 9 else 4) * 1024 * 1024


class _Handle:
    """One cuBLAS handle of this thread on one device, and the stream it is set to."""

    def __init__(self, lib: _Lib) -> None:
        h = ctypes.c_void_p()
        _check(lib.create(ctypes.byref(h)), "cublasCreate")
        self.ptr = h.value
        self.stream: int | None = None


_local = threading.local()
# Workspaces per (device, stream): work on one stream is ordered, so handles of
# different threads can share a stream's workspace, while two streams never do.
_workspaces: dict[tuple[int, int], Any] = {}


def _handle_for(lib: _Lib, stream: int) -> int:
    """This thread's handle on the current device, set to ``stream`` and its workspace."""
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    handles = getattr(_local, "handles", None)
    if handles is None:
        handles = _local.handles = {}
    h = handles.get(dev)
    if h is None:
        h = handles[dev] = _Handle(lib)
    if h.stream != stream:
        ws = _workspaces.get((dev, stream))
        if ws is None:
            size = _workspace_bytes()
            ws = _workspaces.setdefault((dev, stream), (cupy.cuda.alloc(size), size))
        # setStream resets the workspace to cuBLAS's own pool, so it comes first.
        _check(lib.set_stream(h.ptr, stream), "cublasSetStream")
        _check(lib.set_workspace(h.ptr, ws[0].ptr, ws[1]), "cublasSetWorkspace")
        h.stream = stream
    return h.ptr


# -- layouts -------------------------------------------------------------------------


def _matrix_layout(x: Any) -> tuple[int, int] | None:
    """``(op, ld)`` to read the last two dims of ``x`` as a column-major operand, or None.

    A row-major (C-ordered) r x c matrix is the column-major c x r matrix with
    ld = its row stride; a transposed view is read with op T.
    """
    r, c = x.shape[-2], x.shape[-1]
    item = x.itemsize
    sr, sc = x.strides[-2], x.strides[-1]
    if (sc == item or c == 1) and sr % item == 0 and sr // item >= max(c, 1):
        return OP_N, max(sr // item, c, 1)
    if (sr == item or r == 1) and sc % item == 0 and sc // item >= max(r, 1):
        return OP_T, max(sc // item, r, 1)
    return None


def _batch_stride(x: Any, batch: tuple[int, ...]) -> int | None:
    """The element stride between consecutive matrices of ``x`` over ``batch``, or None.

    0 when ``x`` has one matrix for the whole batch (broadcast); None when its
    batch dims cannot be walked with one stride.
    """
    xb = x.shape[:-2]
    if math.prod(xb) <= 1:
        return 0
    if tuple(xb) != batch:
        return None
    item = x.itemsize
    stride = None
    expect = None
    for size, st in zip(reversed(xb), reversed(x.strides[:-2])):
        if size == 1:
            continue
        if stride is None:
            stride = st
            expect = st * size
        elif st != expect:
            return None
        else:
            expect = st * size
    if stride is None or stride % item:
        return None
    return stride // item


def _as_operand(x: Any, batch: tuple[int, ...]) -> tuple[Any, int, int, int, bool]:
    """``(array, op, ld, batch_stride, copied)`` for ``x``, copying only when no stride walks it."""
    cupy = _cp()
    lay = _matrix_layout(x)
    bst = _batch_stride(x, batch) if lay is not None else None
    if lay is not None and bst is not None:
        return x, lay[0], lay[1], bst, False
    full = batch if math.prod(x.shape[:-2]) > 1 else ()
    x = cupy.ascontiguousarray(cupy.broadcast_to(x, (*full, *x.shape[-2:])))
    lay = _matrix_layout(x)
    assert lay is not None
    bst = _batch_stride(x, batch)
    assert bst is not None
    return x, lay[0], lay[1], bst, True


# -- the products ----------------------------------------------------------------------


def _cp() -> Any:
    import cupy

    return cupy


def _ptr(x: Any) -> int:
    return x.data.ptr


def _stream_ptr() -> int:
    import cupy

    return cupy.cuda.get_current_stream().ptr


def _dtype_name(a: Any, b: Any) -> str:
    if a.dtype != b.dtype:
        raise BlasError(f"matmul operands must share a dtype, got {a.dtype} and {b.dtype}")
    name = _NAMES.get(a.dtype)
    if name is None:
        raise BlasError(
            f"cuBLAS matmul takes float16, float32 or float64, got {a.dtype}; use cupy.matmul "
            "for it"
        )
    return name


def _out_rows(out: Any, shape: tuple[int, ...], dtype: Any) -> int:
    """The element stride between ``out``'s rows (cuBLAS's ldc) after checking it.

    ``out`` is C-contiguous, or a 2-D matrix whose rows are contiguous and further apart
    than their length (a block of columns of a wider matrix, written in place)."""
    if out.shape == shape and out.dtype == dtype:
        if out.flags.c_contiguous:
            return shape[-1] if shape else 1
        item, st = out.itemsize, out.strides
        if len(shape) == 2 and st[1] == item and st[0] % item == 0 and st[0] >= shape[1] * item:
            return st[0] // item
    raise BlasError(
        f"out must be a C-contiguous {dtype} array of shape {shape} (or a 2-D block of "
        f"columns with contiguous rows), got {out.dtype} {tuple(out.shape)} with strides "
        f"{tuple(out.strides)}"
    )


def matmul(a: Any, b: Any, out: Any = None) -> Any:
    """``a @ b`` with ``numpy.matmul`` semantics, on the current CuPy stream.

    Takes CuPy arrays of float32 or float16 (both the same); ``out``, when
    given, must be a C-contiguous array of the result's shape and dtype and
    is written in place (or a 2-D block of columns of a wider matrix, rows contiguous).
    Transposed views are read without a copy.
    """
    return gemm(a, b, out=out)


def gemm(
    a: Any,
    b: Any,
    *,
    trans_a: bool = False,
    trans_b: bool = False,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Any = None,
) -> Any:
    """``alpha * op(a) @ op(b) + beta * out``; ``op`` transposes the last two dims when asked.

    The same rules as :func:`matmul`; ``trans_a``/``trans_b`` apply to 2-D
    and batched operands alike and cost no copy. With ``beta != 0``, ``out``
    must be given and holds the addend (cuBLAS adds it in the compute type,
    so a float16 result is rounded once).

    A product's call (ops, dims, leading dims, strides, scalars) depends only on the
    operands' shapes, strides and dtypes and the arguments, so it is worked out once per
    such signature and kept (:class:`_Call`): an eager prefill makes about a hundred
    products a run, and the checks and layout logic cost more host time than the launch.
    """
    key = (
        a.shape, a.strides, a.dtype, b.shape, b.strides, b.dtype, trans_a, trans_b, alpha,
        beta, None if out is None else (out.shape, out.strides, out.dtype), tf32(),
    )  # fmt: skip
    call = _CALLS.get(key)
    if call is not None:
        return call(a, b, out)
    cupy = _cp()
    dtype = _dtype_name(a, b)
    squeeze_a = a.ndim == 1
    squeeze_b = b.ndim == 1
    if squeeze_a:
        a = a[None, :]
    if squeeze_b:
        b = b[:, None]
    if a.ndim == 0 or b.ndim == 0:
        raise BlasError("matmul does not take 0-d operands")
    if trans_a:
        a = a.swapaxes(-1, -2)
    if trans_b:
        b = b.swapaxes(-1, -2)
    m, k = a.shape[-2], a.shape[-1]
    k2, n = b.shape[-2], b.shape[-1]
    if k != k2:
        raise BlasError(
            f"matmul shapes do not match: {tuple(a.shape)} @ {tuple(b.shape)} "
            f"(inner dims {k} and {k2})"
        )
    try:
        batch = tuple(int(d) for d in _broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    except ValueError:
        raise BlasError(
            f"matmul batch dims do not broadcast: {tuple(a.shape)} @ {tuple(b.shape)}"
        ) from None
    full_shape = (*batch, m, n)
    shape = full_shape
    if squeeze_a:
        shape = (*batch, n) if not squeeze_b else tuple(batch)
    elif squeeze_b:
        shape = (*batch, m)
    ldc = n
    if out is None:
        if beta != 0.0:
            raise BlasError("gemm with beta != 0 needs out, holding the addend")
        out = cupy.empty(shape, dtype=a.dtype)
    else:
        ldc = _out_rows(out, shape, a.dtype)
    c = out.reshape(full_shape) if ldc == n else out  # a block of columns is 2-D already
    count = math.prod(batch)
    if count == 0 or m == 0 or n == 0:
        return out
    if k == 0:
        if beta == 0.0:
            c.fill(0)
        elif beta != 1.0:
            c *= beta
        return out

    # A stack of row-major matrices times one matrix is one tall product.
    if batch and math.prod(b.shape[:-2]) <= 1 and a.flags.c_contiguous and not trans_a:
        a = a.reshape(count * m, k)
        m, count, batch = count * m, 1, ()
    if max(m, n, k) > _INT_MAX:
        raise BlasError(f"matmul dims ({m}, {n}, {k}) exceed cuBLAS's 32-bit limit")

    lib = _library()
    handle = _handle_for(lib, _stream_ptr())
    code = _DTYPE_CODE[dtype]
    scalar = _SCALAR[dtype]
    alpha_c = _CONSTANTS.get((scalar, alpha))
    alpha_c = scalar(alpha) if alpha_c is None else alpha_c
    beta_c = _CONSTANTS.get((scalar, beta))
    beta_c = scalar(beta) if beta_c is None else beta_c
    alpha_p, beta_p = ctypes.addressof(alpha_c), ctypes.addressof(beta_c)
    compute = _COMPUTE_32F_FAST_TF32 if dtype == "float32" and key[-1] else _COMPUTE[dtype]
    a2, op_a, lda, sa, copied_a = _as_operand(a, batch)
    b2, op_b, ldb, sb, copied_b = _as_operand(b, batch)
    if not (copied_a or copied_b) and len(_CALLS) < _CALLS_KEPT:
        # Views only: a2, b2 and c start where a, b and out do, so a later call of this
        # signature passes their pointers straight through.
        args = (op_b, op_a, n, m, k, alpha_p, code, ldb, sb, lda, sa, beta_p, ldc, count)
        _CALLS[key] = _Call(args, compute, shape, a.dtype, (alpha_c, beta_c))
    # Row-major C = A @ B is column-major C^T = B^T @ A^T: B comes first.
    if count == 1:
        status = lib.gemm_ex(
            handle,
            op_b,
            op_a,
            n,
            m,
            k,
            alpha_p,
            _ptr(b2),
            code,
            ldb,
            _ptr(a2),
            code,
            lda,
            beta_p,
            _ptr(c),
            code,
            ldc,
            compute,
            _GEMM_DEFAULT,
        )
        _check(status, "cublasGemmEx")
    else:
        status = lib.gemm_strided_batched_ex(
            handle,
            op_b,
            op_a,
            n,
            m,
            k,
            alpha_p,
            _ptr(b2),
            code,
            ldb,
            sb,
            _ptr(a2),
            code,
            lda,
            sa,
            beta_p,
            _ptr(c),
            code,
            n,
            m * n,
            count,
            compute,
            _GEMM_DEFAULT,
        )
        _check(status, "cublasGemmStridedBatchedEx")
    del alpha_c, beta_c  # kept alive until the call returned
    return out


class _Call:
    """One product signature's cuBLAS call, pointers and stream aside (see :func:`gemm`)."""

    __slots__ = ("args", "compute", "shape", "dtype", "keep")

    def __init__(self, args, compute, shape, dtype, keep) -> None:
        self.args, self.compute = args, compute
        self.shape, self.dtype, self.keep = shape, dtype, keep  # keep: the scalars alive

    def __call__(self, a: Any, b: Any, out: Any) -> Any:
        if out is None:
            out = _cp().empty(self.shape, dtype=self.dtype)
        op_b, op_a, n, m, k, alpha_p, code, ldb, sb, lda, sa, beta_p, ldc, count = self.args
        lib = _library()
        handle = _handle_for(lib, _stream_ptr())
        pa, pb, pc = _ptr(a), _ptr(b), _ptr(out)
        if count == 1:
            status = lib.gemm_ex(
                handle, op_b, op_a, n, m, k, alpha_p, pb, code, ldb, pa, code, lda, beta_p,
                pc, code, ldc, self.compute, _GEMM_DEFAULT,
            )  # fmt: skip
            _check(status, "cublasGemmEx")
        else:
            status = lib.gemm_strided_batched_ex(
                handle, op_b, op_a, n, m, k, alpha_p, pb, code, ldb, sb, pa, code, lda, sa,
                beta_p, pc, code, n, m * n, count, self.compute, _GEMM_DEFAULT,
            )  # fmt: skip
            _check(status, "cublasGemmStridedBatchedEx")
        return out


#: Product signatures -> their calls; bounded, as shapes may vary without end.
_CALLS: dict[tuple, _Call] = {}
_CALLS_KEPT = 4096


def kept_calls() -> int:
    """How many product signatures have a kept call."""
    return len(_CALLS)


def _broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    return np.broadcast_shapes(*shapes)
