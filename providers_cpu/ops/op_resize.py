"""Resize (opsets 10-19) on the CPU: a nearest-neighbour resize of H and W in one compiled pass.

The generic kernel resizes one axis at a time with ``take``: for the 2x and 4x nearest
upsamplings of detection necks (rapidocr-v6-det's six, YOLOv8's two), two gathers
through an intermediate, [1, 96, 8, 12] -> [1, 96, 16, 24] in 40 us against onnxruntime's
10-15. Here, where the generic plan for an input shape and its scales/sizes is a gather
on the last two axes only (either may be absent, no extrapolation), ``jit._nearest_2d``
writes each output row once from the source row's indices, copying the previous output
row where it has the same source. Every output element is an input element, so the
values are the generic kernel's, bit for bit. Other modes, other axes, other dtypes and
no numba keep the generic kernel, whose first run of each key also makes the checks and
errors.
"""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_resize as generic

from .. import jit
from .nn_cpu import parallel_rows

_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_LIMIT = 64  # remembered keys, emptied when full (a model has a few shapes per node)


def _last_two(plan, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, bool] | None:
    """The row and column source indices when ``plan`` only gathers axes rank-2, rank-1."""
    rank = len(shape)
    if plan.outside or rank < 3:
        return None
    index = {rank - 2: np.arange(shape[-2]), rank - 1: np.arange(shape[-1])}
    for axis, op, arr in plan.axes_ops:
        if op != "take" or axis not in index:
            return None
        index[axis] = arr
    ih, iw = (np.ascontiguousarray(index[a], dtype=np.intp) for a in (rank - 2, rank - 1))
    if not (ih.size and iw.size):
        return None
    doubled = iw.size == 2 * shape[-1] and bool((iw == np.arange(iw.size) // 2).all())
    return ih, iw, doubled


def nearest_run(xp, attrs: generic.ResizeAttrs):
    """``run(x, roi, scales, sizes)``: the compiled pass where it applies, else generic."""
    general = generic.attrs_run(xp, attrs)
    if attrs.mode != "nearest":
        return general
    fast: dict = {}

    def run(x, roi=None, scales=None, sizes=None):
        if not isinstance(x, np.ndarray) or x.dtype not in _DTYPES or not x.size:
            return general(x, roi, scales, sizes)
        key = attrs.key(x.shape, roi, scales, sizes)
        got = fast.get(key)
        if got is None:
            out = general(x, roi, scales, sizes)  # its checks and errors on a new key
            if len(fast) >= _LIMIT:
                fast.clear()
            fast[key] = _last_two(attrs.plan(key), x.shape) or False
            return out
        if got is False or not jit.ENABLED:
            return general(x, roi, scales, sizes)
        ih, iw, doubled = got
        lead = x.shape[:-2]
        planes = x.size // (x.shape[-2] * x.shape[-1])
        x3 = np.ascontiguousarray(x).reshape(planes, x.shape[-2], x.shape[-1])
        y = np.empty((planes, ih.size, iw.size), x.dtype)
        f = jit.loop("nearest_2d")
        parallel_rows(planes, y.size, lambda r0, r1: f(x3, ih, iw, doubled, r0, r1, y))
        return (y.reshape(*lead, ih.size, iw.size),)

    return run


@kernel("Resize", since=10, host_inputs=(1,))
def resize_10(node, xp):
    full = nearest_run(xp, generic.legacy_attrs(generic.resize_10_mode(node)))

    def run(x, scales=None):
        return full(x, None, scales)

    return run


@kernel("Resize", since=(11, 13, 18, 19), host_inputs=(1, 2, 3))
def resize(node, xp):
    return nearest_run(xp, generic.resize_attrs(node))
