"""OneHot: out-of-range indices give an all-off row.

Unlike the gather and scatter ops, OneHot is specified to accept any index:
"entries with values outside the range [-depth, depth-1] will result in
one-hot representation with all 'off_value' values", and onnxruntime does
exactly that. So indices are not bounds-checked here; a negative depth is
refused, since it cannot size the new axis.
"""

from onnxep.providers.kernel import kernel

from .shape import norm_axis, scalar_int


@kernel("OneHot", since=(9, 11), host_inputs=(1,))
def one_hot(node, xp):
    axis = node.attr("axis", -1)

    def run(indices, depth, values):
        d = scalar_int(depth)
        if d < 0:
            raise ValueError(f"OneHot: depth {d} is negative; it is the size of the new axis")
        if values.shape != (2,):
            raise ValueError(
                f"OneHot: values must hold exactly two elements [off_value, on_value], "
                f"got shape {list(values.shape)}"
            )
        rank = indices.ndim + 1
        a = norm_axis(axis, rank, "OneHot")
        idx = indices if indices.dtype.kind in "iu" else xp.trunc(indices)
        idx = idx.astype(xp.int64)
        # negative indices count from the end; anything still outside stays all-off
        idx = xp.where(idx < 0, idx + d, idx)
        view = [1] * rank
        view[a] = d
        expanded = xp.expand_dims(idx, a)
        hot = expanded == xp.arange(d).reshape(view)
        return (xp.where(hot, values[1], values[0]).astype(values.dtype),)

    return run
