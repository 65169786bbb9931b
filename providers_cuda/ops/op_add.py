"""Add: float32/float16 through one raw kernel launch; other cases through the generic kernel."""

from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_add as generic

from .fast import fast_binary


@kernel("Add", since=(1, 6, 7, 13, 14))
def add(node, xp):
    return fast_binary("add", node, xp, generic.add)
