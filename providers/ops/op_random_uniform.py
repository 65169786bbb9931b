"""RandomUniform: a tensor of the attribute shape drawn on the host."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from .quant import HostRng, random_dtype


@kernel(
    "RandomUniform",
    since=(1, 22),
    capture_safe=False,
    capture_note="draws random numbers on the host",
)
def random_uniform(node: NodeInfo, xp: Any):
    low = float(node.attr("low", 0.0))
    high = float(node.attr("high", 1.0))
    shape = tuple(int(d) for d in node.attr("shape"))
    dt = random_dtype(node, np.float32)
    rng = HostRng(node.attr("seed", None))

    def run():
        return (xp.asarray(rng.uniform(shape, low, high).astype(dt)),)

    return run
