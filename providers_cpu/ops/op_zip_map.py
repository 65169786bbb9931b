"""ZipMap (ai.onnx.ml): each row of class scores as a dict {class label: score}.

The output is a sequence of maps, as onnxruntime returns it: a list with one dict
per row, keyed by the labels (``int`` for classlabels_int64s, ``str`` for strings),
values Python floats.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from ._misc import str_list


@kernel("ZipMap", since=1, domain="ai.onnx.ml", dtypes=["float"])
def zip_map(node: NodeInfo, xp: Any):
    strings = str_list(node.attr("classlabels_strings", None))
    ints = node.attr("classlabels_int64s", None)
    if bool(strings) == bool(ints):
        raise NotSupported("ZipMap: give exactly one of classlabels_strings, classlabels_int64s")
    labels = strings or [int(v) for v in ints]

    def run(x):
        x = np.asarray(x)
        rows = x.reshape(1, -1) if x.ndim == 1 else x
        if rows.ndim != 2 or rows.shape[1] != len(labels):
            raise ValueError(
                f"ZipMap: the input has shape {list(x.shape)}, but there are {len(labels)} "
                "class labels: it needs one column per label"
            )
        return ([dict(zip(labels, row)) for row in rows.tolist()],)

    return run
