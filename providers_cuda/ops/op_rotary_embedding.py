"""ONNX RotaryEmbedding (opset 23) on CUDA: one kernel launch per call.

Inputs (X, cos_cache, sin_cache, position_ids?): X is (B, S, hidden) with the
``num_heads`` attribute, or (B, N, S, H). With position_ids (B, S) the caches
are (max_position, rot/2) tables read on the device; without, they are the
per-token values (B, S, rot/2).
"""

from __future__ import annotations

from onnxep.errors import InvalidArgument, NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from .rotary_cuda import PosMode, RopeKernel


@kernel("RotaryEmbedding", since=23, dtypes=("float", "float16"), capture_safe=True)
def rotary_embedding(node: NodeInfo, xp):
    interleaved = bool(node.attr("interleaved", 0))
    rot_attr = int(node.attr("rotary_embedding_dim", 0))
    num_heads = int(node.attr("num_heads", 0))
    rank = node.inputs[0].rank if node.inputs and node.inputs[0] is not None else None
    if rank == 3 and not num_heads:
        raise NotSupported("RotaryEmbedding: 3-D input needs the num_heads attribute")
    rope = RopeKernel(node.input_dtype(0), "RotaryEmbedding", node.name)

    def run(x, cos, sin, pos=None):
        if x.ndim == 3:
            if not num_heads:
                raise InvalidArgument("RotaryEmbedding: 3-D input needs the num_heads attribute")
            b, s, hid = x.shape
            if hid % num_heads:
                raise InvalidArgument(
                    f"RotaryEmbedding: hidden size {hid} is not a multiple of num_heads {num_heads}"
                )
            n, hd, bnsd = num_heads, hid // num_heads, False
        elif x.ndim == 4:
            b, n, s, hd = x.shape
            bnsd = True
        else:
            raise InvalidArgument(
                f"RotaryEmbedding: input must be 3-D or 4-D, got shape {tuple(x.shape)}"
            )
        if pos is not None:
            if pos.shape not in ((b, s), (1, s)) or cos.ndim != 2:
                raise InvalidArgument(
                    f"RotaryEmbedding: with position_ids ({tuple(pos.shape)}, expected ({b}, "
                    f"{s})) the caches must be 2-D tables, got {tuple(cos.shape)}"
                )
            mode, bcast = PosMode.IDS, pos.shape[0] != b
        else:
            if cos.ndim != 3 or cos.shape[:2] not in ((b, s), (1, s)):
                raise InvalidArgument(
                    f"RotaryEmbedding: without position_ids the caches must be ({b}, {s}, "
                    f"rot/2), got {tuple(cos.shape)}"
                )
            mode, bcast = PosMode.TABLE, cos.shape[0] != b
        y = rope(
            xp,
            x,
            cos,
            sin,
            pos,
            op="RotaryEmbedding",
            bnsd=bnsd,
            shape=(b, n, s, hd),
            rot=rot_attr or hd,
            interleaved=interleaved,
            mode=mode,
            bcast_b=bcast,
        )
        return (y,)

    return run
