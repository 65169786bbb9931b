"""com.microsoft DynamicQuantizeMatMul: float A quantized to uint8 on the fly, times 8-bit B.

A's scale and zero point come from its range widened to include 0, as
DynamicQuantizeLinear's (an all-zero A gets scale 1); then
``((qA - a_zp) @ (B - b_zp)) * (a_scale * b_scale) + bias``, B's parameters per tensor or
per column. onnxruntime's DynamicQuantizeLinear + MatMulInteger + Mul fusion emits it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel

from . import vnni_gemm
from .qlinear import dynamic_uint8, integer_matmul_to_float, packed_b, per_column


@kernel(
    "DynamicQuantizeMatMul",
    since=1,
    domain="com.microsoft",
    dtypes={0: ("float",), 1: ("uint8", "int8")},
)
def dynamic_quantize_matmul(node: Any, xp: Any):
    op = node.op_type
    packed = packed_b(node, 1, 3)
    # the tiles' padded scale and bias, made once when both are constants (b_scale always
    # is in quantize_dynamic's models): three NumPy calls a run, as long as the product
    scale_const = node.const_input(2)
    bias_const = node.const_input(4) if node.has_input(4) else None
    fixed = scale_const is not None and (bias_const is not None or not node.has_input(4))
    tile_params: list = []

    def run(a, b, b_scale, b_zp=None, bias=None):
        tiles = packed.packed() if packed is not None else None
        if tiles is not None and a.ndim >= 2 and (bias is None or bias.shape == (tiles.n,)):
            prepared = tile_params[0] if tile_params else None
            if prepared is None:
                bs = per_column(b_scale, b.shape[-1], op, "b_scale").astype(np.float32)
                prepared = (
                    _padded_scale(bs, tiles.zc.shape[0]),
                    vnni_gemm.padded_bias(bias, tiles),
                )
                if fixed:
                    tile_params.append(prepared)
            # quantize, multiply and scale in one compiled call (None: not here)
            y = vnni_gemm.dynamic_matmul(a, tiles, *prepared)
            if y is not None:
                return (y,)
        bs = per_column(b_scale, b.shape[-1], op, "b_scale").astype(np.float32)
        qa, a_scale, a_zp = dynamic_uint8(a.astype(np.float32, copy=False))
        mult = a_scale * bs
        return (integer_matmul_to_float(qa, a_zp, b, b_zp, mult, bias, op, packed),)

    return run


def _padded_scale(bs: np.ndarray, n: int) -> np.ndarray:
    """A per-tensor or per-column B scale as n float32 values (zeros past N)."""
    out = np.zeros(n, np.float32)
    if bs.ndim == 0:
        out[:] = bs
    else:
        out[: bs.shape[0]] = bs
    return out
