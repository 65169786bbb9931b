"""ReduceL1: axes as an attribute up to opset 13, as a host input from 18."""

from onnxep.providers.kernel import kernel

from .reduce import build_reduce


@kernel("ReduceL1", since=(1, 11, 13))
@kernel("ReduceL1", since=(18,), host_inputs=(1,))
def reduce_l1(node, xp):
    return build_reduce(node, xp, "l1", axes_input_since=18)
