"""OneHotEncoder (ai.onnx.ml): one float column per category, appended as a last axis.

String inputs look up cats_strings, numeric ones (cast to int64) cats_int64s; a value in
no category gives a zero row, or an error when ``zeros`` is 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from ._misc import as_str_array, str_list


@kernel(
    "OneHotEncoder",
    since=1,
    domain="ai.onnx.ml",
    dtypes=["string", "int64", "int32", "float", "double"],
)
def one_hot_encoder(node: NodeInfo, xp: Any):
    strings = str_list(node.attr("cats_strings", None))
    ints = [int(v) for v in (node.attr("cats_int64s", None) or [])]
    zeros = int(node.attr("zeros", 1))
    if not strings and not ints:
        raise NotSupported("OneHotEncoder: cats_strings or cats_int64s must be set")
    table_s = {s: i for i, s in reversed(list(enumerate(strings)))}
    table_i = {v: i for i, v in reversed(list(enumerate(ints)))}

    def run(x):
        x = np.asarray(x)
        if x.dtype == object or x.dtype.kind in "SU":
            table, keys, n = table_s, as_str_array(x).reshape(-1).tolist(), len(strings)
        else:
            table, keys, n = table_i, x.astype(np.int64).reshape(-1).tolist(), len(ints)
        idx = np.fromiter((table.get(k, -1) for k in keys), np.int64, len(keys))
        if not zeros and (idx < 0).any():
            bad = keys[int(np.argmax(idx < 0))]
            raise ValueError(f"OneHotEncoder: {bad!r} is in no category and zeros is 0")
        out = np.zeros((len(keys), max(n, 0)), np.float32)
        hit = idx >= 0
        out[np.flatnonzero(hit), idx[hit]] = 1.0
        return (out.reshape(*x.shape, n),)

    return run
