"""ReduceSum: axes as an attribute up to opset 11, as a host input from 13."""

from onnxep.providers.kernel import kernel

from .reduce import build_reduce


@kernel("ReduceSum", since=(1, 11))
@kernel("ReduceSum", since=(13,), host_inputs=(1,))
def reduce_sum(node, xp):
    return build_reduce(node, xp, "sum", axes_input_since=13)
