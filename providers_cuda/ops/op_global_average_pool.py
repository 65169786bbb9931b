"""GlobalAveragePool as one cudnnPoolingForward window over all spatial cells (capture-safe)."""

from __future__ import annotations

from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_global_average_pool as generic

from . import conv_plan
from .cudnn_run import build_refusal
from .pool_run import pool_runner


@kernel("GlobalAveragePool", since=(1, 22))
def global_average_pool(node, xp):
    fallback = generic.global_average_pool(node, xp)
    x = node.inputs[0] if node.inputs else None
    rank = x.rank if x is not None else None
    if build_refusal(node, "GlobalAveragePool", None if rank is None else rank - 2):
        return fallback
    return pool_runner(
        xp,
        "GlobalAveragePool",
        node.name,
        lambda shape: conv_plan.global_pool_plan("avg", shape),
        fallback,
    )
