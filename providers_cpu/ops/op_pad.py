"""Pad (opsets 11-19) on the CPU: a mirrored pad of one axis as one remembered gather.

The VAD models reflect-pad their audio frame ([1, 512] -> [1, 576]) on every run; the
generic kernel reads the pads, checks them, slices and concatenates (8-16 us of Python
and NumPy calls on the loaded 2-core machine for 576 values). Here the first run of an
input shape and pads goes through the generic kernel (its checks and its errors), and
for a reflect, edge or wrap pad of one axis with no crop the source index of every output
position is remembered: later runs are ``x.take(index, axis)``, the same copies (every
output element is an input element: the same bits). Up to 64 remembered keys, emptied
when full; other pads (constant, several axes, negative) keep the generic kernel.
"""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_pad as generic_pad
from onnxep.providers.ops.shape import ints, norm_axes

_MIRRORED = ("reflect", "edge", "wrap")
_LIMIT = 64


@kernel("Pad", since=(11, 18, 19), host_inputs=(1, 2, 3))
def pad(node, xp):
    general = generic_pad.pad(node, xp)
    mode = node.attr("mode", "constant")
    if mode not in _MIRRORED:
        return general
    plans: dict = {}

    def run(x, pads, constant_value=None, axes=None):
        if not isinstance(x, np.ndarray) or not isinstance(pads, np.ndarray):
            return general(x, pads, constant_value, axes)
        key = (
            x.shape,
            pads.dtype.char,
            pads.tobytes(),
            None if axes is None else (axes.dtype.char, np.asarray(axes).tobytes()),
        )
        plan = plans.get(key)
        if plan is not None:
            return (x.take(plan[1], plan[0]),)
        out = general(x, pads, constant_value, axes)  # checks, errors, the first result
        plan = _one_axis(x.shape, ints(pads), None if axes is None else ints(axes), mode)
        if plan is not None:
            if len(plans) >= _LIMIT:
                plans.clear()
            plans[key] = plan
        return out

    return run


def _one_axis(shape, pads, axes, mode):
    """(axis, source index of each output position) when exactly one axis is padded and
    none is cropped, else None; for the widths the generic kernel accepted (reflect: at
    most n - 1, one reflection; edge and wrap: an axis of at least one element)."""
    rank = len(shape)
    axes = list(range(rank)) if axes is None else norm_axes(axes, rank, "Pad")
    if len(pads) != 2 * len(axes) or any(p < 0 for p in pads):
        return None
    padded = [(a, pads[i], pads[i + len(axes)]) for i, a in enumerate(axes)]
    padded = [p for p in padded if p[1] or p[2]]
    if len(padded) != 1:
        return None
    axis, b, e = padded[0]
    n = shape[axis]
    p = np.arange(-b, n + e, dtype=np.intp)
    if mode == "reflect":  # the edge element not repeated; widths are at most n - 1
        index = np.where(p < 0, -p, np.where(p > n - 1, 2 * (n - 1) - p, p))
    elif mode == "edge":
        index = np.clip(p, 0, n - 1)
    else:  # wrap
        index = p % n
    return axis, index
