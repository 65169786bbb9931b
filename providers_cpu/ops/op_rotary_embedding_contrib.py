"""com.microsoft RotaryEmbedding on NumPy for 1-D or 2-D position_ids, through ``rotate_into``.

Float32/float64 input with a start offset (1,) or (B, S) ids, onnxruntime's own case,
runs here; 3-D (multimodal) ids, MRotaryEmbedding and half-precision inputs go to the
generic kernel.
"""

from __future__ import annotations

import numpy as np

from onnxep.providers.bounds import check_positions, first_id_where, position_ids_where
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops.op_rotary_embedding_contrib import (
    rotary_embedding_contrib as generic,
)

from .. import jit
from . import rotary_jit
from .rotary_cpu import cache_rows, rotate_into

_FLOATS = ("float", "float16", "bfloat16")
_FAST = (np.dtype(np.float32), np.dtype(np.float64))
_F32 = np.dtype(np.float32)
_I64 = np.dtype(np.int64)


@kernel("RotaryEmbedding", since=1, domain="com.microsoft", dtypes=_FLOATS)
def rotary_embedding_contrib(node: NodeInfo, xp):
    general = generic(node, xp)
    interleaved = bool(node.attr("interleaved", 0))
    rot_attr = int(node.attr("rotary_embedding_dim", 0))
    num_heads = int(node.attr("num_heads", 0))

    def run(x, pos, cos, sin):
        half = cos.shape[-1]
        if (
            x.dtype not in _FAST
            or x.ndim not in (3, 4)
            or pos.ndim not in (1, 2)
            or (pos.ndim == 1 and pos.size != 1)
        ):
            return general(x, pos, cos, sin)
        ct = x.dtype
        if x.ndim == 4:
            b, _, s, hd = x.shape
            x4 = x  # (B, N, S, H): cos/sin as (B, 1, S, half)
        else:
            b, s, hid = x.shape
            hd = hid // num_heads if num_heads else 2 * half
            if not hd or hid % hd:
                return general(x, pos, cos, sin)
            x4 = x.reshape(b, s, hid // hd, hd)  # (B, S, N, H): cos/sin as (B, S, 1, half)
        rot = rot_attr or hd
        if half != rot // 2 or sin.shape != cos.shape:
            return general(x, pos, cos, sin)  # it names what does not fit
        compiled = jit.ENABLED and ct == _F32 and cos.dtype == _F32 and sin.dtype == _F32
        if compiled and rot <= hd and cos.ndim == 2 and pos.dtype.kind in "iu":
            ids = pos if pos.dtype == _I64 else pos.astype(np.int64)
            y = np.empty(x.shape, _F32)
            if x.ndim == 4:  # (B, N, S, H) seen as (B, S, N, H)
                xv, yv = x.transpose(0, 2, 1, 3), y.transpose(0, 2, 1, 3)
            else:
                xv, yv = x4, y.reshape(x4.shape)
            counted = pos.ndim == 1
            if rotary_jit.rotate(
                xv, yv, ids.reshape(1, 1) if counted else ids, counted, cos, sin, interleaved, rot
            ):
                return (y,)
            # a row outside the cache: the path below names it
        if pos.ndim == 2:
            ids, where = pos.astype(np.int64), position_ids_where
        else:
            start = pos.astype(np.int64).reshape(1)
            ids, where = np.broadcast_to(start + np.arange(s), (b, s)), first_id_where
        # rows of the cos/sin cache; negative ids do not count from its end
        check_positions(np, ids, cos.shape[0], where)
        axis = 1 if x.ndim == 4 else 2
        c = np.expand_dims(cache_rows(cos, ids, ct), axis)
        sn = np.expand_dims(cache_rows(sin, ids, ct), axis)
        return (rotate_into(x4, c, sn, interleaved, rot).reshape(x.shape),)

    return run
