"""Multinomial: class indices sampled from unnormalized log-probabilities.

Sampling uses the Gumbel-max trick (argmax of logits plus Gumbel noise is
an exact categorical draw), so only host noise crosses to the device.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from .quant import HostRng, random_dtype


@kernel(
    "Multinomial",
    since=(7, 22),
    capture_safe=False,
    capture_note="draws random numbers on the host",
)
def multinomial(node: NodeInfo, xp: Any):
    dt = random_dtype(node, np.int32)
    if dt not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise NotSupported(f"Multinomial: dtype {dt} is not int32 or int64")
    n = int(node.attr("sample_size", 1))
    rng = HostRng(node.attr("seed", None))

    def run(logits):
        batch, classes = logits.shape
        u = rng.uniform((batch, n, classes))
        # Keep u away from 0 so that log(-log(u)) stays finite.
        u = np.clip(u, np.finfo(np.float64).tiny, 1.0)
        g = xp.asarray(-np.log(-np.log(u)))
        scores = logits.astype(np.float64)[:, None, :] + g
        return (xp.argmax(scores, axis=-1).astype(dt),)

    return run
