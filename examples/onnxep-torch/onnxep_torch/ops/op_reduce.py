"""The Reduce* family, ArgMax and ArgMin on torch.

Axes come from the ``axes`` attribute before opset 13 (ReduceSum) or 18 (the
others), from a host-memory input after. torch reduces several dims at once
for most ops; empty inputs get the reduction's identity, as ONNX asks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from onnxep.errors import NotSupported
from onnxep.providers import NodeInfo, kernel

from .common import FLOATS, NUMERIC, ints, norm_axes


def _prod(x: torch.Tensor, dims: list[int], keep: bool) -> torch.Tensor:
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, dim=d, keepdim=True)
    return x if keep else x.squeeze(dims) if dims else x


def _sum(x, dims, keep):
    return torch.sum(x, dim=dims, keepdim=keep)


#: op -> (reduce(x, dims, keepdim), value for an empty reduction, float only)
_OPS: dict[str, tuple[Callable[..., torch.Tensor], float, bool]] = {
    "ReduceSum": (_sum, 0.0, False),
    "ReduceMean": (lambda x, d, k: torch.mean(x, dim=d, keepdim=k), math.nan, True),
    "ReduceMax": (lambda x, d, k: torch.amax(x, dim=d, keepdim=k), -math.inf, False),
    "ReduceMin": (lambda x, d, k: torch.amin(x, dim=d, keepdim=k), math.inf, False),
    "ReduceProd": (_prod, 1.0, False),
    "ReduceL1": (lambda x, d, k: _sum(torch.abs(x), d, k), 0.0, False),
    "ReduceL2": (lambda x, d, k: torch.sqrt(_sum(x * x, d, k)), 0.0, True),
    "ReduceSumSquare": (lambda x, d, k: _sum(x * x, d, k), 0.0, False),
    "ReduceLogSum": (lambda x, d, k: torch.log(_sum(x, d, k)), -math.inf, True),
    "ReduceLogSumExp": (lambda x, d, k: torch.logsumexp(x, dim=d, keepdim=k), -math.inf, True),
}


def _make(op: str, axes_input_since: int):
    reduce, empty_value, float_only = _OPS[op]

    def builder(node: NodeInfo, xp: Any):
        keep = bool(node.attr("keepdims", 1))
        noop = bool(node.attr("noop_with_empty_axes", 0))
        from_input = node.opset >= axes_input_since
        attr_axes = None if from_input else node.attr("axes", None)
        dt = node.input_dtype(0)
        if float_only and dt is not None and dt.kind != "f":
            raise NotSupported(f"{op}: integer inputs are not supported on torch")

        def run(x: torch.Tensor, axes: Any = None):
            given = ints(axes) if from_input and axes is not None else attr_axes
            if not given:
                if noop and from_input:
                    return (x.clone(),)
                dims = list(range(x.ndim))
            else:
                dims = norm_axes(list(given), x.ndim)
            if x.ndim == 0:
                return (x.clone(),)
            if x.numel() == 0:
                shape = [
                    1 if i in dims else n for i, n in enumerate(x.shape) if keep or i not in dims
                ]
                fill = empty_value
                if x.dtype == torch.bool:
                    fill = fill > 0
                elif not x.dtype.is_floating_point and math.isinf(fill):
                    info = torch.iinfo(x.dtype)
                    fill = info.min if fill < 0 else info.max
                return (torch.full(shape, fill, dtype=x.dtype, device=x.device),)
            return (reduce(x, dims, keep).to(x.dtype),)

        return run

    return builder


def _register(op: str, since: int, types: list[str]):
    # One builder serves every version; the axes input index 1 is read on the host.
    return kernel(op, since=1, dtypes={0: types}, host_inputs=(1,))(_make(op, since))


reduce_sum = _register("ReduceSum", 13, NUMERIC)
reduce_mean = _register("ReduceMean", 18, FLOATS)
reduce_max = _register("ReduceMax", 18, [*NUMERIC, "bool"])
reduce_min = _register("ReduceMin", 18, [*NUMERIC, "bool"])
reduce_prod = _register("ReduceProd", 18, NUMERIC)
reduce_l1 = _register("ReduceL1", 18, NUMERIC)
reduce_l2 = _register("ReduceL2", 18, FLOATS)
reduce_sum_square = _register("ReduceSumSquare", 18, NUMERIC)
reduce_log_sum = _register("ReduceLogSum", 18, FLOATS)
reduce_log_sum_exp = _register("ReduceLogSumExp", 18, FLOATS)


def _arg(op: str, fn: Callable[..., torch.Tensor]):
    def builder(node: NodeInfo, xp: Any):
        axis = int(node.attr("axis", 0))
        keep = bool(node.attr("keepdims", 1))
        last = bool(node.attr("select_last_index", 0))

        def run(x: torch.Tensor):
            a = axis + x.ndim if axis < 0 else axis
            if last:
                # torch returns the first extreme; flipping finds the last one.
                i = fn(torch.flip(x, dims=[a]), dim=a, keepdim=keep)
                return (x.shape[a] - 1 - i,)
            return (fn(x, dim=a, keepdim=keep),)

        return run

    return kernel(op, since=1, dtypes={0: NUMERIC})(builder)


arg_max = _arg("ArgMax", torch.argmax)
arg_min = _arg("ArgMin", torch.argmin)
