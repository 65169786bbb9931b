"""ConvInteger: int8/uint8 convolution with zero points, accumulated in int32."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from .quant import conv_nd, conv_params


@kernel("ConvInteger", since=10)
def conv_integer(node: NodeInfo, xp: Any):
    p = conv_params(node, node.inputs[1].shape if node.inputs[1] else None, None)

    def run(x, w, x_zero_point=None, w_zero_point=None):
        xi = x.astype(np.int32)
        wi = w.astype(np.int32)
        if x_zero_point is not None:
            xi = xi - x_zero_point.astype(np.int32).reshape(())
        if w_zero_point is not None:
            wzp = w_zero_point.astype(np.int32)
            # Per-output-channel zero points run along W's first axis.
            if wzp.ndim == 1 and wzp.shape[0] != 1:
                wzp = wzp.reshape((-1,) + (1,) * (w.ndim - 1))
            else:
                wzp = wzp.reshape(())
            wi = wi - wzp
        return (conv_nd(xi, wi, p, xp),)

    return run
