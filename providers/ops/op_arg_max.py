from onnxep.providers.kernel import kernel

from .shape import norm_axis


def build_arg(node, xp, fn_name: str):
    axis = node.attr("axis", 0)
    keepdims = bool(node.attr("keepdims", 1))
    last = bool(node.attr("select_last_index", 0)) if node.opset >= 12 else False

    def run(x):
        fn = getattr(xp, fn_name)
        a = norm_axis(axis, x.ndim, node.op_type)
        if last:
            # the first hit in the flipped axis is the last one in the original
            idx = (x.shape[a] - 1) - fn(xp.flip(x, axis=a), axis=a)
        else:
            idx = fn(x, axis=a)
        idx = idx.astype(xp.int64)
        if keepdims:
            idx = xp.expand_dims(idx, a)
        return (idx,)

    return run


@kernel("ArgMax", since=1)
def arg_max(node, xp):
    return build_arg(node, xp, "argmax")
