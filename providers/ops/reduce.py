"""Shared helpers for reductions, softmax, normalizations, losses and linear algebra.

Everything here works on the provider's array namespace ``xp`` (NumPy or
CuPy); only host metadata (dtypes, shapes, attribute values) goes through
``numpy``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import ml_dtypes
import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.dtypes import np_dtype

from .indices import checked_indices

# Half-width floats lose too much in long sums: compute in float32, round once.
_NARROW_FLOATS = frozenset(
    {np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)}
    | {
        np.dtype(getattr(ml_dtypes, n))
        for n in (
            "float8_e4m3fn",
            "float8_e4m3fnuz",
            "float8_e5m2",
            "float8_e5m2fnuz",
            "float4_e2m1fn",
            "float8_e8m0fnu",
        )
        if hasattr(ml_dtypes, n)
    }
)


def is_narrow_float(dt: Any) -> bool:
    return dt is not None and np.dtype(dt) in _NARROW_FLOATS


def compute_dtype(dt: Any) -> np.dtype:
    """The dtype arithmetic on ``dt`` runs in: float32 for narrow floats, else ``dt``."""
    dt = np.dtype(dt)
    return np.dtype(np.float32) if dt in _NARROW_FLOATS else dt


def widen(x: Any, xp: Any) -> Any:
    """``x`` in its compute dtype (a no-op for float32/float64/ints)."""
    return x.astype(xp.float32) if x.dtype in _NARROW_FLOATS else x


def is_float(dt: Any) -> bool:
    dt = np.dtype(dt)
    return dt.kind in "fc" or dt in _NARROW_FLOATS


def norm_axis(axis: int, rank: int, op: str) -> int:
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < max(rank, 1):
        raise ValueError(f"{op}: axis {axis} out of range for rank {rank}")
    return a


def norm_axes(axes: Sequence[int], rank: int, op: str) -> tuple[int, ...]:
    return tuple(sorted({norm_axis(int(a), rank, op) for a in axes}))


def stash_dtype(node: Any, x_dtype: Any) -> np.dtype:
    """Stage-one precision of the normalizations: ``stash_type``, never below X's own."""
    st = np.dtype(np_dtype(int(node.attr("stash_type", 1))))
    if x_dtype is not None and np.dtype(x_dtype) == np.float64:
        return np.dtype(np.float64)
    return compute_dtype(st)


def out_dtype(node: Any, j: int, default: Any) -> np.dtype:
    """Declared dtype of output ``j`` when the model says, else ``default``."""
    if node.has_output(j) and node.outputs[j].dtype is not None:
        return np.dtype(node.outputs[j].dtype)
    return np.dtype(default)


# --------------------------------------------------------------------------- reductions


def axes_getter(node: Any, axes_as_input: bool) -> Callable[[Any, Any], tuple[int, ...] | None]:
    """Return ``get(x, axes_input) -> axes``; ``None`` means "no reduction" (noop).

    Before the opset that moved ``axes`` to an input, it is an attribute and
    an empty/absent list means all axes.
    """
    op = node.op_type
    noop = bool(node.attr("noop_with_empty_axes", 0))
    if not axes_as_input:
        attr_axes = node.attr("axes", None)

        def get_attr(x: Any, _axes: Any) -> tuple[int, ...] | None:
            if not attr_axes:
                return tuple(range(x.ndim))
            return norm_axes(attr_axes, x.ndim, op)

        return get_attr

    def get_input(x: Any, axes: Any) -> tuple[int, ...] | None:
        vals = [] if axes is None else np.asarray(axes).reshape(-1).tolist()
        if not vals:
            return None if noop else tuple(range(x.ndim))
        return norm_axes(vals, x.ndim, op)

    return get_input


def reduced_shape(shape: Sequence[int], axes: Sequence[int], keepdims: bool) -> tuple[int, ...]:
    ax = set(axes)
    if keepdims:
        return tuple(1 if i in ax else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in ax)


def is_empty_reduction(shape: Sequence[int], axes: Sequence[int]) -> bool:
    return any(shape[a] == 0 for a in axes)


def extreme(dt: Any, high: bool) -> Any:
    """The identity of max (``high=False``: the lowest value) or min (``high=True``)."""
    dt = np.dtype(dt)
    if dt == np.bool_:
        return high
    if is_float(dt):
        return np.inf if high else -np.inf
    info = np.iinfo(dt)
    return info.max if high else info.min


# --------------------------------------------------------------------------- softmax family


def softmax(x: Any, axis: int | tuple[int, ...], xp: Any) -> Any:
    m = xp.max(x, axis=axis, keepdims=True)
    # An all -inf slice would give nan from inf - inf; its max contributes nothing.
    m = xp.where(xp.isfinite(m), m, xp.zeros((), dtype=m.dtype))
    e = xp.exp(x - m)
    return e / xp.sum(e, axis=axis, keepdims=True)


def log_softmax(x: Any, axis: int | tuple[int, ...], xp: Any) -> Any:
    m = xp.max(x, axis=axis, keepdims=True)
    m = xp.where(xp.isfinite(m), m, xp.zeros((), dtype=m.dtype))
    s = x - m
    return s - xp.log(xp.sum(xp.exp(s), axis=axis, keepdims=True))


def coerced_axes(node: Any, rank_default_axis: int) -> Callable[[int], int | tuple[int, ...]]:
    """Softmax-family axis rule: before opset 13 the input is seen as 2-D at ``axis``."""
    axis = int(node.attr("axis", rank_default_axis))
    if node.opset >= 13:
        return lambda rank: norm_axis(axis, rank, node.op_type)
    return lambda rank: tuple(range(norm_axis(axis, rank, node.op_type), rank)) if rank else ()


# --------------------------------------------------------------------------- normalization


def moments(x: Any, axes: tuple[int, ...], xp: Any) -> tuple[Any, Any]:
    """Mean and population variance over ``axes`` (kept as size-1 dims)."""
    mean = xp.mean(x, axis=axes, keepdims=True)
    d = x - mean
    return mean, xp.mean(d * d, axis=axes, keepdims=True)


def check_float_input(node: Any, i: int = 0) -> None:
    dt = node.input_dtype(i) if node.has_input(i) else None
    if dt is not None and not is_float(dt):
        raise NotSupported(
            f"{node.op_type}: input {i} has dtype {dt}; only float types are defined"
        )


# --------------------------------------------------------------------------- Reduce* ops

#: Value of each reduction over an empty set of elements (max/min resolved by dtype).
_EMPTY = {
    "sum": 0,
    "mean": np.nan,
    "prod": 1,
    "l1": 0,
    "l2": 0,
    "sumsq": 0,
    "logsum": -np.inf,
    "logsumexp": -np.inf,
}


def _elementwise(kind: str, x: Any, xp: Any) -> Any:
    """The reduction over an empty set of axes: only the per-element part remains."""
    if kind in ("l1", "l2"):
        return xp.abs(x)
    if kind == "sumsq":
        return x * x
    if kind == "logsum":
        return xp.log(x)
    return x


def _reduce(kind: str, x: Any, axes: tuple[int, ...], keep: bool, xp: Any) -> Any:
    if kind == "max":
        if x.dtype == np.bool_:
            return xp.any(x, axis=axes, keepdims=keep)
        return xp.max(x, axis=axes, keepdims=keep)
    if kind == "min":
        if x.dtype == np.bool_:
            return xp.all(x, axis=axes, keepdims=keep)
        return xp.min(x, axis=axes, keepdims=keep)
    # Integer sums stay in their own type (NumPy would widen int32 to int64).
    acc = x.dtype if x.dtype.kind in "iu" else None
    if kind == "sum":
        return xp.sum(x, axis=axes, keepdims=keep, dtype=acc)
    if kind == "prod":
        return xp.prod(x, axis=axes, keepdims=keep, dtype=acc)
    if kind == "mean":
        if xp is np and x.dtype.kind == "f":
            # np.mean's own steps, without its Python wrapper (half the time on small data):
            # the float sum in x's dtype, then one division by the count, bit for bit.
            n = 1
            for a in axes:
                n *= x.shape[a]
            return np.true_divide(np.add.reduce(x, axis=axes, keepdims=keep), n)
        return xp.mean(x, axis=axes, keepdims=keep)
    if kind == "l1":
        return xp.sum(xp.abs(x), axis=axes, keepdims=keep, dtype=acc)
    if kind == "sumsq":
        return xp.sum(x * x, axis=axes, keepdims=keep, dtype=acc)
    if kind == "l2":
        return xp.sqrt(xp.sum(x * x, axis=axes, keepdims=keep, dtype=acc))
    if kind == "logsum":
        return xp.log(xp.sum(x, axis=axes, keepdims=keep))
    if kind == "logsumexp":
        m = xp.max(x, axis=axes, keepdims=True)
        m = xp.where(xp.isfinite(m), m, xp.zeros((), dtype=m.dtype))
        s = xp.log(xp.sum(xp.exp(x - m), axis=axes, keepdims=True)) + m
        if not keep:
            s = xp.reshape(s, reduced_shape(x.shape, axes, False))
        return s
    raise AssertionError(kind)


def build_reduce(node: Any, xp: Any, kind: str, axes_input_since: int) -> Callable[..., tuple]:
    """Builder shared by every Reduce* op; ``kind`` names the reduction."""
    get_axes = axes_getter(node, node.opset >= axes_input_since)
    keep = bool(node.attr("keepdims", 1))

    def run(x: Any, axes_in: Any = None) -> tuple:
        axes = get_axes(x, axes_in)
        dt = x.dtype
        xc = widen(x, xp)
        if axes is None:
            y = _elementwise(kind, xc, xp)
        elif is_empty_reduction(x.shape, axes):
            if kind in ("max", "min"):
                fill = extreme(dt, high=kind == "min")
            else:
                fill = _EMPTY[kind]
                if not is_float(xc.dtype) and not np.isfinite(fill):
                    fill = 0  # the spec leaves this undefined for integers
            y = xp.full(reduced_shape(x.shape, axes, keep), fill, dtype=xc.dtype)
        else:
            y = _reduce(kind, xc, axes, keep, xp)
        return (xp.asarray(y).astype(dt, copy=False),)

    ufunc = _UFUNC_OF.get(kind)
    as_input = node.opset >= axes_input_since
    fixed = not as_input or not node.has_input(1) or node.const_input(1) is not None
    if xp is not np or ufunc is None or not fixed:
        return run
    # NumPy, a float32/float64 sum, mean, max or min, or an integer sum, max or min, over
    # fixed axes (an attribute or a constant input): the axes (and mean's count) are worked
    # out once per input shape and the reduction is the ufunc's own call, the same one
    # _reduce makes (2-3 us a node less; 8 -> 2 us for a decoder's int64 mask sum).
    memo: dict[tuple, tuple[tuple[int, ...], int] | None] = {}

    # integers but for mean (whose division is a float's); an integer sum keeps x's type
    plain = _PLAIN_FLOATS if kind == "mean" else _PLAIN_FLOATS | _PLAIN_INTS

    def run_fixed(x: Any, axes_in: Any = None) -> tuple:
        if x.__class__ is not np.ndarray or x.dtype not in plain:
            return run(x, axes_in)
        shape = x.shape
        hit = memo.get(shape, False)
        if hit is False:
            axes = get_axes(x, axes_in)
            hit = None
            if axes is not None and axes and not is_empty_reduction(shape, axes):
                n = 1
                for a in axes:
                    n *= shape[a]
                hit = (axes, n)
            if len(memo) < 64:
                memo[shape] = hit
        if hit is None:
            return run(x, axes_in)  # no axes, or an empty reduction: the general rules
        if kind == "sum" and x.dtype.kind != "f":
            y = ufunc.reduce(x, axis=hit[0], keepdims=keep, dtype=x.dtype)
        else:
            y = ufunc.reduce(x, axis=hit[0], keepdims=keep)
        if kind == "mean":
            y = np.true_divide(y, hit[1])
        return (y if y.__class__ is np.ndarray else np.asarray(y),)

    return run_fixed


_UFUNC_OF = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum}
_PLAIN_FLOATS = frozenset({np.dtype(np.float32), np.dtype(np.float64)})
_PLAIN_INTS = frozenset(
    np.dtype(t)
    for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
)


# --------------------------------------------------------------------------- losses


def nll_loss(
    logp: Any,
    target: Any,
    weight: Any,
    reduction: str,
    ignore_index: int | None,
    xp: Any,
    op: str = "NegativeLogLikelihoodLoss",
) -> Any:
    """Negative log-likelihood of ``target`` classes in ``logp`` (N, C, d1...)."""
    c = logp.shape[1]
    t = target.astype(xp.int64, copy=False)
    # a target names a class in [0, C); only ignore_index may lie outside
    named = t if ignore_index is None else xp.where(t == ignore_index, 0, t)
    checked_indices(xp, named, c, op, name="target", negative=False, extent=f"{c} classes")
    # Ignored targets may lie outside [0, C): clip them to a safe index, mask later.
    tc = xp.clip(t, 0, max(c - 1, 0))
    picked = xp.take_along_axis(logp, xp.expand_dims(tc, 1), axis=1)
    loss = -xp.squeeze(picked, axis=1)
    w = None
    if weight is not None:
        w = xp.take(weight.astype(loss.dtype, copy=False), tc)
    if ignore_index is not None:
        valid = t != ignore_index
        zero = xp.zeros((), dtype=loss.dtype)
        w = valid.astype(loss.dtype) if w is None else xp.where(valid, w, zero)
        loss = xp.where(valid, loss, zero)
    if w is not None:
        loss = loss * w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return xp.sum(loss)
    if reduction == "mean":
        if w is None:
            return xp.mean(loss)
        return xp.sum(loss) / xp.sum(w)
    raise ValueError(f"unknown reduction {reduction!r}")


def loss_attrs(node: Any) -> tuple[str, int | None]:
    reduction = node.attr("reduction", "mean")
    if isinstance(reduction, bytes):
        reduction = reduction.decode()
    if reduction not in ("none", "sum", "mean"):
        raise NotSupported(f"{node.op_type}: reduction {reduction!r} is not none, sum or mean")
    ii = node.attr("ignore_index", None)
    return reduction, None if ii is None else int(ii)
