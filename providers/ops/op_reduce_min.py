"""ReduceMin: axes as an attribute up to opset 13, as a host input from 18."""

from onnxep.providers.kernel import kernel

from .reduce import build_reduce


@kernel("ReduceMin", since=(1, 11, 12, 13))
@kernel("ReduceMin", since=(18, 20), host_inputs=(1,))
def reduce_min(node, xp):
    return build_reduce(node, xp, "min", axes_input_since=18)
