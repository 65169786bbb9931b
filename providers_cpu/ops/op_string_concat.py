"""StringConcat: element-wise, broadcasting concatenation of two string tensors."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from .misc import as_str_array

_concat = np.frompyfunc(lambda a, b: a + b, 2, 1)


@kernel("StringConcat", since=20)
def string_concat(node: NodeInfo, xp: Any):
    def run(x, y):
        a, b = as_str_array(x), as_str_array(y)
        shape = np.broadcast_shapes(a.shape, b.shape)
        if 0 in shape:
            return (np.empty(shape, dtype=object),)
        return (np.asarray(_concat(a, b), dtype=object).reshape(shape),)

    return run
