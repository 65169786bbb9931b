"""RandomNormalLike: random values with the input's shape (and its type unless dtype is set)."""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from .quant import HostRng, like_dtype, random_dtype


@kernel(
    "RandomNormalLike",
    since=(1, 22),
    capture_safe=False,
    capture_note="draws random numbers on the host",
)
def random_normal_like(node: NodeInfo, xp: Any):
    mean = float(node.attr("mean", 0.0))
    scale = float(node.attr("scale", 1.0))
    fixed = random_dtype(node, None)
    rng = HostRng(node.attr("seed", None))

    def run(x):
        dt = like_dtype(fixed, x.dtype)
        shape = x.shape
        return (xp.asarray(rng.normal(shape, mean, scale).astype(dt)),)

    return run
