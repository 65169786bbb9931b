"""AveragePool through cudnnPoolingForward (capture-safe), counting pads or not as asked.

count_include_pad=1 pads asymmetric remainders with zeros (they count, as pads do);
count_include_pad=0 needs symmetric pads (ceil_mode's extra cells included), else the
generic kernel runs it (``conv_plan.pool_geometry_plan`` says which and why).
"""

from __future__ import annotations

from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_average_pool as generic
from onnxep.providers.ops.nn import PoolSpec

from . import conv_plan
from .cudnn_run import build_refusal
from .pool_run import pool_runner, windowed_plan


@kernel("AveragePool", since=(1, 7, 10, 11, 19, 22))
def average_pool(node, xp):
    fallback = generic.average_pool(node, xp)
    spec = PoolSpec(node)
    include_pad = bool(node.attr("count_include_pad", 0))
    why = build_refusal(node, "AveragePool", len(spec.kernel)) or conv_plan.pool_attrs_refusal(
        "AveragePool", spec.dilations
    )
    if why is not None:
        return fallback

    return pool_runner(
        xp, "AveragePool", node.name, windowed_plan("avg", spec, include_pad), fallback
    )
