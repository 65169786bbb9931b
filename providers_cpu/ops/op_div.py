"""Div on NumPy: a feature map and one value per channel in one compiled pass
(channel_broadcast.py); integers (truncating division) and every other case are the
generic kernel's."""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.elementwise import binary, legacy_axis
from onnxep.providers.ops.op_div import div as generic

from . import channel_broadcast


@kernel("Div", since=(1, 6, 7, 13, 14))
def div(node, xp):
    general = generic(node, xp)
    dt = node.input_dtype(0)
    if legacy_axis(node) is not None or (dt is not None and dt.kind in "iu"):
        return general

    def other(a, b):
        if a.dtype.kind in "iu":
            return general(a, b)[0]
        return np.divide(a, b)

    return binary(node, xp, channel_broadcast.binary(channel_broadcast.DIV, other))
