"""ONNX RotaryEmbedding (opset 23) on NumPy, float32/float64, through ``rotate_into``.

3-D input (B, S, hidden) is viewed as (B, S, heads, D) and 4-D input (B, heads, S, D)
is rotated where it lies (cos/sin broadcast over its head axis), so no transposed copy
is made either way. Half-precision inputs go to the generic kernel.
"""

from __future__ import annotations

import numpy as np

from onnxep.providers.bounds import check_positions, position_ids_where
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops.op_rotary_embedding import rotary_embedding as generic

from .rotary_cpu import cache_rows, rotate_into

_FAST = (np.dtype(np.float32), np.dtype(np.float64))


@kernel("RotaryEmbedding", since=23, dtypes=("float", "float16", "bfloat16"))
def rotary_embedding(node: NodeInfo, xp):
    general = generic(node, xp)
    interleaved = bool(node.attr("interleaved", 0))
    rot_attr = int(node.attr("rotary_embedding_dim", 0))
    num_heads = int(node.attr("num_heads", 0))

    def run(x, cos, sin, pos=None):
        if x.dtype not in _FAST or x.ndim not in (3, 4) or (x.ndim == 3 and not num_heads):
            return general(x, cos, sin, pos)
        ct = x.dtype
        if x.ndim == 3:
            b, s, hid = x.shape
            x4 = x.reshape(b, s, num_heads, hid // num_heads)
        else:
            x4 = x
        rot = rot_attr or x4.shape[-1]
        if cos.shape[-1] != rot // 2 or sin.shape != cos.shape:
            return general(x, cos, sin, pos)  # it names what does not fit
        if pos is not None:
            # rows of the cos/sin cache; negative ids do not count from its end
            check_positions(np, pos, cos.shape[0], position_ids_where)
            cos = cache_rows(cos, pos, ct)
            sin = cache_rows(sin, pos, ct)
        else:
            cos, sin = cos.astype(ct, copy=False), sin.astype(ct, copy=False)
        # (B, S, half) against (B, S, H, D) or (B, H, S, D)
        axis = 2 if x.ndim == 3 else 1
        cos, sin = np.expand_dims(cos, axis), np.expand_dims(sin, axis)
        y = rotate_into(x4, cos, sin, interleaved, rot)
        return (y.reshape(x.shape),)

    return run
