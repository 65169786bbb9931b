"""MaxPool and AveragePool on torch's pooling functions.

torch pads symmetrically and by at most half a window, so other pads are
applied explicitly first (with -inf for MaxPool, zeros for AveragePool that
counts pads); configurations torch cannot express are declined.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from onnxep.errors import NotSupported
from onnxep.providers import NodeInfo, kernel

_MAX = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _setup(node: NodeInfo):
    k = list(node.attr("kernel_shape"))
    rank = len(k)
    if rank not in _MAX:
        raise NotSupported(f"{node.op_type}: {rank}-D pooling is not supported on torch")
    strides = list(node.attr("strides", [1] * rank))
    dil = list(node.attr("dilations", [1] * rank))
    auto_pad = node.attr("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    pads = list(node.attr("pads", [0] * (2 * rank)))
    ceil = bool(node.attr("ceil_mode", 0))
    return k, rank, strides, dil, auto_pad, pads, ceil


def _pairs(auto_pad, pads, shape, k, strides, dil):
    rank = len(k)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for n, kk, s, d in zip(shape, k, strides, dil):
            total = max((math.ceil(n / s) - 1) * s + (kk - 1) * d + 1 - n, 0)
            small = total // 2
            out.append(
                (small, total - small) if auto_pad == "SAME_UPPER" else (total - small, small)
            )
        return out
    if auto_pad == "VALID":
        return [(0, 0)] * rank
    return [(pads[i], pads[i + rank]) for i in range(rank)]


def _torch_ok(pairs, k, dil):
    return all(a == b and a <= ((kk - 1) * d + 1) // 2 for (a, b), kk, d in zip(pairs, k, dil))


@kernel("MaxPool", since=1, dtypes=["float", "double"])
def max_pool(node: NodeInfo, xp: Any):
    k, rank, strides, dil, auto_pad, pads, ceil = _setup(node)
    if node.num_outputs > 1 and node.has_output(1):
        raise NotSupported("MaxPool: the Indices output is not supported on torch")
    if int(node.attr("storage_order", 0)):
        raise NotSupported("MaxPool: storage_order=1 is not supported on torch")
    if ceil and auto_pad != "NOTSET":
        raise NotSupported("MaxPool: ceil_mode with auto_pad is not supported on torch")
    fn = _MAX[rank]

    def run(x: torch.Tensor):
        pairs = _pairs(auto_pad, pads, x.shape[2:], k, strides, dil)
        if _torch_ok(pairs, k, dil):
            padding = [a for a, _ in pairs]
        else:
            flat = [p for pair in reversed(pairs) for p in pair]
            x = F.pad(x, flat, value=-math.inf)
            padding = [0] * rank
        return (fn(x, k, strides, padding, dil, ceil_mode=ceil),)

    return run


@kernel("AveragePool", since=1, dtypes=["float", "double"])
def average_pool(node: NodeInfo, xp: Any):
    k, rank, strides, dil, auto_pad, pads, ceil = _setup(node)
    if any(d != 1 for d in dil):
        raise NotSupported("AveragePool: dilations are not supported on torch")
    include = bool(node.attr("count_include_pad", 0))
    fn = _AVG[rank]
    if not include or ceil:
        # Explicit padding would be counted: the pads must be ones torch takes.
        shape = node.inputs[0].static_shape if node.inputs[0] is not None else None
        if shape is None and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            raise NotSupported("AveragePool: auto_pad needs a static input shape on torch")
        pairs = _pairs(auto_pad, pads, (shape or [0] * (rank + 2))[2:], k, strides, dil)
        if not _torch_ok(pairs, k, dil):
            raise NotSupported(
                "AveragePool: asymmetric or large pads that are not counted are not "
                "supported on torch"
            )

    def run(x: torch.Tensor):
        pairs = _pairs(auto_pad, pads, x.shape[2:], k, strides, dil)
        if _torch_ok(pairs, k, dil):
            padding = [a for a, _ in pairs]
        elif include and not ceil:
            flat = [p for pair in reversed(pairs) for p in pair]
            x = F.pad(x, flat)
            padding = [0] * rank
        else:
            raise ValueError("AveragePool: asymmetric pads without count_include_pad")
        return (fn(x, k, strides, padding, ceil_mode=ceil, count_include_pad=include),)

    return run
