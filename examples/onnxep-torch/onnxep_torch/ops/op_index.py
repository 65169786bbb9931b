"""Indexing ops on torch: TopK, OneHot, ScatterElements, ScatterND, DepthToSpace,
SpaceToDepth, EyeLike, GridSample.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from onnxep.errors import NotSupported
from onnxep.providers import NodeInfo, kernel

from .common import FLOATS, NUMERIC, ints, torch_dtype


@kernel("TopK", since=1, host_inputs=(1,), dtypes={0: NUMERIC})
def top_k(node: NodeInfo, xp: Any):
    axis = int(node.attr("axis", -1))
    largest = bool(node.attr("largest", 1))
    want_sorted = bool(node.attr("sorted", 1))
    k_attr = node.attr("k", None) if node.opset < 10 else None
    if not want_sorted:
        raise NotSupported("TopK: sorted=0 leaves the order open; not supported on torch")

    def run(x: torch.Tensor, k: Any = None):
        kk = int(k_attr) if k_attr is not None else ints(k)[0]
        # A stable sort keeps equal values in index order, as ONNX asks.
        values, idx = torch.sort(x, dim=axis, descending=largest, stable=True)
        return (values.narrow(axis, 0, kk).contiguous(), idx.narrow(axis, 0, kk).contiguous())

    return run


@kernel("OneHot", since=9, host_inputs=(1,))
def one_hot(node: NodeInfo, xp: Any):
    axis = int(node.attr("axis", -1))

    def run(indices: torch.Tensor, depth: Any, values: torch.Tensor):
        d = int(np.asarray(depth).reshape(-1)[0])
        idx = indices.to(torch.int64)
        idx = torch.where(idx < 0, idx + d, idx)
        valid = (idx >= 0) & (idx < d)
        hot = F.one_hot(torch.where(valid, idx, torch.zeros_like(idx)), d).bool()
        hot &= valid.unsqueeze(-1)
        a = axis + idx.ndim + 1 if axis < 0 else axis
        hot = hot.movedim(-1, a)
        return (torch.where(hot, values[1], values[0]),)

    return run


_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


def _reduction(node: NodeInfo) -> str:
    r = node.attr("reduction", "none")
    return r.decode() if isinstance(r, bytes) else r


@kernel("ScatterElements", since=11)
def scatter_elements(node: NodeInfo, xp: Any):
    axis = int(node.attr("axis", 0))
    reduction = _reduction(node)

    def run(data: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor):
        a = axis + data.ndim if axis < 0 else axis
        idx = indices.to(torch.int64)
        idx = torch.where(idx < 0, idx + data.shape[a], idx)
        if reduction == "none":
            return (data.scatter(a, idx, updates),)
        return (data.scatter_reduce(a, idx, updates, _REDUCE[reduction], include_self=True),)

    return run


@kernel("ScatterND", since=11)
def scatter_nd(node: NodeInfo, xp: Any):
    reduction = _reduction(node)

    def run(data: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor):
        out = data.clone()
        k = indices.shape[-1]
        idx = indices.to(torch.int64).reshape(-1, k)
        sizes = torch.tensor(data.shape[:k], device=idx.device)
        idx = torch.where(idx < 0, idx + sizes, idx)
        upd = updates.reshape(idx.shape[0], *data.shape[k:])
        key = tuple(idx.T)
        if reduction == "none":
            out[key] = upd
        elif reduction == "add":
            out.index_put_(key, upd, accumulate=True)
        else:
            # mul/max/min in index order, one update at a time (duplicates compound).
            for i in range(idx.shape[0]):
                at = tuple(int(v) for v in idx[i])
                if reduction == "mul":
                    out[at] = out[at] * upd[i]
                elif reduction == "max":
                    out[at] = torch.maximum(out[at], upd[i])
                else:
                    out[at] = torch.minimum(out[at], upd[i])
        return (out,)

    return run


@kernel("DepthToSpace", since=1)
def depth_to_space(node: NodeInfo, xp: Any):
    bs = int(node.attr("blocksize"))
    mode = node.attr("mode", "DCR")
    mode = mode.decode() if isinstance(mode, bytes) else mode

    def run(x: torch.Tensor):
        n, c, h, w = x.shape
        if mode == "DCR":
            y = x.reshape(n, bs, bs, c // (bs * bs), h, w).permute(0, 3, 4, 1, 5, 2)
        else:
            y = x.reshape(n, c // (bs * bs), bs, bs, h, w).permute(0, 1, 4, 2, 5, 3)
        return (y.reshape(n, c // (bs * bs), h * bs, w * bs),)

    return run


@kernel("SpaceToDepth", since=1)
def space_to_depth(node: NodeInfo, xp: Any):
    bs = int(node.attr("blocksize"))
    mode = node.attr("mode", "DCR")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    # DCR puts the block offsets before the channel in the output depth, CRD after.
    perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)

    def run(x: torch.Tensor):
        n, c, h, w = x.shape
        y = x.reshape(n, c, h // bs, bs, w // bs, bs).permute(*perm)
        return (y.reshape(n, c * bs * bs, h // bs, w // bs),)

    return run


@kernel("EyeLike", since=9)
def eye_like(node: NodeInfo, xp: Any):
    k = int(node.attr("k", 0))
    dt_attr = node.attr("dtype", None)
    dt = None if dt_attr is None else torch_dtype(node, int(dt_attr))

    def run(x: torch.Tensor):
        rows, cols = x.shape
        i = torch.arange(rows, device=x.device).reshape(-1, 1)
        j = torch.arange(cols, device=x.device).reshape(1, -1)
        return ((j - i == k).to(dt or x.dtype),)

    return run


_GRID_MODES = {
    "bilinear": "bilinear",
    "linear": "bilinear",
    "nearest": "nearest",
    "bicubic": "bicubic",
    "cubic": "bicubic",
}


@kernel("GridSample", since=16, dtypes={0: FLOATS, 1: FLOATS})
def grid_sample(node: NodeInfo, xp: Any):
    mode = node.attr("mode", "bilinear" if node.opset < 20 else "linear")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    pad = node.attr("padding_mode", "zeros")
    pad = pad.decode() if isinstance(pad, bytes) else pad
    align = bool(node.attr("align_corners", 0))
    x = node.inputs[0]
    rank = None if x is None else x.rank
    if rank not in (4, 5) or (rank == 5 and _GRID_MODES.get(mode) == "bicubic"):
        raise NotSupported(f"GridSample: rank {rank} with mode {mode!r} is not supported on torch")
    if mode not in _GRID_MODES:
        raise NotSupported(f"GridSample: mode {mode!r} is not supported on torch")

    def run(x: torch.Tensor, grid: torch.Tensor):
        y = F.grid_sample(
            x, grid.to(x.dtype), mode=_GRID_MODES[mode], padding_mode=pad, align_corners=align
        )
        return (y,)

    return run


@kernel("BitShift", since=11, dtypes={0: ["uint8"], 1: ["uint8"]})
def bit_shift(node: NodeInfo, xp: Any):
    direction = node.attr("direction")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    left = direction == "LEFT"

    def run(x: torch.Tensor, y: torch.Tensor):
        return (torch.bitwise_left_shift(x, y) if left else torch.bitwise_right_shift(x, y),)

    return run
