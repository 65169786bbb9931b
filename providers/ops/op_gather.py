from onnxep.providers.kernel import kernel

from ._shape import norm_axis, norm_indices


@kernel("Gather", since=1)
def gather(node, xp):
    axis = node.attr("axis", 0)

    def run(x, indices):
        a = norm_axis(axis, x.ndim, "Gather")
        idx = norm_indices(xp, indices, x.shape[a])
        return (xp.take(x, idx, axis=a),)

    return run
