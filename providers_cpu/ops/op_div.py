"""Div on NumPy: a feature map and one value per channel in one compiled pass
(channel_broadcast.py); integers (truncating division) and every other case are the
generic kernel's."""

from __future__ import annotations

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.elementwise import binary, legacy_axis
from onnxep.providers.ops.op_div import div as generic

from . import channel_broadcast


@kernel("Div", since=(1, 6, 7, 13, 14))
def div(node, xp):
    if legacy_axis(node) is not None or not channel_broadcast.candidate(node):
        return generic(node, xp)  # integers (truncating division) included
    return binary(node, xp, channel_broadcast.binary(channel_broadcast.DIV))
