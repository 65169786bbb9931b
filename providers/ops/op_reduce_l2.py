"""ReduceL2: axes as an attribute up to opset 13, as a host input from 18."""

from onnxep.providers.kernel import kernel

from .reduce import build_reduce


@kernel("ReduceL2", since=(1, 11, 13))
@kernel("ReduceL2", since=(18,), host_inputs=(1,))
def reduce_l2(node, xp):
    return build_reduce(node, xp, "l2", axes_input_since=18)
