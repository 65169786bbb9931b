from onnxep.providers.kernel import kernel

from ._shape import norm_axis

_NOTE = "the output size depends on the data, read back to the host"


@kernel("Compress", since=9, capture_safe=False, capture_note=_NOTE)
def compress(node, xp):
    axis = node.attr("axis", None)

    def run(x, condition):
        if axis is None:
            x = xp.reshape(x, (-1,))
            a = 0
        else:
            a = norm_axis(axis, x.ndim, "Compress")
        cond = xp.reshape(condition, (-1,))[: x.shape[a]]
        (idx,) = xp.nonzero(cond)
        return (xp.take(x, idx, axis=a),)

    return run
