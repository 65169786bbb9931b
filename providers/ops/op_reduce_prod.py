"""ReduceProd: axes as an attribute up to opset 13, as a host input from 18."""

from onnxep.providers.kernel import kernel

from .reduce import build_reduce


@kernel("ReduceProd", since=(1, 11, 13))
@kernel("ReduceProd", since=(18,), host_inputs=(1,))
def reduce_prod(node, xp):
    return build_reduce(node, xp, "prod", axes_input_since=18)
