"""ReduceMean: axes as an attribute up to opset 13, as a host input from 18."""

from onnxep.providers.kernel import kernel

from .reduce import build_reduce


@kernel("ReduceMean", since=(1, 11, 13))
@kernel("ReduceMean", since=(18,), host_inputs=(1,))
def reduce_mean(node, xp):
    return build_reduce(node, xp, "mean", axes_input_since=18)
