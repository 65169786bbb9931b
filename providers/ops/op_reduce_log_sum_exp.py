"""ReduceLogSumExp: axes as an attribute up to opset 13, as a host input from 18."""

from onnxep.providers.kernel import kernel

from .reduce import build_reduce


@kernel("ReduceLogSumExp", since=(1, 11, 13))
@kernel("ReduceLogSumExp", since=(18, 28), host_inputs=(1,))
def reduce_log_sum_exp(node, xp):
    return build_reduce(node, xp, "logsumexp", axes_input_since=18)
