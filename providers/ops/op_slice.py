from onnxep.providers.kernel import kernel

from ._shape import ints, norm_axes, onnx_slice


def _slice(x, starts, ends, axes, steps):
    if axes is None:
        axes = list(range(len(starts)))
    axes = norm_axes(axes, x.ndim, "Slice")
    if steps is None:
        steps = [1] * len(starts)
    index = [slice(None)] * x.ndim
    for a, s, e, st in zip(axes, starts, ends, steps):
        index[a] = onnx_slice(s, e, st, x.shape[a])
    return x[tuple(index)]


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
