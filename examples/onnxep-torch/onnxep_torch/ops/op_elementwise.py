"""Elementwise ops whose generic kernels use NumPy-only spellings."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from onnxep.errors import NotSupported
from onnxep.providers import NodeInfo, kernel

from .common import FLOATS, INTS, NUMERIC, no_legacy_broadcast, torch_dtype


@kernel("Cast", since=1)
def cast(node: NodeInfo, xp: Any):
    to = node.attr("to")
    if isinstance(to, str):
        raise NotSupported(f"Cast: opset {node.opset} string 'to' is not supported on torch")
    dt = torch_dtype(node, int(to))
    return lambda x: (x.to(dt),)


@kernel("CastLike", since=1)
def cast_like(node: NodeInfo, xp: Any):
    return lambda x, like: (x.to(like.dtype),)


@kernel("Div", since=1, dtypes={0: NUMERIC, 1: NUMERIC})
def div(node: NodeInfo, xp: Any):
    no_legacy_broadcast(node)

    def run(a: torch.Tensor, b: torch.Tensor):
        if a.dtype.is_floating_point:
            return (torch.div(a, b),)
        # ONNX integer division truncates toward zero, like C.
        return (torch.div(a, b, rounding_mode="trunc"),)

    return run


@kernel("Pow", since=1, dtypes={0: FLOATS, 1: [*FLOATS, *INTS]})
def pow_(node: NodeInfo, xp: Any):
    no_legacy_broadcast(node)
    # The result keeps the base's dtype whatever the exponent's.
    return lambda x, y: (torch.pow(x, y.to(x.dtype)),)


@kernel("Erf", since=1, dtypes=FLOATS)
def erf(node: NodeInfo, xp: Any):
    return lambda x: (torch.erf(x),)


@kernel("Gelu", since=1, dtypes=FLOATS)
def gelu(node: NodeInfo, xp: Any):
    approximate = node.attr("approximate", "none")
    if isinstance(approximate, bytes):
        approximate = approximate.decode()
    return lambda x: (F.gelu(x, approximate=approximate),)


@kernel("Mean", since=1, dtypes=FLOATS)
def mean(node: NodeInfo, xp: Any):
    no_legacy_broadcast(node)

    def run(*xs: torch.Tensor):
        total = xs[0]
        for x in xs[1:]:
            total = total + x
        return (total / len(xs),)

    return run


@kernel("PRelu", since=1, dtypes=FLOATS)
def prelu(node: NodeInfo, xp: Any):
    no_legacy_broadcast(node)
    return lambda x, slope: (torch.where(x < 0, x * slope, x),)


@kernel("Shrink", since=1, dtypes=FLOATS)
def shrink(node: NodeInfo, xp: Any):
    lambd = float(node.attr("lambd", 0.5))
    bias = float(node.attr("bias", 0.0))

    def run(x: torch.Tensor):
        zero = torch.zeros((), dtype=x.dtype)
        return (torch.where(x < -lambd, x + bias, torch.where(x > lambd, x - bias, zero)),)

    return run


@kernel("Dropout", since=1, host_inputs=(1, 2))
def dropout(node: NodeInfo, xp: Any):
    # Only inference: a training-mode Dropout draws NumPy's random numbers,
    # which torch cannot reproduce.
    if node.opset < 7 and not node.attr("is_test", 0):
        raise NotSupported("Dropout: training mode (is_test=0) is not supported on torch")
    if node.has_input(2):
        mode = node.const_input(2)
        if mode is None or bool(mode):
            raise NotSupported("Dropout: training mode is not supported on torch")

    n = node.num_outputs

    def run(x: torch.Tensor, ratio: Any = None, training: Any = None):
        mask = torch.ones(x.shape, dtype=torch.bool, device=x.device)
        return (x.clone(), mask)[:n]

    return run
