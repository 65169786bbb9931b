"""Gather: ``take`` along an axis, every index checked against it.

Constant indices (a shape chain's ``Gather(shape, 0)``, an embedding row) are scanned
once, when the kernel is built: each run then only compares their range with the
axis's length, and the indices counted from the end are normalized once per length.
"""

import numpy as np

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

    const = node.const_input(1) if node.num_inputs > 1 else None
    if xp is not np or type(const) is not np.ndarray or const.dtype.kind not in "iu":
        return run
    if const.size == 0:
        return run
    lo, hi = int(const.min()), int(const.max())
    normalized: dict[int, np.ndarray] = {}

    def run_const(x, indices):
        if indices is not const:  # not the constant it was built for: the checked path
            return run(x, indices)
        a = norm_axis(axis, x.ndim, "Gather")
        d = x.shape[a]
        if lo < -d or hi >= d:
            return run(x, indices)  # raises, naming the index
        # the method: np.take's dispatch wrapper cost 0.6 us a call more (9 a decoder step)
        if lo >= 0:
            return (x.take(const, axis=a),)
        idx = normalized.get(d)
        if idx is None:
            idx = normalized[d] = np.where(const < 0, const + d, const)
        return (x.take(idx, axis=a),)

    return run_const
