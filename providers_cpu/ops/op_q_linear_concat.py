"""com.microsoft QLinearConcat: each input requantized to Y's scale and zero point, then Concat.

Inputs: Y_scale, Y_zero_point, then (X, X_scale, X_zero_point) per input. An input whose
scale and zero point are Y's is copied as is; the others go through a 256-entry table.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import InvalidArgument, NotSupported
from onnxep.providers.kernel import kernel

from ._qlinear import eight_bit, requantizer, scalar


@kernel("QLinearConcat", since=1, domain="com.microsoft")
def q_linear_concat(node: Any, xp: Any):
    op = node.op_type
    axis = int(node.attr("axis"))
    if node.num_inputs < 5 or (node.num_inputs - 2) % 3:
        raise NotSupported(
            f"QLinearConcat: needs Y_scale, Y_zero_point and (X, X_scale, X_zero_point) triples, "
            f"got {node.num_inputs} inputs"
        )
    dt = eight_bit(node, 1, "Y_zero_point")
    for i in range(2, node.num_inputs, 3):
        if None not in (dt, node.input_dtype(i)) and np.dtype(node.input_dtype(i)) != dt:
            raise NotSupported(f"QLinearConcat: input {i} is {node.input_dtype(i)}, Y is {dt.name}")

    def run(y_scale, y_zp, *triples):
        ys, yz = scalar(y_scale, op, "Y_scale"), scalar(y_zp, op, "Y_zero_point", 0)
        parts = []
        for j in range(0, len(triples), 3):
            x, s, z = triples[j : j + 3]
            parts.append(requantizer(op, f"input {j // 3}", s, z, ys, yz, y_zp.dtype)(x))
        rank = parts[0].ndim
        if not -rank <= axis < rank:
            raise InvalidArgument(f"QLinearConcat: axis {axis} is out of range for rank {rank}")
        return (np.concatenate(parts, axis=axis),)

    return run
