from onnxep.providers.kernel import kernel

from .indices import check_element_shapes, checked_indices
from .shape import check_reduction, grid, norm_axis, scatter


def build_scatter_elements(node, xp, reduction: str):
    axis = node.attr("axis", 0)

    def run(data, indices, updates):
        op = node.op_type
        a = norm_axis(axis, data.ndim, op)
        check_element_shapes(op, data.shape, indices.shape, a)
        if tuple(updates.shape) != tuple(indices.shape):
            raise ValueError(
                f"{op}: updates shape {list(updates.shape)} must equal indices shape "
                f"{list(indices.shape)}"
            )
        idx = checked_indices(xp, indices, data.shape[a], op, axis=a)
        out = data.copy()  # inputs may be shared constants: never write them
        index = tuple(idx if d == a else grid(xp, indices.shape, d) for d in range(indices.ndim))
        return (scatter(xp, out, index, updates, reduction),)

    return run


@kernel("ScatterElements", since=(11, 16))
def scatter_elements(node, xp):
    reduction = node.attr("reduction", "none") if node.opset >= 16 else "none"
    return build_scatter_elements(node, xp, check_reduction(node.op_type, reduction))


@kernel("Scatter", since=9)
def scatter_old(node, xp):
    # the deprecated Scatter is ScatterElements without reduction
    return build_scatter_elements(node, xp, "none")
