"""StringSplit: split each string, padding the substring lists to a common length."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from .misc import as_str_array, to_str


@kernel("StringSplit", since=20)
def string_split(node: NodeInfo, xp: Any):
    delim = node.attr("delimiter", None)
    # Unset or empty delimiter: Python's whitespace split has exactly these semantics.
    delim = to_str(delim) if delim is not None and to_str(delim) != "" else None
    maxsplit = node.attr("maxsplit", None)
    maxsplit = -1 if maxsplit is None else int(maxsplit)

    def run(x):
        a = as_str_array(x)
        parts = [s.split(delim, maxsplit) for s in a.reshape(-1).tolist()]
        width = max((len(p) for p in parts), default=0)
        y = np.full((len(parts), width), "", dtype=object)
        for i, p in enumerate(parts):
            y[i, : len(p)] = p
        z = np.array([len(p) for p in parts], dtype=np.int64).reshape(a.shape)
        return y.reshape((*a.shape, width)), z

    return run
