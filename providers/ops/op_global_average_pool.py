from __future__ import annotations

from onnxep.providers.kernel import kernel

from ._nn import compute_dtype


@kernel("GlobalAveragePool", since=(1, 22))
def global_average_pool(node, xp):
    def run(x):
        axes = tuple(range(2, x.ndim))
        y = xp.mean(x.astype(compute_dtype(x.dtype), copy=False), axis=axes, keepdims=True)
        return (y.astype(x.dtype, copy=False),)

    return run
