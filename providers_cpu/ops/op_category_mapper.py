"""CategoryMapper (ai.onnx.ml): strings to int64 through cats_strings -> cats_int64s, or back."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from ._misc import str_list, to_str


@kernel("CategoryMapper", since=1, domain="ai.onnx.ml", dtypes=["string", "int64"])
def category_mapper(node: NodeInfo, xp: Any):
    strings = str_list(node.attr("cats_strings", None))
    ints = [int(v) for v in (node.attr("cats_int64s", None) or [])]
    if len(strings) != len(ints):
        raise NotSupported(
            f"CategoryMapper: {len(strings)} cats_strings but {len(ints)} cats_int64s; "
            "they must pair up"
        )
    to_int = dict(zip(strings, ints))
    to_string = dict(zip(ints, strings))
    default_int = int(node.attr("default_int64", -1))
    default_str = to_str(node.attr("default_string", "_Unused"))

    def run(x):
        x = np.asarray(x)
        flat = x.reshape(-1).tolist()
        if x.dtype == object or x.dtype.kind in "SU":
            out = np.fromiter(
                (to_int.get(to_str(v), default_int) for v in flat), np.int64, len(flat)
            )
            return (out.reshape(x.shape),)
        out = np.empty(len(flat), dtype=object)
        out[:] = [to_string.get(int(v), default_str) for v in flat]
        return (out.reshape(x.shape),)

    return run
