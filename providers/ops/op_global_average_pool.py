from __future__ import annotations

from onnxep.providers.kernel import kernel

from .nn import compute_dtype


@kernel("GlobalAveragePool", since=(1, 22))
def global_average_pool(node, xp):
    def run(x):
        n, c = x.shape[:2]
        cdt = compute_dtype(x.dtype)
        # A sum over one flattened axis is much cheaper than mean over a tuple of axes.
        flat = x.astype(cdt, copy=False).reshape(n, c, -1)
        y = xp.sum(flat, axis=-1) * (1.0 / max(flat.shape[-1], 1))
        return (y.astype(x.dtype, copy=False).reshape(n, c, *([1] * (x.ndim - 2))),)

    return run
