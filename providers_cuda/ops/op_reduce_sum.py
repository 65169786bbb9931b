"""ReduceSum on CUDA: one float32-accumulating kernel for float32/float16 (``reduce_cuda``).

Axes are an attribute up to opset 11 and a host input from 13; a non-constant axes
input, other dtypes and axes that are not one contiguous run take the generic kernel.
"""

from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_reduce_sum as generic

from .reduce_cuda import build_reduce


@kernel("ReduceSum", since=(1, 11))
@kernel("ReduceSum", since=(13,), host_inputs=(1,))
def reduce_sum(node, xp):
    return build_reduce(node, xp, "sum", 13, generic.reduce_sum)
