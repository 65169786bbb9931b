"""SplitToSequence: split a tensor along ``axis`` into a sequence of parts."""

import numpy as np

from onnxep.providers.kernel import kernel

from .flow import SEQUENCE_NOTE, norm_axis


@kernel(
    "SplitToSequence",
    since=(11, 24),
    host_inputs=(1,),
    capture_safe=False,
    capture_note=SEQUENCE_NOTE,
)
def split_to_sequence(node, xp):
    axis_attr = int(node.attr("axis", 0))
    keepdims = bool(node.attr("keepdims", 1))

    def run(x, split=None):
        axis = norm_axis(axis_attr, x.ndim, "SplitToSequence")
        n = x.shape[axis]
        lead = (slice(None),) * axis
        if split is None:
            # unit parts; keepdims=0 drops the split axis
            if keepdims:
                return ([x[(*lead, slice(i, i + 1))] for i in range(n)],)
            return ([x[(*lead, i)] for i in range(n)],)
        split = np.asarray(split)
        if split.ndim == 0:
            size = int(split)
            if size <= 0:
                raise ValueError(f"SplitToSequence: split must be positive, got {size}")
            bounds = list(range(0, n, size)) + [n]
        else:
            sizes = [int(s) for s in split.reshape(-1)]
            if sum(sizes) != n or any(s < 0 for s in sizes):
                raise ValueError(
                    f"SplitToSequence: split {sizes} does not add up to dim {n} on axis {axis}"
                )
            bounds = [0, *np.cumsum(sizes).tolist()]
        return ([x[(*lead, slice(a, b))] for a, b in zip(bounds[:-1], bounds[1:])],)

    return run
