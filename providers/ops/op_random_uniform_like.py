"""RandomUniformLike: random values with the input's shape (and its type unless dtype is set)."""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from .quant import HostRng, like_dtype, random_dtype


@kernel(
    "RandomUniformLike",
    since=(1, 22),
    capture_safe=False,
    capture_note="draws random numbers on the host",
)
def random_uniform_like(node: NodeInfo, xp: Any):
    low = float(node.attr("low", 0.0))
    high = float(node.attr("high", 1.0))
    fixed = random_dtype(node, None)
    rng = HostRng(node.attr("seed", None))

    def run(x):
        dt = like_dtype(fixed, x.dtype)
        shape = x.shape
        return (xp.asarray(rng.uniform(shape, low, high).astype(dt)),)

    return run
