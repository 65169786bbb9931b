"""LpNormalization on CUDA: one ``lp_normalize`` launch per node for float32/float16.

X divided by its L1 or L2 norm along ``axis``, the norm accumulated in
float32 and a zero norm giving 0, as on the CPU
(``providers/ops/op_lp_normalization.py``). Along the last axis (the hybrid
decoders' per-head L2 norm of q and k) a warp or a block normalises each
row; along another axis a thread walks each column. Other dtypes run the
generic kernel on the device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops import op_lp_normalization as generic
from onnxep.providers.ops.reduce import norm_axis

from . import reduce_cuda as K
from .hybrid_cuda import (
    FLAT_BLOCK,
    FLOATS,
    contiguity_test,
    hybrid_kernel,
    rows_geometry,
    type_bits,
)

_OP = "LpNormalization"


@dataclass(frozen=True)
class LpLaunch:
    grid: tuple[int]
    block: tuple[int]
    args: tuple  # after the two pointers
    empty: bool


def plan_lp(shape: tuple[int, ...], dtype: np.dtype, axis: int, p: np.int32) -> LpLaunch | None:
    """The launch for one input, or None for the generic kernel (another dtype, 0-d)."""
    if dtype not in FLOATS or not shape:
        return None  # the generic kernel (which refuses a 0-d input)
    a = norm_axis(axis, len(shape), _OP)
    outer, n, inner = math.prod(shape[:a]), shape[a], math.prod(shape[a + 1 :])
    if inner == 1:
        geo = rows_geometry(outer, n)
        if geo is None:
            raise ValueError(f"{_OP}: {outer} rows exceed the CUDA grid limit")
        grid, block, tpr = geo
    else:
        grid, block, tpr = (-(-(outer * inner) // FLAT_BLOCK),), (FLAT_BLOCK,), np.int32(0)
        if grid[0] > K.MAX_GRID:
            raise ValueError(f"{_OP}: {outer * inner} columns exceed the CUDA grid limit")
    i64 = np.int64
    args = (i64(outer), i64(n), i64(inner), p, tpr, type_bits(dtype))
    return LpLaunch(grid, block, args, math.prod(shape) == 0)


@kernel(_OP, since=(1, 22))
def lp_normalization(node: NodeInfo, xp: Any):
    fallback = generic.lp_normalization(node, xp)  # checks p
    dt = node.input_dtype(0)
    if dt is not None and np.dtype(dt) not in FLOATS:
        return fallback
    axis = int(node.attr("axis", -1))
    p = int(node.attr("p", 2))
    if p not in (1, 2):  # the generic builder refuses these already; kept for the kernel's sake
        raise NotSupported(f"{_OP}: p={p}; the spec allows only 1 or 2")
    fn = hybrid_kernel("lp_normalize")
    plans = K.PlanCache(lambda shape, dtype: plan_lp(shape, dtype, axis, np.int32(p)))
    is_contiguous = contiguity_test(xp)

    def run(x):
        plan = plans(x.shape, x.dtype)
        if plan is None:
            return fallback(x)
        if not is_contiguous(x):
            x = xp.ascontiguousarray(x)
        y = xp.empty(x.shape, x.dtype)
        if not plan.empty:
            fn(plan.grid, plan.block, (x, y, *plan.args))
        return (y,)

    return run
