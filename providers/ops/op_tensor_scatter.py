from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel

from ._shape import grid, norm_axis


@kernel("TensorScatter", since=24)
def tensor_scatter(node, xp):
    axis = node.attr("axis", -2)
    mode = node.attr("mode", "linear")
    if mode not in ("linear", "circular"):
        raise NotSupported(f"TensorScatter: mode {mode!r} is not 'linear' or 'circular'")

    def run(past, update, write_indices=None):
        a = norm_axis(axis, past.ndim, "TensorScatter")
        if a == 0:
            raise ValueError("TensorScatter: axis cannot be the batch axis")
        out = past.copy()  # the past cache may be a shared constant
        seq = update.shape[a]
        # the cache position of every update row: write index of its batch + offset
        view = [1] * (a + 1)
        view[a] = seq
        pos = xp.arange(seq).reshape(view)
        if write_indices is not None:
            pos = pos + write_indices.reshape([-1] + [1] * a)
        if mode == "circular":
            pos = pos % past.shape[a]
        # advanced indices lead, so the indexed block has update's shape
        index = tuple(grid(xp, update.shape[: a + 1], d) for d in range(a)) + (pos,)
        out[index] = update
        return (out,)

    return run
