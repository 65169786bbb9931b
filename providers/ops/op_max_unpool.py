"""MaxUnpool: scatter values to the flat positions MaxPool's Indices name."""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel

from .indices import checked_indices
from .nn import prod


@kernel("MaxUnpool", since=(9, 11, 22), host_inputs=(2,))
def max_unpool(node, xp):
    ksh = list(node.attr("kernel_shape"))
    r = len(ksh)
    strides = list(node.attr("strides", None) or [1] * r)
    pads = list(node.attr("pads", None) or [0] * (2 * r))

    def run(x, idx, output_shape=None):
        if tuple(idx.shape) != tuple(x.shape):
            raise ValueError(
                f"MaxUnpool: indices shape {list(idx.shape)} must equal X's shape {list(x.shape)}"
            )
        sp = [
            (n - 1) * s + k - a - e
            for n, s, k, a, e in zip(x.shape[2:], strides, ksh, pads[:r], pads[r:])
        ]
        shape = [*x.shape[:2], *sp]
        want = None
        if output_shape is not None:
            want = [int(v) for v in np.asarray(output_shape).reshape(-1)]
            if (
                len(want) != x.ndim
                or want[:2] != shape[:2]
                or any(w < g for w, g in zip(want[2:], sp))
            ):
                raise ValueError(
                    f"MaxUnpool: output_shape {want} must have X's batch and channel sizes "
                    f"{shape[:2]} and spatial sizes no smaller than the unpooled {sp}"
                )
        # Flat positions address the unpooled shape, as onnx's reference and node
        # tests read them; MaxPool's Indices are never negative, so neither are these.
        n = prod(shape)
        where = f"the flattened output of shape {shape}"
        idx = checked_indices(xp, idx, n, "MaxUnpool", name="I", negative=False, extent=where)
        flat = xp.zeros((n,), dtype=x.dtype)
        flat[idx.reshape(-1)] = x.reshape(-1)
        y = flat.reshape(shape)
        if want is not None and want[2:] != sp:
            # the requested shape grows the trailing edge of each spatial axis
            y = xp.pad(y, [(0, 0), (0, 0), *[(0, w - g) for w, g in zip(want[2:], sp)]])
        return (y,)

    return run
