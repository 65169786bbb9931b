from onnxep.providers.kernel import kernel

from .indices import checked_indices
from .shape import norm_axis


@kernel("Gather", since=1)
def gather(node, xp):
    axis = node.attr("axis", 0)

    def run(x, indices):
        a = norm_axis(axis, x.ndim, "Gather")
        idx = checked_indices(xp, indices, x.shape[a], "Gather", axis=a)
        return (xp.take(x, idx, axis=a),)

    return run
