"""AffineGrid: the normalized base grid (x fastest) times theta^T for each batch item."""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel

from .nn import compute_dtype


def _axis(length, align):
    if align:
        return np.linspace(-1.0, 1.0, length) if length > 1 else np.zeros(1)
    return (np.arange(length) * 2.0 + 1.0) / length - 1.0


@kernel("AffineGrid", since=20, host_inputs=(1,))
def affine_grid(node, xp):
    align = bool(node.attr("align_corners", 0))
    cache: dict = {}

    def run(theta, size):
        sz = [int(v) for v in np.asarray(size).reshape(-1)]
        sp = sz[2:]
        key = tuple(sp)
        base = cache.get(key)
        if base is None:
            # Coordinates listed innermost-first: (x, y[, z], 1) with x along the last dim.
            axes = [_axis(n, align) for n in sp]
            mesh = np.meshgrid(*axes, indexing="ij")
            cols = [m.reshape(-1) for m in reversed(mesh)]
            cols.append(np.ones(cols[0].shape))
            base = cache[key] = np.stack(cols, axis=1)
        cdt = compute_dtype(theta.dtype)
        th = theta.astype(cdt, copy=False)
        b = xp.asarray(base.astype(cdt))
        g = xp.matmul(b, xp.swapaxes(th, 1, 2))  # (N, P, nd)
        return (g.reshape(sz[0], *sp, len(sp)).astype(theta.dtype, copy=False),)

    return run
