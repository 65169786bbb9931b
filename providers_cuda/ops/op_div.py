"""Div: float32/float16 through one raw kernel launch; other cases through the generic kernel."""

from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_div as generic

from .fast import fast_binary


@kernel("Div", since=(1, 6, 7, 13, 14))
def div(node, xp):
    return fast_binary("div", node, xp, generic.div)
