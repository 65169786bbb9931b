"""com.microsoft GatedRMSNorm: Y = X * rsqrt(mean(X^2) + eps) * scale * act(gate).

The mean runs over each contiguous group of C = len(scale) elements of the
last axis, so a packed (..., H * C) tensor is normalized per head. All
arithmetic is float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from . import contrib as C


@kernel("GatedRMSNorm", domain="com.microsoft", dtypes=("float", "float16", "bfloat16"))
def gated_rms_norm(node: NodeInfo, xp: Any):
    act = node.attr("activation", "silu")
    act = act.decode() if isinstance(act, bytes) else str(act)
    if act not in ("silu", "swish", "sigmoid"):
        raise NotSupported(f"GatedRMSNorm: activation {act!r} is not one of silu, swish, sigmoid")
    use_silu = act != "sigmoid"
    eps = float(node.attr("epsilon", 1e-5))

    def run(x, scale, gate):
        c = scale.size
        last = x.shape[-1]
        if c == 0 or last % c:
            raise ValueError(f"GatedRMSNorm: last dim {last} is not a multiple of len(scale)={c}")
        grouped = x.shape[:-1] + (last // c, c)
        xf = C.up(x, xp, np.float32).reshape(grouped)
        normed, _ = C.rms_norm(xf, (-1,), eps, xp)
        z = C.up(gate, xp, np.float32).reshape(grouped)
        g = C.silu(z, xp) if use_silu else C.sigmoid(z, xp)
        y = normed * C.up(scale, xp, np.float32).reshape(c) * g
        return (C.down(y.reshape(x.shape), x.dtype),)

    return run
