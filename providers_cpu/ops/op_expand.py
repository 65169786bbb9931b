"""Expand on NumPy: the output shape worked out once per (input shape, target) and the
input written into a fresh buffer by one assignment. The generic kernel's
``np.broadcast_shapes`` and ``broadcast_to(...).copy()`` are Python-level NumPy
functions of several calls each: 8 us for a [1, 2, 256] state expanded to [2, 2, 256]
(romanizer-encoder's last node), against 1-2 for this."""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.shape import ints

#: Output shapes kept per kernel (a model's few feed shapes; past this, recomputed).
_CACHE_LIMIT = 64


@kernel("Expand", since=8, host_inputs=(1,))
def expand(node, xp):
    shapes: dict[tuple, tuple] = {}

    def run(x, shape):
        key = (x.shape, shape.tobytes() if isinstance(shape, np.ndarray) else repr(shape))
        out_shape = shapes.get(key)
        if out_shape is None:
            # bidirectional: a 1 in ``shape`` keeps the input's dim; a mismatch raises here
            out_shape = np.broadcast_shapes(tuple(x.shape), tuple(ints(shape)))
            if len(shapes) < _CACHE_LIMIT:
                shapes[key] = out_shape
        out = np.empty(out_shape, x.dtype)
        out[...] = x
        return (out,)

    return run
