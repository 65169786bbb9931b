"""com.microsoft QLinearSigmoid: sigmoid of the dequantized input, requantized (by table)."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel

from ._qlinear import unary_table_kernel


def _sigmoid(v: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-v.astype(np.float64)))).astype(np.float32)


@kernel("QLinearSigmoid", since=1, domain="com.microsoft", dtypes=("uint8", "int8"))
def q_linear_sigmoid(node: Any, xp: Any):
    return unary_table_kernel(node, _sigmoid)
