from __future__ import annotations

from onnxep.providers.kernel import kernel


@kernel("GlobalMaxPool", since=(1, 22))
def global_max_pool(node, xp):
    def run(x):
        # keepdims on every spatial axis, whatever the rank (1-D spatial included).
        return (xp.max(x, axis=tuple(range(2, x.ndim)), keepdims=True),)

    return run
