"""Sqrt: float32/float16 through one raw kernel launch; other cases through the generic kernel."""

from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_sqrt as generic

from .fast import fast_unary


@kernel("Sqrt", since=(1, 6, 13))
def sqrt(node, xp):
    return fast_unary("sqrt", node, xp, generic.sqrt)
