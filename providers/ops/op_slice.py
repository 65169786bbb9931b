from onnxep.providers.kernel import kernel

from .shape import ints, norm_axes, onnx_slice


def _slice(x, starts, ends, axes, steps):
    return x[_index(x, starts, ends, axes, steps)]


def _index(x, starts, ends, axes, steps):
    if axes is None:
        axes = list(range(len(starts)))
    axes = norm_axes(axes, x.ndim, "Slice")
    if steps is None:
        steps = [1] * len(starts)
    index = [slice(None)] * x.ndim
    for a, s, e, st in zip(axes, starts, ends, steps):
        index[a] = onnx_slice(s, e, st, x.shape[a])
    return tuple(index)


@kernel("Slice", since=1)
def slice_attr(node, xp):
    starts = [int(v) for v in node.attr("starts")]
    ends = [int(v) for v in node.attr("ends")]
    axes = node.attr("axes", None)

    def run(x):
        return (_slice(x, starts, ends, axes, None),)

    return run


@kernel("Slice", since=10, host_inputs=(1, 2, 3, 4))
def slice_(node, xp):
    consts = [node.const_input(i) for i in range(1, 5)]
    if (
        consts[0] is not None
        and consts[1] is not None
        and all(consts[i] is not None or not node.has_input(i + 1) for i in (2, 3))
    ):
        # Constant bounds (the usual case in exported models): the index tuple
        # depends only on the input's shape, so it is worked out once per shape.
        args = [None if c is None else ints(c) for c in consts]
        memo: dict[tuple, tuple] = {}

        def run_const(x, *_):
            index = memo.get(x.shape)
            if index is None:
                index = _index(x, *args)
                if len(memo) < 64:
                    memo[x.shape] = index
            return (x[index],)

        return run_const

    def run(x, starts, ends, axes=None, steps=None):
        return (
            _slice(
                x,
                ints(starts),
                ints(ends),
                None if axes is None else ints(axes),
                None if steps is None else ints(steps),
            ),
        )

    return run
