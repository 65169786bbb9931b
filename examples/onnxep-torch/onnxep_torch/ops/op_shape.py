"""Shape and indexing ops on torch: Transpose, Expand, Slice, Gather, GatherElements,
ConstantOfShape, Range, NonZero.

Shapes, starts, ends, axes and steps are host-memory inputs, so they arrive
as NumPy arrays and never make the device wait.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from onnxep.providers import NodeInfo, kernel

from .common import NUMERIC, ints, torch_dtype


@kernel("Transpose", since=1)
def transpose(node: NodeInfo, xp: Any):
    perm = node.attr("perm", None)

    def run(x: torch.Tensor):
        p = list(perm) if perm else list(range(x.ndim))[::-1]
        return (x.permute(p).contiguous(),)

    return run


@kernel("Expand", since=1, host_inputs=(1,))
def expand(node: NodeInfo, xp: Any):
    def run(x: torch.Tensor, shape: Any):
        # ONNX broadcasts both ways: a 1 in ``shape`` keeps x's dim.
        out = np.broadcast_shapes(tuple(x.shape), tuple(ints(shape)))
        return (torch.broadcast_to(x, out).clone(),)

    return run


@kernel("Slice", since=1, host_inputs=(1, 2, 3, 4))
def slice_(node: NodeInfo, xp: Any):
    legacy = node.opset < 10
    if legacy:
        a_starts = list(node.attr("starts"))
        a_ends = list(node.attr("ends"))
        a_axes = node.attr("axes", None)

    def run(x, starts=None, ends=None, axes=None, steps=None):
        if legacy:
            s, e, ax, st = a_starts, a_ends, a_axes, None
        else:
            s, e = ints(starts), ints(ends)
            ax = None if axes is None else ints(axes)
            st = None if steps is None else ints(steps)
        ax = list(range(len(s))) if ax is None else ax
        st = [1] * len(s) if st is None else st
        for a, b, c, d in zip(ax, s, e, st):
            a = a + x.ndim if a < 0 else a
            # Python's slice.indices clamps exactly as ONNX does, for both signs of step.
            start, stop, step = slice(b, c, d).indices(x.shape[a])
            if step > 0:
                x = x[(slice(None),) * a + (slice(start, stop, step),)]
            else:
                idx = torch.arange(start, stop, step, device=x.device)
                x = x.index_select(a, idx)
        return (x.contiguous(),)

    return run


def _fix_negative(idx: torch.Tensor, size: int) -> torch.Tensor:
    idx = idx.long()
    return torch.where(idx < 0, idx + size, idx)


@kernel("Gather", since=1, dtypes={1: ["int32", "int64"]})
def gather(node: NodeInfo, xp: Any):
    axis = int(node.attr("axis", 0))

    def run(x: torch.Tensor, indices: torch.Tensor):
        a = axis + x.ndim if axis < 0 else axis
        idx = _fix_negative(indices, x.shape[a])
        out = torch.index_select(x, a, idx.reshape(-1))
        return (out.reshape((*x.shape[:a], *indices.shape, *x.shape[a + 1 :])),)

    return run


@kernel("GatherElements", since=1, dtypes={1: ["int32", "int64"]})
def gather_elements(node: NodeInfo, xp: Any):
    axis = int(node.attr("axis", 0))

    def run(x: torch.Tensor, indices: torch.Tensor):
        a = axis + x.ndim if axis < 0 else axis
        return (torch.gather(x, a, _fix_negative(indices, x.shape[a])),)

    return run


@kernel("ConstantOfShape", since=1, host_inputs=(0,))
def constant_of_shape(node: NodeInfo, xp: Any):
    value = node.attr("value", None)
    arr = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    dt = torch_dtype(node, _elem(arr.dtype))
    fill = arr[0].item()

    def run(shape: Any):
        return (torch.full(tuple(ints(shape)), fill, dtype=dt),)

    return run


def _elem(dtype: np.dtype) -> int:
    from onnxep.providers import elem_type

    return elem_type(dtype)


@kernel("Range", since=11, host_inputs=(0, 1, 2), dtypes={0: NUMERIC})
def range_(node: NodeInfo, xp: Any):
    def run(start: Any, limit: Any, delta: Any):
        # Computed on the host as ONNX's reference does (start + i * delta in the
        # input dtype), then moved: the values are tiny and exact that way.
        s, l, d = (np.asarray(v).reshape(()) for v in (start, limit, delta))
        n = max(int(np.ceil((l - s) / d)), 0)
        out = (s + np.arange(n, dtype=s.dtype) * d).astype(s.dtype)
        return (torch.from_numpy(np.ascontiguousarray(out)),)

    return run


@kernel("NonZero", since=9)
def non_zero(node: NodeInfo, xp: Any):
    def run(x: torch.Tensor):
        if x.ndim == 0:
            return (torch.zeros((0, int(bool(x))), dtype=torch.int64, device=x.device),)
        return (torch.nonzero(x).T.contiguous(),)

    return run


@kernel("Pad", since=2, host_inputs=(1, 2, 3))
def pad(node: NodeInfo, xp: Any):
    mode = node.attr("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    legacy = node.opset < 11
    a_pads = list(node.attr("pads", [])) if legacy else None
    a_value = float(node.attr("value", 0.0)) if legacy else 0.0

    def run(x: torch.Tensor, pads: Any = None, value: Any = None, axes: Any = None):
        p = a_pads if legacy else ints(pads)
        fill = a_value if legacy or value is None else np.asarray(value).reshape(-1)[0].item()
        ax = (
            list(range(x.ndim))
            if axes is None
            else [a + x.ndim if a < 0 else a for a in ints(axes)]
        )
        n = len(ax)
        for i, a in enumerate(ax):
            x = _pad_axis(x, a, p[i], p[i + n], mode, fill)
        return (x,)

    return run


def _pad_axis(x: torch.Tensor, a: int, before: int, after: int, mode: str, fill: Any):
    if before == 0 and after == 0:
        return x
    size = x.shape[a]
    if mode == "constant":
        pads = [0, 0] * (x.ndim - 1 - a) + [before, after]
        return F.pad(x, pads, value=fill)
    # Other modes pick source indices per output position along the axis
    # (negative pads crop), which works for any rank and dtype.
    pos = torch.arange(-before, size + after, device=x.device)
    if mode == "edge":
        idx = pos.clamp(0, size - 1)
    elif mode == "wrap":
        idx = pos % size
    elif mode == "reflect":
        period = 2 * (size - 1) if size > 1 else 1
        r = pos.abs() % period
        idx = torch.where(r >= size, period - r, r)
    else:
        raise ValueError(f"Pad: unknown mode {mode!r}")
    return x.index_select(a, idx)


@kernel("Einsum", since=12)
def einsum(node: NodeInfo, xp: Any):
    eq = node.attr("equation")
    eq = eq.decode() if isinstance(eq, bytes) else eq
    eq = eq.replace(" ", "")
    return lambda *xs: (torch.einsum(eq, *xs),)


@kernel("Hardmax", since=1)
def hardmax(node: NodeInfo, xp: Any):
    default = -1 if node.opset >= 13 else 1
    axis = int(node.attr("axis", default))

    def run(x: torch.Tensor):
        a = axis + x.ndim if axis < 0 else axis
        shape = x.shape
        if node.opset < 13:
            x = x.reshape(int(np.prod(shape[:a])), -1)
            a = 1
        hot = F.one_hot(torch.argmax(x, dim=a), x.shape[a]).movedim(-1, a).to(x.dtype)
        return (hot.reshape(shape),)

    return run
