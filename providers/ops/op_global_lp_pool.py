from __future__ import annotations

from onnxep.providers.kernel import kernel

from .nn import compute_dtype


@kernel("GlobalLpPool", since=(1, 2, 22))
def global_lp_pool(node, xp):
    p = float(node.attr("p", 2))

    def run(x):
        axes = tuple(range(2, x.ndim))
        xa = xp.abs(x.astype(compute_dtype(x.dtype), copy=False))
        s = xp.sum(xa**p, axis=axes, keepdims=True)
        return ((s ** (1.0 / p)).astype(x.dtype, copy=False),)

    return run
