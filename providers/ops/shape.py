"""Shared helpers for the tensor manipulation and indexing kernels.

Host-side values (shapes, axes, pads, k) arrive as NumPy arrays; these
helpers turn them into Python ints. Tensor data stays in the provider's
namespace ``xp``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from onnxep.errors import NotSupported


def ints(value: Any) -> list[int]:
    """A host array, scalar or list as a list of Python ints."""
    if value is None:
        return []
    arr = np.asarray(value).reshape(-1)
    if arr.dtype.kind in "iu":
        return arr.tolist()  # Python ints, in one call
    return [int(v) for v in arr]


def reshaper(xp: Any) -> Any:
    """``reshape(x, shape)`` for ``xp``'s arrays: the array method on NumPy, whose
    ``np.reshape`` dispatch wrapper costs 0.6 us a call against the method's 0.2 (a
    model's Unsqueeze/Squeeze glue runs it dozens of times a run)."""
    return _method_reshape if xp is np else xp.reshape


def _method_reshape(x: Any, shape: Any) -> Any:
    return x.reshape(shape)


def scalar_int(value: Any) -> int:
    return int(np.asarray(value).reshape(-1)[0])


def norm_axis(axis: int, rank: int, op: str = "") -> int:
    """A possibly negative axis as an index in ``[0, rank)``."""
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < max(rank, 1):
        raise ValueError(f"{op}: axis {axis} out of range for rank {rank}")
    return a


def norm_axes(axes: Sequence[int], rank: int, op: str = "") -> list[int]:
    out = [norm_axis(int(a), rank, op) for a in axes]
    if len(set(out)) != len(out):
        raise ValueError(f"{op}: repeated axes {list(axes)}")
    return out


def attr_or_input_ints(node: Any, args: Sequence[Any], name: str, idx: int) -> list[int] | None:
    """Old opsets carry some lists as attributes, newer ones as inputs."""
    if idx < len(args) and args[idx] is not None:
        return ints(args[idx])
    v = node.attr(name, None)
    return None if v is None else [int(x) for x in v]


def grid(xp: Any, shape: Sequence[int], axis: int) -> Any:
    """``arange(shape[axis])`` shaped to broadcast along ``axis`` of an array of ``shape``."""
    view = [1] * len(shape)
    view[axis] = shape[axis]
    return xp.arange(shape[axis]).reshape(view)


REDUCTIONS = ("none", "add", "mul", "max", "min")


def check_reduction(op: str, reduction: str) -> str:
    if reduction not in REDUCTIONS:
        raise NotSupported(f"{op}: reduction {reduction!r} is not one of {REDUCTIONS}")
    return reduction


def _combine(xp: Any, reduction: str, a: Any, b: Any) -> Any:
    if reduction == "add":
        return a + b
    if reduction == "mul":
        return a * b
    if reduction == "max":
        return xp.maximum(a, b)
    return xp.minimum(a, b)


def scatter(xp: Any, out: Any, index: tuple, updates: Any, reduction: str = "none") -> Any:
    """``out[index] (reduction)= updates`` in place, where duplicates accumulate.

    ``index`` is a tuple of integer index arrays that broadcast to
    ``updates``' shape. Plain assignment lets the last duplicate win (ONNX
    leaves the order undefined). Reductions apply duplicates in rounds: each
    round updates positions that occur at most once in it; that path, for
    backends without ``ufunc.at`` for the reduction, reads the round count
    back to the host.
    """
    if reduction == "none":
        out[index] = updates
        return out
    full = xp.broadcast_arrays(*index, updates)
    idx, upd = full[:-1], full[-1]
    # ufunc.at where the backend has it (NumPy; CuPy for add/max/min via atomics)
    name = {"add": "add", "mul": "multiply", "max": "maximum", "min": "minimum"}[reduction]
    at = getattr(getattr(xp, name, None), "at", None)
    if at is not None:
        try:
            at(out, tuple(idx), upd)
            return out
        except (TypeError, NotImplementedError):  # e.g. extension dtypes, CuPy multiply
            pass
    flat_idx = xp.ravel_multi_index(tuple(i.reshape(-1) for i in idx), out.shape)
    upd = upd.reshape(-1)
    n = int(flat_idx.size)
    if n == 0:
        return out
    order = xp.argsort(flat_idx, kind="stable")
    sorted_idx = flat_idx[order]
    pos = xp.arange(n)
    # rank of each entry among equal indices: its distance from the run's start
    group_start = xp.searchsorted(sorted_idx, sorted_idx, side="left")
    rank = pos - group_start
    flat = out.reshape(-1)
    rounds = int(rank.max()) + 1
    for r in range(rounds):
        sel = order[rank == r]
        tgt = flat_idx[sel]
        flat[tgt] = _combine(xp, reduction, flat[tgt], upd[sel])
    return flat.reshape(out.shape)


def slice_along(axis: int, start: int | None, stop: int | None, step: int | None = None) -> tuple:
    """An index tuple that slices only ``axis``."""
    return (slice(None),) * axis + (slice(start, stop, step),)


def onnx_slice(start: int, end: int, step: int, dim: int) -> slice:
    """ONNX Slice clamping (which differs from Python's for far-negative starts)."""
    if step == 0:
        raise ValueError("Slice: step cannot be 0")
    if start < 0:
        start += dim
    if end < 0:
        end += dim
    if step > 0:
        start = min(max(start, 0), dim)
        end = min(max(end, 0), dim)
    else:
        start = min(max(start, 0), dim - 1)
        end = min(max(end, -1), dim - 1)
    return slice(start, None if end < 0 else end, step)


def string_zero(dtype: np.dtype) -> Any:
    """The pad/fill value meaning zero for ``dtype`` (empty string for strings)."""
    return "" if dtype.kind in "OUS" else 0
