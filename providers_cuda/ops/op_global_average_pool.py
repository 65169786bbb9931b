"""GlobalAveragePool as one cudnnPoolingForward window over all spatial cells (capture-safe)."""

from __future__ import annotations

from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_global_average_pool as generic

from .pool_run import global_pool


@kernel("GlobalAveragePool", since=(1, 22))
def global_average_pool(node, xp):
    return global_pool(node, xp, "GlobalAveragePool", "avg", generic.global_average_pool(node, xp))
