"""Binarizer (ai.onnx.ml): 1 where x exceeds the threshold, else 0, in x's type."""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo


@kernel("Binarizer", since=1, domain="ai.onnx.ml")
def binarizer(node: NodeInfo, xp: Any):
    threshold = float(node.attr("threshold", 0.0))

    def run(x):
        return ((x > threshold).astype(x.dtype),)

    return run
