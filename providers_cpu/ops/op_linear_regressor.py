"""LinearRegressor (ai.onnx.ml): X @ coefficients^T + intercepts per target, then the post
transform (with one target only PROBIT applies, as onnxruntime's batched update does)."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from ._ml_common import PROBIT, apply_post, floats, post_transform, probit, rows_2d


@kernel(
    "LinearRegressor", since=1, domain="ai.onnx.ml", dtypes=["float", "double", "int64", "int32"]
)
def linear_regressor(node: NodeInfo, xp: Any):
    targets = int(node.attr("targets", 1))
    coef = floats(node, "coefficients", np.float32)
    if coef is None or targets <= 0 or coef.size % targets:
        raise NotSupported(
            f"LinearRegressor: the coefficients must split into {targets} target row(s)"
        )
    w = coef.reshape(targets, -1).astype(np.float64)
    b = floats(node, "intercepts", np.float32)
    b = np.zeros(targets) if b is None or not b.size else b.astype(np.float64)
    if b.size != targets:
        raise NotSupported(f"LinearRegressor: {b.size} intercepts for {targets} targets")
    post = post_transform(node)

    def run(x):
        x2 = rows_2d(np.asarray(x), "LinearRegressor").astype(np.float32).astype(np.float64)
        if x2.shape[1] != w.shape[1]:
            raise ValueError(
                f"LinearRegressor: the input has {x2.shape[1]} features per row, the "
                f"coefficients {w.shape[1]}"
            )
        s = x2 @ w.T + b
        if targets == 1:
            s = probit(s) if post == PROBIT else s
        else:
            s = apply_post(s, post)
        return (s.astype(np.float32),)

    return run
