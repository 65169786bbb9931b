from onnxep.providers.kernel import kernel

from .shape import ints, norm_axes, reshaper


def _unsqueeze(xp, x, axes):
    rank = x.ndim + len(axes)
    new = set(norm_axes(axes, rank, "Unsqueeze"))
    dims = iter(x.shape)
    shape = tuple(1 if i in new else next(dims) for i in range(rank))
    return xp.reshape(x, shape)


@kernel("Unsqueeze", since=(1, 11))
def unsqueeze_attr(node, xp):
    axes = [int(a) for a in node.attr("axes")]

    def run(x):
        return (_unsqueeze(xp, x, axes),)

    return run


@kernel("Unsqueeze", since=13, host_inputs=(1,))
def unsqueeze(node, xp):
    const = node.const_input(1)
    if const is not None:
        fixed = ints(const)
        memo: dict[tuple, tuple] = {}
        reshape = reshaper(xp)

        def run_const(x, _axes):
            shape = memo.get(x.shape)
            if shape is None:
                shape = _unsqueeze(xp, x, fixed).shape
                if len(memo) < 64:
                    memo[x.shape] = shape
            return (reshape(x, shape),)

        return run_const

    def run(x, axes):
        return (_unsqueeze(xp, x, ints(axes)),)

    return run
