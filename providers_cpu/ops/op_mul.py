"""Mul on NumPy: a feature map and one value per channel in one compiled pass
(channel_broadcast.py); every other node and case is the generic kernel's (whose direct
form, the ufunc itself, the executor may run in place)."""

from __future__ import annotations

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.elementwise import binary, legacy_axis
from onnxep.providers.ops.op_mul import mul as generic

from . import channel_broadcast


@kernel("Mul", since=(1, 6, 7, 13, 14))
def mul(node, xp):
    if legacy_axis(node) is not None or not channel_broadcast.candidate(node):
        return generic(node, xp)
    return binary(node, xp, channel_broadcast.binary(channel_broadcast.MUL))
