from onnxep.providers.kernel import kernel

from .shape import norm_axis, scalar_int, slice_along


def build_cumulative(node, xp, fn_name: str, identity: int):
    exclusive = bool(node.attr("exclusive", 0))
    reverse = bool(node.attr("reverse", 0))

    def run(x, axis):
        a = norm_axis(scalar_int(axis), x.ndim, node.op_type)
        fn = getattr(xp, fn_name)
        y = xp.flip(x, axis=a) if reverse else x
        acc = fn(y, axis=a, dtype=x.dtype)
        if exclusive:
            # shift by one along the axis, starting from the identity element
            pad_shape = list(x.shape)
            pad_shape[a] = 1
            head = xp.full(tuple(pad_shape), identity, dtype=x.dtype)
            acc = xp.concatenate([head, acc[slice_along(a, 0, x.shape[a] - 1)]], axis=a)
        if reverse:
            acc = xp.flip(acc, axis=a)
        return (acc,)

    return run


@kernel("CumSum", since=11, host_inputs=(1,))
def cum_sum(node, xp):
    return build_cumulative(node, xp, "cumsum", 0)
