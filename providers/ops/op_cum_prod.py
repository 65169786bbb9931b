from onnxep.providers.kernel import kernel

from .op_cum_sum import build_cumulative


@kernel("CumProd", since=26, host_inputs=(1,))
def cum_prod(node, xp):
    return build_cumulative(node, xp, "cumprod", 1)
