"""com.microsoft LinearAttentionGate: decay_scale * softplus(a + dt_bias) and sigmoid(b).

Both are computed in float32 (the decay feeds an exp in the recurrence, which
amplifies any rounding) and cast to a's type at the end.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from . import contrib as C


@kernel("LinearAttentionGate", domain="com.microsoft", dtypes=("float", "float16", "bfloat16"))
def linear_attention_gate(node: NodeInfo, xp: Any):
    want_beta = node.has_output(1)

    def run(a, dt_bias, decay_scale, b=None):
        h = a.shape[-1]
        bias = C.up(dt_bias, xp, np.float32).reshape(h)
        scale = C.up(decay_scale, xp, np.float32).reshape(h)
        decay = scale * C.softplus(C.up(a, xp, np.float32) + bias, xp)
        outs = {0: C.down(decay, a.dtype)}
        if want_beta:
            if b is None:
                raise ValueError("LinearAttentionGate: input b is required for the beta output")
            outs[1] = C.down(C.sigmoid(C.up(b, xp, np.float32), xp), a.dtype)
        return C.pad_outputs(node, outs)

    return run
