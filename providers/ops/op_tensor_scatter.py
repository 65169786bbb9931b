"""TensorScatter: write an update into a fixed-size cache at per-batch positions.

Write indices are cache positions, so negative ones are refused (they do not
count from the end), and in linear mode every written row must fall inside
the cache: onnxruntime refuses both. Circular mode wraps positions by design.
"""

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel

from .indices import checked_indices
from .shape import grid, norm_axis


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
        seq, cap = update.shape[a], past.shape[a]
        others = [n for d, n in enumerate(past.shape) if d != a]
        if update.ndim != past.ndim or [n for d, n in enumerate(update.shape) if d != a] != others:
            raise ValueError(
                f"TensorScatter: update shape {list(update.shape)} must equal the cache shape "
                f"{list(past.shape)} except on axis {a}"
            )
        if seq > cap:
            raise ValueError(
                f"TensorScatter: update has {seq} rows on axis {a} but the cache holds only {cap}"
            )
        out = past.copy()  # the past cache may be a shared constant
        # the cache position of every update row: write index of its batch + offset
        view = [1] * (a + 1)
        view[a] = seq
        pos = xp.arange(seq).reshape(view)
        if write_indices is not None:
            if tuple(write_indices.shape) != (past.shape[0],):
                raise ValueError(
                    f"TensorScatter: write_indices shape {list(write_indices.shape)} must be "
                    f"[batch_size] = [{past.shape[0]}]"
                )
            if mode == "linear":
                # the last row written, index + seq - 1, must still be inside the cache
                room, what = cap - seq + 1, f"a cache of {cap} positions taking {seq} rows"
            else:
                room, what = None, "cache positions"
            wi = checked_indices(
                xp,
                write_indices,
                room,
                "TensorScatter",
                name="write_indices",
                negative=False,
                extent=what,
            )
            pos = pos + wi.reshape([-1] + [1] * a)
        if mode == "circular":
            pos = pos % cap
        # advanced indices lead, so the indexed block has update's shape
        index = tuple(grid(xp, update.shape[: a + 1], d) for d in range(a)) + (pos,)
        out[index] = update
        return (out,)

    return run
