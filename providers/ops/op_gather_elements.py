from onnxep.providers.kernel import kernel

from .indices import check_element_shapes, checked_indices
from .shape import grid, norm_axis


@kernel("GatherElements", since=11)
def gather_elements(node, xp):
    axis = node.attr("axis", 0)

    def run(x, indices):
        a = norm_axis(axis, x.ndim, "GatherElements")
        check_element_shapes("GatherElements", x.shape, indices.shape, a)
        idx = checked_indices(xp, indices, x.shape[a], "GatherElements", axis=a)
        # explicit index grids: indices may be shorter than x on the other axes,
        # which take_along_axis would try (and fail) to broadcast
        index = tuple(idx if d == a else grid(xp, indices.shape, d) for d in range(x.ndim))
        return (x[index],)

    return run
