"""Sub: float32/float16 through one raw kernel launch; other cases through the generic kernel."""

from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_sub as generic

from .fast import fast_binary


@kernel("Sub", since=(1, 6, 7, 13, 14))
def sub(node, xp):
    return fast_binary("sub", node, xp, generic.sub)
