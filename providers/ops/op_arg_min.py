from onnxep.providers.kernel import kernel

from .op_arg_max import build_arg


@kernel("ArgMin", since=1)
def arg_min(node, xp):
    return build_arg(node, xp, "argmin")
