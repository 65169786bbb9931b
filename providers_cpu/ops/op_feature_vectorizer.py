"""FeatureVectorizer (ai.onnx.ml): the inputs' columns side by side in float, each input
cut or zero-padded to its ``inputdimensions`` entry."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo


@kernel("FeatureVectorizer", since=1, domain="ai.onnx.ml")
def feature_vectorizer(node: NodeInfo, xp: Any):
    dims = [int(d) for d in (node.attr("inputdimensions", None) or [])]
    if len(dims) != node.num_inputs:
        raise NotSupported(
            f"FeatureVectorizer: {len(dims)} inputdimensions for {node.num_inputs} inputs; "
            "give one per input"
        )
    if any(d < 0 for d in dims):
        raise NotSupported("FeatureVectorizer: inputdimensions must not be negative")

    def run(*xs):
        arrays = [np.asarray(x) for x in xs]
        rows = {1 if a.ndim <= 1 else a.shape[0] for a in arrays}
        if len(rows) > 1:
            raise ValueError(
                f"FeatureVectorizer: the inputs have different row counts {sorted(rows)}"
            )
        n = rows.pop() if rows else 1
        out = np.zeros((n, sum(dims)), np.float32)
        at = 0
        for a, d in zip(arrays, dims):
            cols = a.reshape(n, -1).astype(np.float32)
            k = min(d, cols.shape[1])
            out[:, at : at + k] = cols[:, :k]
            at += d
        return (out,)

    return run
