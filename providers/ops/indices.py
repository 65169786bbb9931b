"""Bounds checks for index inputs: refuse out-of-range indices, count negatives from the end.

ONNX index ops take indices in ``[-d, d-1]`` along an axis of length ``d``
and call anything else an error, which onnxruntime enforces. Array libraries
do not agree on what they do with the rest: NumPy raises, CuPy wraps around
silently, and adding ``d`` to every negative index first (as the kernels once
did) turns ``-2d .. -d-1`` into valid-looking negative indices that read the
wrong row. So every kernel that takes indices from the model passes them here
first, and the error names the index the model supplied, where it sits, and
the valid range.

Cost: the check is one pass over the indices. On the host that is one
vectorised ``min`` and ``max`` (no temporaries). On a device, deciding whether
to raise needs one answer on the host, so the check is a single boolean
reduction: exactly one small device-to-host read per call, whatever the
number of axes checked. While a stream is being captured into a CUDA graph a
host read is illegal, and skipping it would leave every replay unchecked, so
the check raises there: the capture fails, and the captured runner makes the
step a seam that runs eagerly, checked, between graphs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from onnxep.providers.bounds import host_answer

__all__ = [
    "check_element_shapes",
    "check_nd_shapes",
    "checked_index_tuples",
    "checked_indices",
]


def checked_indices(
    xp: Any,
    idx: Any,
    dim: int | None,
    op: str,
    *,
    axis: int | None = None,
    name: str = "indices",
    negative: bool = True,
    extent: str | None = None,
) -> Any:
    """``idx`` with every entry checked against an axis of length ``dim``.

    Entries must lie in ``[-dim, dim-1]`` (``[0, dim-1]`` when ``negative`` is
    false; ``dim=None`` with ``negative=False`` only refuses negatives).
    Negative entries are returned counted from the end, so the result indexes
    with plain non-negative integers on any backend. ``extent`` names what the
    indices address in the message (default: the axis). Raises
    :class:`IndexError` naming the first offending entry; the executor turns
    it into a ``RunError`` naming the node.
    """
    if dim is None and negative:
        raise ValueError("checked_indices: negative indices need an axis length to count from")
    low = -dim if negative else 0
    high = dim
    if _size(idx) == 0:
        return idx
    if type(idx) is np.ndarray:  # host memory: min and max are cheap and need no transfer
        lo, hi = idx.min(), (idx.max() if high is not None else None)
        if lo < low or (high is not None and hi >= high):
            _refuse(xp, idx, low, high, op, name, extent or _axis_text(axis, dim))
        if negative and lo < 0:
            return np.where(idx < 0, idx + dim, idx)
        return idx
    bad = idx < low
    if high is not None:
        bad = bad | (idx >= high)
    if host_answer(xp, xp.any(bad), f"{op}: its index check"):
        _refuse(xp, idx, low, high, op, name, extent or _axis_text(axis, dim))
    if not negative or _unsigned(idx):
        return idx
    return xp.where(idx < 0, idx + dim, idx)


def checked_index_tuples(
    xp: Any, idx: Any, dims: Sequence[int], op: str, *, first_axis: int = 0, name: str = "indices"
) -> Any:
    """``idx[..., i]`` checked against ``dims[i]``: the index tuples of GatherND and ScatterND.

    Entry ``i`` of every tuple addresses axis ``first_axis + i``, of length
    ``dims[i]``, and must lie in ``[-dims[i], dims[i]-1]``. Returns the tuples
    with negative entries counted from the end. One reduction covers every
    axis, so a device pays one host read, not one per axis.
    """
    k = len(dims)
    if _size(idx) == 0 or k == 0:
        return idx
    if type(idx) is np.ndarray:  # host memory: min and max are cheap and need no transfer
        d = np.asarray(dims, dtype=np.int64)
        flat = idx.reshape(-1, k)
        lo, hi = flat.min(axis=0), flat.max(axis=0)
        if (lo < -d).any() or (hi >= d).any():
            _refuse_tuples(xp, idx, d, op, name, first_axis)
        if (lo < 0).any():
            return np.where(idx < 0, idx + d.astype(idx.dtype), idx)
        return idx
    d = xp.asarray(list(dims), dtype=idx.dtype)
    if host_answer(xp, xp.any((idx < -d) | (idx >= d)), f"{op}: its index check"):
        _refuse_tuples(xp, idx, np.asarray(dims, dtype=np.int64), op, name, first_axis)
    return xp.where(idx < 0, idx + d, idx)


def check_element_shapes(
    op: str, data_shape: Sequence[int], indices_shape: Sequence[int], axis: int
) -> None:
    """GatherElements/ScatterElements: indices of data's rank, no longer than data off ``axis``."""
    if len(indices_shape) != len(data_shape):
        raise ValueError(
            f"{op}: indices have rank {len(indices_shape)} but data has rank {len(data_shape)}; "
            "they must be equal"
        )
    for d, (n, m) in enumerate(zip(indices_shape, data_shape)):
        if d != axis and n > m:
            raise ValueError(
                f"{op}: indices shape {list(indices_shape)} is larger than data shape "
                f"{list(data_shape)} on axis {d} ({n} > {m}); only the indexed axis {axis} "
                "may be longer"
            )


def check_nd_shapes(
    op: str, data_shape: Sequence[int], indices_shape: Sequence[int], b: int = 0
) -> None:
    """GatherND/ScatterND: ``b`` shared batch axes, then tuples of at most ``r - b`` indices.

    An empty tuple (last axis of length 0) addresses the whole slice, as
    onnxruntime accepts.
    """
    r, q = len(data_shape), len(indices_shape)
    if q < 1:
        raise ValueError(f"{op}: indices must have rank >= 1, got a scalar")
    if not 0 <= b < min(q, r):
        raise ValueError(
            f"{op}: batch_dims {b} must be less than both ranks (data {r}, indices {q})"
        )
    if tuple(indices_shape[:b]) != tuple(data_shape[:b]):
        raise ValueError(
            f"{op}: the first {b} (batch) axes of indices {list(indices_shape)} and data "
            f"{list(data_shape)} must be equal"
        )
    k = indices_shape[-1]
    if k > r - b:
        raise ValueError(
            f"{op}: indices' last axis has length {k}; it must be at most {r - b} "
            f"(data rank {r} minus batch_dims {b})"
        )


def _size(a: Any) -> int:
    n = 1
    for s in a.shape:
        n *= int(s)
    return n


def _unsigned(a: Any) -> bool:
    return getattr(a.dtype, "kind", "i") == "u"


def _host(xp: Any, a: Any) -> np.ndarray:
    """A host copy of ``a``; only the error path calls this, so its cost does not matter."""
    asnumpy = getattr(xp, "asnumpy", None)
    return asnumpy(a) if asnumpy is not None else np.asarray(a)


def _axis_text(axis: int | None, dim: int | None) -> str:
    return f"an axis of size {dim}" if axis is None else f"axis {axis} of size {dim}"


def _range_text(low: int, dim: int | None) -> str:
    if dim is None:
        return f"valid values are {low} or more"
    if dim <= low:
        return "no value is valid there"
    return f"valid values are {low} to {dim - 1}"


def _refuse(
    xp: Any, idx: Any, low: int, dim: int | None, op: str, name: str, axis_text: str
) -> None:
    host = _host(xp, idx).astype(np.int64, copy=False)
    bad = host < low
    if dim is not None:
        bad |= host >= dim
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    value = int(host[first])
    count = int(bad.sum())
    more = f" ({count} of {host.size} entries are out of range)" if count > 1 else ""
    raise IndexError(
        f"{op}: {name} value {value} at {name}{_position(first)} is out of range for "
        f"{axis_text}: {_range_text(low, dim)}{more}"
    )


def _refuse_tuples(
    xp: Any, idx: Any, dims: np.ndarray, op: str, name: str, first_axis: int
) -> None:
    host = _host(xp, idx).astype(np.int64, copy=False)
    bad = (host < -dims) | (host >= dims)
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    value = int(host[first])
    i = first[-1]
    d = int(dims[i])
    count = int(bad.sum())
    more = f" ({count} of {host.size} entries are out of range)" if count > 1 else ""
    raise IndexError(
        f"{op}: {name} value {value} at {name}{_position(first)} is out of range for "
        f"axis {first_axis + i} of size {d}: {_range_text(-d, d)}{more}"
    )


def _position(pos: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(p) for p in pos) + "]" if pos else ""
