"""LinearRegressor (ai.onnx.ml): X @ coefficients^T + intercepts per target, then the post
transform (with one target only PROBIT applies, as onnxruntime's batched update does). The
coefficients are read as rows of the input's width, as onnxruntime reads them
(``ml_common.CoefficientRows``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from .ml_common import PROBIT, CoefficientRows, apply_post, floats, post_transform, probit, rows_2d


@kernel(
    "LinearRegressor", since=1, domain="ai.onnx.ml", dtypes=["float", "double", "int64", "int32"]
)
def linear_regressor(node: NodeInfo, xp: Any):
    targets = int(node.attr("targets", 1))
    coef = floats(node, "coefficients", np.float32)
    if coef is None or targets <= 0:
        raise NotSupported("LinearRegressor: needs coefficients and at least one target")
    weights = CoefficientRows(coef, targets, "LinearRegressor")
    b = floats(node, "intercepts", np.float32)
    b = np.zeros(targets) if b is None or not b.size else b.astype(np.float64)
    if b.size != targets:
        raise NotSupported(f"LinearRegressor: {b.size} intercepts for {targets} targets")
    post = post_transform(node)

    def run(x):
        x2 = rows_2d(np.asarray(x), "LinearRegressor")
        if x2.dtype != np.float32:  # onnxruntime's product is in float32: its input too
            x2 = x2.astype(np.float32)
        s = x2.astype(np.float64) @ weights(x2.shape[1])
        s += b
        if targets == 1:
            s = probit(s) if post == PROBIT else s
        else:
            s = apply_post(s, post)
        return (s.astype(np.float32),)

    return run
