"""com.microsoft GatedRMSNorm on CUDA: one ``gated_rms_norm`` launch per node.

``Y = X * rsqrt(mean(X^2) + eps) * scale * act(gate)`` over each contiguous
group of ``len(scale)`` elements of the last axis (a packed ``(..., H * C)``
tensor is normalised per head), all in float32 and stored in X's type, as on
the CPU (``providers/ops/op_gated_rms_norm.py``). A warp per group of up to
256 elements, a block per longer one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from . import reduce_cuda as K
from .hybrid_cuda import (
    FLOATS,
    contiguity_test,
    contiguous,
    float_refusal,
    hybrid_kernel,
    rows_geometry,
    signature,
    type_bits,
)

_OP = "GatedRMSNorm"
_INPUTS = ("X", "scale", "gate")


@dataclass(frozen=True)
class GatedNormLaunch:
    shape: tuple[int, ...]
    dtype: np.dtype
    grid: tuple[int]
    block: tuple[int]
    args: tuple  # after the four pointers


def plan_gated_norm(sig: tuple, eps: np.float32, silu: np.int32) -> GatedNormLaunch:
    for name, meta in zip(_INPUTS, sig, strict=True):
        if meta[1] not in FLOATS:
            raise ValueError(f"{_OP}: {name} is {meta[1]}; the CUDA kernel takes float32/float16")
    (xs, xdt), (ss, sdt), (gs, gdt) = sig
    if not xs:
        raise ValueError(f"{_OP}: X must have at least one dimension")
    c = math.prod(ss)
    last = xs[-1]
    if c == 0 or last % c:
        raise ValueError(f"{_OP}: last dim {last} is not a multiple of len(scale)={c}")
    if math.prod(gs) != math.prod(xs):
        raise ValueError(f"{_OP}: gate {gs} must have as many elements as X {xs}")
    rows = math.prod(xs) // c
    geo = rows_geometry(rows, c)
    if geo is None:
        raise ValueError(f"{_OP}: {rows} groups exceed the CUDA grid limit")
    grid, block, tpr = geo
    i64 = np.int64
    return GatedNormLaunch(
        xs, np.dtype(xdt), grid, block,
        (i64(rows), i64(c), eps, silu, tpr, type_bits(xdt, sdt, gdt)),
    )  # fmt: skip


@kernel(_OP, domain="com.microsoft", dtypes={0: ("float", "float16")}, capture_safe=True)
def gated_rms_norm(node: NodeInfo, xp: Any):
    act = node.attr("activation", "silu")
    act = act.decode() if isinstance(act, bytes) else str(act)
    if act not in ("silu", "swish", "sigmoid"):
        raise NotSupported(f"{_OP}: activation {act!r} is not one of silu, swish, sigmoid")
    for i, name in enumerate(_INPUTS):
        why = float_refusal(_OP, name, node.input_dtype(i))
        if why:
            raise NotSupported(why)
    eps = np.float32(node.attr("epsilon", 1e-5))
    silu = np.int32(act != "sigmoid")
    fn = hybrid_kernel("gated_rms_norm")
    plans = K.PlanCache(lambda *sig: plan_gated_norm(sig, eps, silu))
    is_contiguous = contiguity_test(xp)

    def run(x, scale, gate):
        plan = plans(*signature((x, scale, gate)))
        x, scale, gate = contiguous(xp, is_contiguous, (x, scale, gate))
        y = xp.empty(plan.shape, plan.dtype)
        if plan.grid[0]:
            fn(plan.grid, plan.block, (x, scale, gate, y, *plan.args))
        return (y,)

    return run
