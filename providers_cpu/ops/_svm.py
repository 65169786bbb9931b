"""What SVMClassifier and SVMRegressor share: kernel parameters and the kernel products."""

from __future__ import annotations

import numpy as np

from onnxep.providers.node import NodeInfo

from ._ml_common import enum_attr, floats

LINEAR, POLY, RBF, SIGMOID = range(4)
KERNELS = {"LINEAR": LINEAR, "POLY": POLY, "RBF": RBF, "SIGMOID": SIGMOID}


class SvmKernel:
    def __init__(self, node: NodeInfo) -> None:
        self.kind = enum_attr(node, "kernel_type", KERNELS, "LINEAR")
        params = floats(node, "kernel_params", np.float32)
        p = [0.0, 0.0, 0.0] if params is None or not params.size else [float(v) for v in params]
        p += [0.0] * (3 - len(p))
        self.gamma, self.coef0, self.degree = p[:3]

    def __call__(self, x: np.ndarray, vectors: np.ndarray, linear_c: float = 0.0) -> np.ndarray:
        """The kernel of every row of x with every vector: ``(rows, vectors)``."""
        if self.kind == RBF:
            d = (x * x).sum(1)[:, None] - 2.0 * (x @ vectors.T) + (vectors * vectors).sum(1)
            return np.exp(-self.gamma * np.maximum(d, 0.0))
        if self.kind == LINEAR:
            return x @ vectors.T + linear_c
        k = self.gamma * (x @ vectors.T) + self.coef0
        return k**self.degree if self.kind == POLY else np.tanh(k)
