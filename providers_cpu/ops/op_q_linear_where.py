"""com.microsoft QLinearWhere: Where(condition, X, Y) with X and Y requantized to Z's parameters.

Inputs: condition, X, x_scale, x_zero_point, Y, y_scale, y_zero_point, z_scale, z_zero_point.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel

from ._qlinear import eight_bit, requantizer, scalar


@kernel(
    "QLinearWhere", since=1, domain="com.microsoft", dtypes={0: ("bool",), 1: ("uint8", "int8")}
)
def q_linear_where(node: Any, xp: Any):
    op = node.op_type
    dt = eight_bit(node, 1, "X")
    if None not in (dt, node.input_dtype(4)) and np.dtype(node.input_dtype(4)) != dt:
        raise NotSupported(f"QLinearWhere: X is {dt.name} but Y is {node.input_dtype(4)}")

    def run(cond, x, x_scale, x_zp, y, y_scale, y_zp, z_scale, z_zp):
        zs, zz = scalar(z_scale, op, "z_scale"), scalar(z_zp, op, "z_zero_point", 0)
        xq = requantizer(op, "x", x_scale, x_zp, zs, zz, x.dtype)(x)
        yq = requantizer(op, "y", y_scale, y_zp, zs, zz, x.dtype)(y)
        return (np.where(cond, xq, yq).astype(x.dtype),)

    return run
