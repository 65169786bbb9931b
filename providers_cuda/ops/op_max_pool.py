"""MaxPool through cudnnPoolingForward (capture-safe); Indices or dilations: the generic kernel.

Asymmetric pads and ceil_mode's extra end cells are padded explicitly with -inf ahead
of cuDNN's symmetric pads (``conv_plan.pool_geometry_plan``); cuDNN propagates NaN,
as ``numpy.maximum`` does on the CPU.
"""

from __future__ import annotations

from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_max_pool as generic
from onnxep.providers.ops.nn import PoolSpec

from . import conv_plan
from .cudnn_run import build_refusal
from .pool_run import pool_runner, windowed_plan


@kernel("MaxPool", since=(1, 8, 10, 11, 12, 22))
def max_pool(node, xp):
    fallback = generic.max_pool(node, xp)
    spec = PoolSpec(node)
    why = build_refusal(node, "MaxPool", len(spec.kernel)) or conv_plan.pool_attrs_refusal(
        "MaxPool", spec.dilations, want_indices=node.has_output(1)
    )
    if why is not None:
        return fallback

    return pool_runner(xp, "MaxPool", node.name, windowed_plan("max", spec), fallback)
