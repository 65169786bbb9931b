"""com.microsoft LinearAttentionGate on CUDA: decay and beta in one launch.

``decay = decay_scale * softplus(a + dt_bias)`` per element of ``a`` (the
bias and scale hold one value per last-axis position) and ``beta =
sigmoid(b)``, both computed in float32 and stored in a's type, as on the CPU
(``providers/ops/op_linear_attention_gate.py``). Operands may mix float32 and
float16 (float16 exports keep dt_bias and the scale in float32).
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
    FLAT_BLOCK,
    FLOATS,
    contiguity_test,
    contiguous,
    flat_grid,
    float_refusal,
    hybrid_kernel,
    signature,
    type_bits,
)

_OP = "LinearAttentionGate"
_INPUTS = ("a", "dt_bias", "decay_scale", "b")


@dataclass(frozen=True)
class GateLaunch:
    decay_shape: tuple[int, ...]
    beta_shape: tuple[int, ...] | None  # None: no beta output
    dtype: np.dtype
    grid: tuple[int]
    args: tuple  # after the six pointers


def plan_gate(sig: tuple, want_beta: bool) -> GateLaunch:
    for name, meta in zip(_INPUTS, sig, strict=True):
        if meta is not None and meta[1] not in FLOATS:
            raise ValueError(f"{_OP}: {name} is {meta[1]}; the CUDA kernel takes float32/float16")
    (a_shape, a_dt), (bias_shape, _), (scale_shape, _), b = sig
    if not a_shape:
        raise ValueError(f"{_OP}: a must have at least one dimension")
    h = a_shape[-1]
    for name, shp in (("dt_bias", bias_shape), ("decay_scale", scale_shape)):
        if math.prod(shp) != h:
            raise ValueError(f"{_OP}: {name} {shp} must hold one value per last dim of a ({h})")
    if want_beta and b is None:
        raise ValueError(f"{_OP}: input b is required for the beta output")
    n_a = math.prod(a_shape)
    n_b = math.prod(b[0]) if want_beta else 0
    types = type_bits(a_dt, sig[1][1], sig[2][1], None if b is None else b[1])
    i64 = np.int64
    return GateLaunch(
        decay_shape=a_shape,
        beta_shape=b[0] if want_beta else None,
        dtype=np.dtype(a_dt),
        grid=flat_grid(n_a + n_b),
        args=(i64(n_a), i64(n_b), i64(max(h, 1)), types),
    )


@kernel(_OP, domain="com.microsoft", dtypes={0: ("float", "float16")}, capture_safe=True)
def linear_attention_gate(node: NodeInfo, xp: Any):
    for i, name in enumerate(_INPUTS):
        why = float_refusal(_OP, name, node.input_dtype(i))
        if why:
            raise NotSupported(why)
    want_beta = node.has_output(1)
    width = max(node.num_outputs, 1)
    fn = hybrid_kernel("la_gate")
    plans = K.PlanCache(lambda *sig: plan_gate(sig, want_beta))
    is_contiguous = contiguity_test(xp)

    def run(a, dt_bias, decay_scale, b=None):
        b = b if want_beta else None
        plan = plans(*signature((a, dt_bias, decay_scale, b)))
        a, dt_bias, decay_scale, b = contiguous(xp, is_contiguous, (a, dt_bias, decay_scale, b))
        decay = xp.empty(plan.decay_shape, plan.dtype)
        beta = None if plan.beta_shape is None else xp.empty(plan.beta_shape, plan.dtype)
        if decay.size or (beta is not None and beta.size):
            fn(plan.grid, (FLAT_BLOCK,), (a, dt_bias, decay_scale, b, decay, beta, *plan.args))
        return (decay, beta, *(None,) * (width - 2))[:width]

    return run
