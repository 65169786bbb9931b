"""MaxPool on NumPy: dense separable running max over the flat padded input.

The Indices output, and integer/bool inputs, go through the generic kernel.
"""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.nn import PoolSpec, lowest
from onnxep.providers.ops.op_max_pool import max_pool as generic_max_pool

from .nn_cpu import pad_input, window_reduce


@kernel("MaxPool", since=(1, 8, 10, 11, 12, 22))
def max_pool(node, xp):
    if node.has_output(1):
        return generic_max_pool(node, xp)
    spec = PoolSpec(node)

    def run(x):
        pb, pe, out, _ = spec.geometry(x.shape[2:])
        if x.dtype.kind not in "fiu" or not x.dtype.isnative:
            # ml_dtypes floats (bfloat16, float8) have no fast np.maximum loop; upcast.
            y = run(x.astype(np.float32))[0]
            return (y.astype(x.dtype),)
        xpad = pad_input(x, pb, pe, lowest(x.dtype))
        return (window_reduce(xpad, spec.kernel, spec.strides, spec.dilations, out, np.maximum),)

    return run
