"""DictVectorizer (ai.onnx.ml): a map's values laid out in vocabulary order, [1, V].

Keys not in the vocabulary are dropped and vocabulary entries missing from the map are 0
(an empty string for string values).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from ._misc import str_list


@kernel("DictVectorizer", since=1, domain="ai.onnx.ml")
def dict_vectorizer(node: NodeInfo, xp: Any):
    strings = str_list(node.attr("string_vocabulary", None))
    ints = [int(v) for v in (node.attr("int64_vocabulary", None) or [])]
    if bool(strings) == bool(ints):
        raise NotSupported(
            "DictVectorizer: give exactly one of string_vocabulary, int64_vocabulary"
        )
    vocab = strings or ints
    out_dt = node.outputs[0].dtype if node.outputs and node.outputs[0] is not None else None

    def run(m):
        if not isinstance(m, dict):
            raise ValueError(f"DictVectorizer: the input must be a map, got {type(m).__name__}")
        values = [m.get(k) for k in vocab]
        dt = out_dt
        if dt is None:
            sample = next((v for v in values if v is not None), 0.0)
            dt = np.dtype(object) if isinstance(sample, str) else np.dtype(np.float32)
        zero = "" if dt == np.dtype(object) else 0
        out = np.array([zero if v is None else v for v in values], dtype=dt)
        return (out.reshape(1, len(vocab)),)

    return run
