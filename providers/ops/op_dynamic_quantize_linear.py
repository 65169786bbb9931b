"""DynamicQuantizeLinear: uint8 quantization with scale and zero point taken from the data."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo


@kernel("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(node: NodeInfo, xp: Any):
    def run(x):
        xf = x.astype(np.float32)
        # The range always includes 0 so that 0 quantizes exactly.
        zero = xp.zeros((), dtype=np.float32)
        lo = xp.minimum(xp.min(xf), zero) if xf.size else zero
        hi = xp.maximum(xp.max(xf), zero) if xf.size else zero
        scale = ((hi - lo) / np.float32(255)).astype(np.float32)
        # An all-zero input has a zero range; divide by 1 so everything maps to 0.
        safe = xp.where(scale == 0, np.float32(1), scale)
        zp = xp.clip(xp.round(-lo / safe), 0, 255)
        y = xp.clip(xp.round(xf / safe) + zp, 0, 255).astype(np.uint8)
        return y, scale.reshape(()), zp.astype(np.uint8).reshape(())

    return run
