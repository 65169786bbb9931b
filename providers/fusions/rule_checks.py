"""Small checks the fusion rules share: dtypes, constants, ranks, with a reason when they fail.

Each check returns ``None`` when it holds and the reason otherwise, so a rule's
``check`` reads as a list of conditions; :func:`verdict` turns the first reason
into the ``MatchResult`` onnxscript expects (the reason is what the placement
report shows for a refused match).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

FLOATS = frozenset(
    {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE}
)


def verdict(*reasons: str | None) -> pattern.MatchResult:
    """A successful match result, or a failed one carrying the first reason given."""
    result = pattern.MatchResult()
    for reason in reasons:
        if reason:
            return result.fail(reason)
    return result


def dtype_name(v: ir.Value | None) -> str:
    dt = None if v is None else v.dtype
    return "an unknown dtype" if dt is None else dt.name.lower()


def floats(*values: ir.Value | None) -> str | None:
    """All values share one float dtype (known statically)."""
    dts = {None if v is None else v.dtype for v in values}
    if len(dts) != 1:
        return "operands of different dtypes: " + ", ".join(dtype_name(v) for v in values)
    (dt,) = dts
    if dt not in FLOATS:
        return f"dtype {dtype_name(values[0])} is not a float type"
    return None


def const(v: ir.Value | None) -> np.ndarray | None:
    """The value of a constant (initializer or Constant output), else None."""
    if v is None or v.is_graph_input():
        return None
    tensor = ir.convenience.get_const_tensor(v)
    return None if tensor is None else tensor.numpy()


def const_shape(v: ir.Value | None) -> tuple[int, ...] | None:
    """The shape of a constant, read without converting its data (weights can be large)."""
    if v is None or v.is_graph_input():
        return None
    tensor = ir.convenience.get_const_tensor(v)
    return None if tensor is None else tuple(int(d) for d in tensor.shape)


def scalar(v: ir.Value | None) -> float | None:
    """The single number a constant holds (any shape of size 1), else None."""
    arr = const(v)
    if arr is None or arr.size != 1 or arr.dtype.kind not in "fiu":
        return None
    return float(arr.reshape(()))


def rank(v: ir.Value | None) -> int | None:
    return None if v is None or v.shape is None else len(v.shape)


def dim(v: ir.Value | None, axis: int) -> Any:
    """The statically known dim ``axis`` of ``v`` (an int or a symbolic name), else None."""
    if v is None or v.shape is None or not -len(v.shape) <= axis < len(v.shape):
        return None
    d = v.shape[axis]
    return d if isinstance(d, int) else (d.value if d.value is not None else None)


def same_shape(a: ir.Value, b: ir.Value) -> str | None:
    """Both shapes known and equal dim by dim (symbolic dims by name)."""
    if a.shape is None or b.shape is None:
        return "operand shapes are not known"
    if len(a.shape) != len(b.shape):
        return "operands of different ranks"
    for k in range(len(a.shape)):
        da, db = dim(a, k), dim(b, k)
        if da is None or da != db:
            return "operand shapes are not known to be equal"
    return None


def vector_over_last_axis(vec: ir.Value, of: ir.Value, what: str) -> str | None:
    """``vec`` is 1-D with as many elements as ``of``'s last dim (where that is known)."""
    if rank(vec) != 1:
        return f"the {what} is not a 1-D vector"
    n, m = dim(vec, 0), dim(of, -1)
    if n is not None and m is not None and n != m:
        return f"the {what} has {n} elements for a last axis of {m}"
    return None


def last_axis(node: ir.Node, x: ir.Value, attr: str = "axis", default: int = -1) -> bool:
    """Whether ``node``'s single-axis attribute names ``x``'s last axis."""
    a = node.attributes.get(attr)
    axis = default if a is None else a.value
    r = rank(x)
    return axis == -1 or (r is not None and axis == r - 1)


def near(v: ir.Value | None, target: float, like: ir.Value) -> str | None:
    """``v`` is a constant scalar of ``like``'s dtype equal to ``target`` at that dtype's
    precision (exporters write constants rounded: 0.7978846, or 1.4140625 in float16)."""
    value = scalar(v)
    if value is None or v.dtype != like.dtype:
        return f"a constant is not a {dtype_name(like)} scalar near {target:g}"
    eps = float(np.finfo(like.dtype.numpy()).eps) if like.dtype in FLOATS else 0.0
    if abs(value - target) > max(1e-5, 4 * eps) * abs(target):
        return f"a constant is {value:g}, not {target:g}"
    return None
