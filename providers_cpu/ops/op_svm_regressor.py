"""SVMRegressor (ai.onnx.ml): support vectors (libsvm) or coefficients only (liblinear),
plus rho; ``one_class`` gives +1 / -1; only PROBIT transforms the one score."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from ._ml_common import PROBIT, floats, post_transform, probit, rows_2d
from ._svm import SvmKernel


@kernel("SVMRegressor", since=1, domain="ai.onnx.ml", dtypes=["float", "double", "int64", "int32"])
def svm_regressor(node: NodeInfo, xp: Any):
    kern = SvmKernel(node)
    coef = floats(node, "coefficients", np.float32)
    if coef is None or not coef.size:
        raise NotSupported("SVMRegressor: attribute 'coefficients' is required")
    coef = coef.astype(np.float64)
    n_sv = int(node.attr("n_supports", 0))
    sv = floats(node, "support_vectors", np.float32)
    rho = floats(node, "rho", np.float32)
    rho0 = 0.0 if rho is None or not rho.size else float(rho[0])
    one_class = bool(node.attr("one_class", 0))
    post = post_transform(node)
    if n_sv > 0:
        if sv is None or sv.size % n_sv or coef.size < n_sv:
            raise NotSupported(
                f"SVMRegressor: {n_sv} supports need support_vectors in whole vectors and "
                f"{n_sv} coefficients"
            )
        sv = sv.reshape(n_sv, -1).astype(np.float64)
        c = coef[:n_sv]
        width = sv.shape[1]
    else:
        width = coef.size

    def run(x):
        x2 = rows_2d(np.asarray(x), "SVMRegressor").astype(np.float32).astype(np.float64)
        if x2.shape[1] != width:
            raise ValueError(
                f"SVMRegressor: the input has {x2.shape[1]} features per row, the model {width}"
            )
        if n_sv > 0:
            s = kern(x2, sv) @ c + rho0
        else:
            s = x2 @ coef + rho0  # coefficients only: the linear kernel, as onnxruntime
        if one_class:
            s = np.where(s > 0, 1.0, -1.0)
        if post == PROBIT:
            s = probit(s)
        return (s.reshape(-1, 1).astype(np.float32),)

    return run
