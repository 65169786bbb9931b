"""ArrayFeatureExtractor (ai.onnx.ml): pick entries along the last axis."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops.indices import checked_indices


@kernel("ArrayFeatureExtractor", since=1, domain="ai.onnx.ml")
def array_feature_extractor(node: NodeInfo, xp: Any):
    def run(x, y):
        idx = np.asarray(y, dtype=np.int64).reshape(-1)
        # columns of the last axis; onnxruntime refuses negative ones too (no counting back)
        idx = checked_indices(np, idx, np.shape(x)[-1] if np.ndim(x) else 1,
                              "ArrayFeatureExtractor", name="Y", negative=False)  # fmt: skip
        if x.ndim <= 1:
            # A 1-D input is a single row: the output keeps the [1, k] form.
            return (np.asarray(x).reshape(1, -1)[:, idx],)
        return (np.take(x, idx, axis=-1),)

    return run
