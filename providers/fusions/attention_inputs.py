"""What feeds an attention's two MatMuls, traced back to the tensors the fused op takes.

Exporters put optional glue between the projections and the score MatMul: a
constant scale on q and on kᵀ (torch's SDPA splits ``1/sqrt(d)`` into two
square roots), the transpose of K written as a Transpose or as a rank-3
Reshape -> Transpose -> Reshape, and GQA's K/V heads repeated from ``Hkv`` to
``Hq`` by Unsqueeze -> Expand -> Reshape. The fused op reads the tensors
before that glue (the scale goes into its attribute, the repeat into its
head-group broadcast).

Walked by hand rather than matched as part of the pattern: none of this glue
has to disappear for the fused node to be right. The fused node reads the
values before it; the glue that nothing else reads is dropped afterwards, and
glue that something else still reads (a Shape of the repeated keys feeding an
unrelated reshape, say) stays for that reader. A pattern would have to remove
it all and would refuse the whole attention whenever one of these values had
another reader. Each step is taken only when it is proved from constants and
statically known (or symbolically equal) dims; otherwise the walk stops and
the fused op reads the value as it is, which is always right. The fusion pass
removes the glue that nothing reads any more.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir

from . import rule_checks as C


def _producer(v: ir.Value | None, op_type: str) -> ir.Node | None:
    p = None if v is None else v.producer()
    if p is None or p.domain not in ("", "ai.onnx") or p.op_type != op_type:
        return None
    return p


def peel_scale(v: ir.Value) -> tuple[ir.Value, float]:
    """``v`` before every Mul or Div by a constant scalar above it, and their product."""
    scale = 1.0
    while (p := _producer(v, "Mul") or _producer(v, "Div")) is not None and len(p.inputs) == 2:
        a, b = p.inputs
        if p.op_type == "Mul" and C.scalar(a) is not None and C.scalar(b) is None:
            a, b = b, a
        s = C.scalar(b)
        if a is None or s is None or not np.isfinite(s) or s == 0:
            break
        if a.dtype != v.dtype or C.rank(a) is None or C.rank(a) != C.rank(v):
            break  # the constant broadcast the operand to another rank
        scale *= s if p.op_type == "Mul" else 1.0 / s
        v = a
    return v, scale


def _perm(node: ir.Node) -> list[int] | None:
    a = node.attributes.get("perm")
    return None if a is None else list(a.value)


@dataclass
class Key:
    """K as the fused op reads it: ``value``, transposed by ``perm`` first when not None, and
    the constant scale peeled off it."""

    value: ir.Value
    perm: list[int] | None
    scale: float


def key_of(kt: ir.Value) -> Key:
    """K in ``[B, H, S, D]`` for the right operand ``kt`` (``[B, H, D, S]``) of the score MatMul."""
    v, scale = peel_scale(kt)
    t = _producer(v, "Transpose")
    if t is not None and C.rank(t.inputs[0]) == 4 and _perm(t) in ([0, 1, 3, 2], [0, 2, 3, 1]):
        k, inner = peel_scale(t.inputs[0])
        perm = None if _perm(t) == [0, 1, 3, 2] else [0, 2, 1, 3]  # [0, 2, 3, 1]: K is BSHD
        return Key(k, perm, scale * inner)
    k3 = _rank3_transposed(v)
    if k3 is not None:
        k, inner = peel_scale(k3)
        return Key(k, None, scale * inner)
    return Key(v, [0, 1, 3, 2], scale)


def _rank3_transposed(v: ir.Value) -> ir.Value | None:
    """K for ``v = Reshape(Transpose(Reshape(K, [*, S, D]), [0, 2, 1]), [B, H, D, S])``."""
    outer = _producer(v, "Reshape")
    mid = None if outer is None else outer.inputs[0]
    t = None if mid is None else _producer(mid, "Transpose")
    if t is None or _perm(t) != [0, 2, 1]:
        return None
    flat = t.inputs[0]
    inner = _producer(flat, "Reshape")
    if inner is None or C.rank(inner.inputs[0]) != 4:
        return None
    k = inner.inputs[0]
    s, d = Dim(k, 2), Dim(k, 3)
    first = reshaped_dims(inner, flat)
    if first is None or len(first) != 3 or not (first[1] == s and first[2] == d):
        return None
    second = reshaped_dims(outer, v)
    want = [Dim(k, 0), Dim(k, 1), d, s]
    if second is None or len(second) != 4:
        return None
    unknown = [i for i in range(4) if not second[i] == want[i]]
    if len(unknown) > 1 or (unknown and second[unknown[0]] != -1):
        return None  # one -1 among otherwise proved dims can only be that dim
    return k


def repeated_heads(v: ir.Value) -> tuple[ir.Value, Any] | None:
    """For ``v = Reshape(Expand(Unsqueeze(x, 2), [., ., n, ., .]), [B, Hkv*n, S, D])`` (the
    head repeat of GQA: query head ``h`` reads ``x``'s head ``h // n``): ``x`` and ``n`` (an
    int or a symbolic dim; when not known, the Expand's shape tensor); else None."""
    r = _producer(v, "Reshape")
    e = None if r is None else _producer(r.inputs[0], "Expand")
    u = None if e is None else _producer(e.inputs[0], "Unsqueeze")
    if u is None:
        return None
    x = u.inputs[0]
    if C.rank(x) != 4 or _unsqueeze_axes(u) not in ([2], [-3]):
        return None
    kept = {0: 0, 1: 1, 3: 2, 4: 3}  # expanded axis -> x's axis
    expanded = e.outputs[0]
    entries = shape_tensor(e.inputs[1]) if len(e.inputs) > 1 else None
    if entries is not None and len(entries) != 5:
        return None
    for a, xa in kept.items():
        by_shape = entries is not None and (entries[a] == 1 or entries[a] == Dim(x, xa))
        if not by_shape and not Dim(expanded, a) == Dim(x, xa):
            return None
    target = reshaped_dims(r, v)
    if target is None or len(target) != 4 or not all(target[a] == Dim(x, a) for a in (0, 2, 3)):
        return None  # with those equal, the one left is Hkv * n: axes 1 and 2 merged
    n = C.dim(expanded, 2)
    if n is None and entries is not None and isinstance(entries[2], int) and entries[2] > 0:
        n = entries[2]
    # Unknown, two repeats still read the same count from one shape tensor.
    return x, (n if n is not None else e.inputs[1])


def _unsqueeze_axes(u: ir.Node) -> list[int] | None:
    if "axes" in u.attributes:
        return list(u.attributes["axes"].value)
    arr = C.const(u.inputs[1]) if len(u.inputs) > 1 else None
    return None if arr is None else [int(a) for a in arr.reshape(-1)]


class Dim:
    """Dim ``axis`` of ``value``: equal to another when both are the same statically known
    dim (an int, or a symbolic dim of the same name) or the same axis of the same value."""

    def __init__(self, value: ir.Value, axis: int) -> None:
        self.value, self.axis = value, axis
        self.known = C.dim(value, axis)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Dim):
            if other.value is self.value and other.axis == self.axis:
                return True
            return self.known is not None and self.known == other.known
        if isinstance(other, int) and not isinstance(other, bool):
            return self.known == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


def reshaped_dims(reshape: ir.Node, out: ir.Value) -> list[Any] | None:
    """A Reshape's output dims, each proved equal to a dim either by the output's static shape
    or by the target tensor's entry (constants, and dims gathered from Shape): an int, a
    :class:`Dim` or an :class:`Either` of the two; None when neither is known."""
    r = C.rank(out)
    target = shape_tensor(reshape.inputs[1]) if len(reshape.inputs) > 1 else None
    allow = reshape.attributes.get("allowzero")
    copies = allow is None or allow.value == 0
    if target is not None and (
        (r is not None and len(target) != r)
        or (copies and any(isinstance(d, int) and d == 0 for d in target))
    ):
        target = None  # a 0 that copies an input dim: not worth proving here
    if r is None:
        return target
    static = [Dim(out, a) for a in range(r)]
    return static if target is None else [Either(a, b) for a, b in zip(static, target)]


class Either:
    """Equal to what either of two descriptions of one dim is equal to."""

    def __init__(self, a: Any, b: Any) -> None:
        self.a, self.b = a, b

    def __eq__(self, other: object) -> bool:
        return bool(self.a == other or self.b == other)

    __hash__ = None  # type: ignore[assignment]


def shape_tensor(v: ir.Value, depth: int = 0) -> list[Any] | None:
    """The entries of a 1-D int64 shape tensor, each an int or a :class:`Dim`, or None."""
    if depth > 8:
        return None
    arr = C.const(v)
    if arr is not None:
        return [int(a) for a in arr.reshape(-1)] if arr.ndim <= 1 else None
    p = v.producer()
    if p is None or p.domain not in ("", "ai.onnx"):
        return None
    if p.op_type == "Shape":
        x, r = p.inputs[0], C.rank(p.inputs[0])
        if r is None:
            return None
        start = _int_attr(p, "start", 0)
        end = _int_attr(p, "end", r)
        return [Dim(x, a) for a in range(r)][slice(start, end)]
    if p.op_type == "Concat":
        parts = [shape_tensor(i, depth + 1) for i in p.inputs]
        return None if any(q is None for q in parts) else [d for q in parts for d in q]
    if p.op_type in ("Slice", "Gather", "Unsqueeze", "Squeeze", "Reshape", "Identity"):
        src = shape_tensor(p.inputs[0], depth + 1)
        return None if src is None else _select(p, src)
    return None


def _int_attr(node: ir.Node, name: str, default: int) -> int:
    a = node.attributes.get(name)
    return default if a is None else int(a.value)


def _select(p: ir.Node, src: list[Any]) -> list[Any] | None:
    """What a Slice or Gather over axis 0 (or a reshape of a 1-element list) keeps of ``src``."""
    if p.op_type == "Slice":
        args = [C.const(i) if i is not None else None for i in p.inputs[1:]]
        if len(args) < 2 or args[0] is None or args[1] is None:
            return None
        axes = args[2] if len(args) > 2 else None
        steps = args[3] if len(args) > 3 else None
        if (axes is not None and [int(a) for a in axes.reshape(-1)] not in ([0], [-1])) or (
            steps is not None and [int(s) for s in steps.reshape(-1)] != [1]
        ):
            return None
        start, end = int(args[0].reshape(-1)[0]), int(args[1].reshape(-1)[0])
        return src[slice(start, min(end, len(src)) if end >= 0 else end)]
    if p.op_type == "Gather":
        idx = C.const(p.inputs[1])
        if idx is None or _int_attr(p, "axis", 0) != 0:
            return None
        try:
            return [src[int(i)] for i in idx.reshape(-1)]
        except IndexError:
            return None
    return src if len(src) == 1 or p.op_type == "Identity" else None
