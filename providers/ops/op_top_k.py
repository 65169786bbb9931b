from onnxep.providers.kernel import kernel

from .shape import norm_axis, scalar_int, slice_along


def top_k(xp, x, k, axis, largest):
    """Values and int64 indices of the k largest (or smallest) along ``axis``.

    Ties keep the lower index first. For ``largest``, a stable ascending sort
    of the reversed axis, read backwards, orders values descending with equal
    values by increasing original index, with no negation (unsigned, bool).
    """
    a = norm_axis(axis, x.ndim, "TopK")
    n = x.shape[a]
    if k > n:
        raise ValueError(f"TopK: k={k} exceeds axis size {n}")
    if largest:
        rev = xp.flip(x, axis=a)
        order = xp.flip(xp.argsort(rev, axis=a, kind="stable"), axis=a)
        order = (n - 1) - order
    else:
        order = xp.argsort(x, axis=a, kind="stable")
    idx = order[slice_along(a, 0, k)]
    return xp.take_along_axis(x, idx, axis=a), idx.astype(xp.int64)


@kernel("TopK", since=1)
def top_k_v1(node, xp):
    k = node.attr("k")
    axis = node.attr("axis", -1)

    def run(x):
        return top_k(xp, x, k, axis, True)

    return run


@kernel("TopK", since=(10, 11), host_inputs=(1,))
def top_k_(node, xp):
    axis = node.attr("axis", -1)
    largest = bool(node.attr("largest", 1)) if node.opset >= 11 else True
    # sorted=0 allows any order; sorted output is one of them

    def run(x, k):
        return top_k(xp, x, scalar_int(k), axis, largest)

    return run
