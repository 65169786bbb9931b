"""Bernoulli: 1 with probability p per element; the uniform draws come from the host."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from .quant import HostRng, random_dtype


@kernel(
    "Bernoulli",
    since=(15, 22),
    capture_safe=False,
    capture_note="draws random numbers on the host",
)
def bernoulli(node: NodeInfo, xp: Any):
    fixed = random_dtype(node, None)
    rng = HostRng(node.attr("seed", None))

    def run(p):
        dt = fixed if fixed is not None else p.dtype
        # Only the uniform draws cross to the device; p never comes back.
        u = xp.asarray(rng.uniform(p.shape))
        return ((u < p.astype(np.float64)).astype(dt),)

    return run
