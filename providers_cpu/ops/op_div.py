"""Div on NumPy: a feature map and one value per channel in one compiled pass
(channel_broadcast.py); signed integers (truncating division) through one ``np.divmod``;
every other case is the generic kernel's."""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.elementwise import binary, legacy_axis
from onnxep.providers.ops.op_div import div as generic

from . import channel_broadcast


@kernel("Div", since=(1, 6, 7, 13, 14))
def div(node, xp):
    dt = node.input_dtype(0)
    if legacy_axis(node) is None and dt is not None and dt.kind == "i":
        return binary(node, xp, _trunc_div)
    if legacy_axis(node) is not None or not channel_broadcast.candidate(node):
        return generic(node, xp)  # unsigned and untyped integers included
    return binary(node, xp, channel_broadcast.binary(channel_broadcast.DIV))


def _trunc_div(a, b):
    """C's truncating division of signed integers, as the generic kernel's (floor, then
    one up where the division is inexact and the signs differ), from one ``np.divmod``:
    the shape arithmetic this serves divides exactly, and then the quotient is the answer
    (the generic kernel's seven NumPy calls cost 7 us on [1]-sized operands)."""
    q, r = np.divmod(a, b)
    inexact = r != 0
    if not inexact.any():
        return q
    return q + (inexact & ((a < 0) != (b < 0))).astype(q.dtype)
