"""Unique on the CPU: data-dependent output sizes and sorting by rows need NumPy."""

import numpy as np

from onnxep.providers.kernel import kernel


def _rows_unique(rows: np.ndarray):
    """np.unique over rows of a 2-D array, for dtypes np.unique(axis=0) rejects."""
    n = rows.shape[0]
    if n == 0:
        e = np.zeros(0, np.int64)
        return e, e, e
    # lexsort on columns, last key primary: reverse so column 0 leads
    keys = rows.T[::-1] if rows.shape[1] else np.zeros((1, n))
    order = np.lexsort(keys)
    srt = rows[order]
    new = np.ones(n, dtype=bool)
    if rows.shape[1]:
        new[1:] = np.any(srt[1:] != srt[:-1], axis=1)
    else:
        new[1:] = False
    group = np.cumsum(new) - 1
    first = order[new]  # lexsort is stable: first row of each group has the lowest index
    inverse = np.empty(n, np.int64)
    inverse[order] = group
    counts = np.bincount(group)
    return first, inverse, counts


_NOTE = "the output size depends on the data, read back to the host"


@kernel("Unique", since=11, capture_safe=False, capture_note=_NOTE)
def unique(node, xp):
    axis = node.attr("axis", None)
    is_sorted = bool(node.attr("sorted", 1))

    def run(x):
        x = np.asarray(x)
        if axis is None:
            a = 0
            data = x.reshape(-1)
        else:
            a = axis + x.ndim if axis < 0 else axis
            data = x
        moved = np.moveaxis(data, a, 0)
        rows = moved.reshape(moved.shape[0], -1)
        first, inverse, counts = _rows_unique(rows)
        if not is_sorted:
            # renumber groups by first occurrence instead of sorted order
            order = np.argsort(first, kind="stable")
            rank = np.empty_like(order)
            rank[order] = np.arange(order.size)
            first, counts, inverse = first[order], counts[order], rank[inverse]
        y = np.take(data, first, axis=a)
        i64 = np.int64
        return y, first.astype(i64), inverse.astype(i64), counts.astype(i64)

    return run
