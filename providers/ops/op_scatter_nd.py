from onnxep.providers.kernel import kernel

from ._shape import check_reduction, norm_indices, scatter


@kernel("ScatterND", since=(11, 16))
def scatter_nd(node, xp):
    reduction = node.attr("reduction", "none") if node.opset >= 16 else "none"
    check_reduction("ScatterND", reduction)

    def run(data, indices, updates):
        out = data.copy()  # inputs may be shared constants: never write them
        k = indices.shape[-1]
        index = tuple(norm_indices(xp, indices[..., i], data.shape[i]) for i in range(k))
        return (scatter(xp, out, index, updates, reduction),)

    return run
