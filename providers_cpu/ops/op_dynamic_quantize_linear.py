"""DynamicQuantizeLinear on NumPy: the generic kernel's float32 operations, fewer passes.

The generic kernel converts X (a copy even when it is float32 already) and allocates a
new array for each of min, max, divide, round, add and clip; ddddocr's 22 such nodes
cost about 2 ms a run. With numba, one compiled loop finds the range and another
quantizes (qlinear.dynamic_uint8_compiled); otherwise, or when a value is NaN or
infinite, the float32 input is read as it is and the quotient is rounded, shifted and
clipped in place. Both are the same operations in the same order on the same values,
so the same bits as the generic kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel

from .qlinear import dynamic_uint8_compiled


@kernel("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(node: Any, xp: Any):
    def run(x):
        fast = dynamic_uint8_compiled(x)
        if fast is not None:
            q, scale, zp = fast
            return q, scale.reshape(()), zp.astype(np.uint8).reshape(())
        xf = x.astype(np.float32, copy=False)
        zero = np.float32(0)
        # The range always includes 0 so that 0 quantizes exactly.
        lo = np.minimum(xf.min(), zero) if xf.size else zero
        hi = np.maximum(xf.max(), zero) if xf.size else zero
        scale = np.float32((hi - lo) / np.float32(255))
        # An all-zero input has a zero range; divide by 1 so everything maps to 0.
        safe = np.float32(1) if scale == 0 else scale
        zp = np.clip(np.rint(-lo / safe), 0, 255)
        q = np.divide(xf, safe, dtype=np.float32)
        np.rint(q, out=q)
        q += zp
        np.clip(q, 0, 255, out=q)
        return q.astype(np.uint8), scale.reshape(()), zp.astype(np.uint8).reshape(())

    return run
