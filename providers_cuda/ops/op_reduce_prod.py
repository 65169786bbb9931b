"""ReduceProd on CUDA: one float32-accumulating kernel for float32/float16 (``reduce_cuda``).

Axes are an attribute up to opset 13 and a host input from 18; a non-constant axes
input, other dtypes and axes that are not one contiguous run take the generic kernel.
"""

from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_reduce_prod as generic

from .reduce_cuda import build_reduce


@kernel("ReduceProd", since=(1, 11, 13))
@kernel("ReduceProd", since=(18,), host_inputs=(1,))
def reduce_prod(node, xp):
    return build_reduce(node, xp, "prod", 18, generic.reduce_prod)
