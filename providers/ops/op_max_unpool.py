"""MaxUnpool: scatter values to the flat positions MaxPool's Indices name."""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel

from ._nn import prod


@kernel("MaxUnpool", since=(9, 11, 22), host_inputs=(2,))
def max_unpool(node, xp):
    ksh = list(node.attr("kernel_shape"))
    r = len(ksh)
    strides = list(node.attr("strides", None) or [1] * r)
    pads = list(node.attr("pads", None) or [0] * (2 * r))

    def run(x, idx, output_shape=None):
        sp = [
            (n - 1) * s + k - a - e
            for n, s, k, a, e in zip(x.shape[2:], strides, ksh, pads[:r], pads[r:])
        ]
        shape = [*x.shape[:2], *sp]
        flat = xp.zeros((prod(shape),), dtype=x.dtype)
        flat[idx.reshape(-1)] = x.reshape(-1)
        y = flat.reshape(shape)
        if output_shape is not None:
            # Indices address the inferred shape (as onnxruntime reads them); the
            # requested shape only grows (or trims) the trailing edge.
            want = [int(v) for v in np.asarray(output_shape).reshape(-1)][2:]
            y = y[(Ellipsis, *(slice(0, w) for w in want))]
            grow = [(0, max(0, w - g)) for w, g in zip(want, y.shape[2:])]
            if any(g[1] for g in grow):
                y = xp.pad(y, [(0, 0), (0, 0), *grow])
        return (y,)

    return run
