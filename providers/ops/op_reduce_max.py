"""ReduceMax: axes as an attribute up to opset 13, as a host input from 18."""

from onnxep.providers.kernel import kernel

from .reduce import build_reduce


@kernel("ReduceMax", since=(1, 11, 12, 13))
@kernel("ReduceMax", since=(18, 20), host_inputs=(1,))
def reduce_max(node, xp):
    return build_reduce(node, xp, "max", axes_input_since=18)
