from onnxep.providers.kernel import kernel

from ._shape import norm_axis, norm_indices


@kernel("GatherElements", since=11)
def gather_elements(node, xp):
    axis = node.attr("axis", 0)

    def run(x, indices):
        a = norm_axis(axis, x.ndim, "GatherElements")
        idx = norm_indices(xp, indices, x.shape[a])
        return (xp.take_along_axis(x, idx.astype(xp.int64), axis=a),)

    return run
