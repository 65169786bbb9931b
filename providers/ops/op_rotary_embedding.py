"""ONNX RotaryEmbedding (opset 23)."""

from __future__ import annotations

from onnxep.errors import NotSupported
from onnxep.providers.bounds import check_positions, position_ids_where
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops.attention import compute_dtype, rotate, widen


@kernel("RotaryEmbedding", since=23, dtypes=("float", "float16", "bfloat16"))
def rotary_embedding(node: NodeInfo, xp):
    interleaved = bool(node.attr("interleaved", 0))
    rot_attr = int(node.attr("rotary_embedding_dim", 0))
    num_heads = int(node.attr("num_heads", 0))
    rank = node.inputs[0].rank
    if rank == 3 and not num_heads:
        raise NotSupported("RotaryEmbedding: 3-D input needs the num_heads attribute")

    def run(x, cos, sin, pos=None):
        ct = compute_dtype(x.dtype)
        shape = x.shape
        if x.ndim == 3:
            b, s, hid = shape
            x4 = xp.reshape(x, (b, s, num_heads, hid // num_heads))  # (B, S, H, D)
        else:
            x4 = xp.transpose(x, (0, 2, 1, 3))
        rot = rot_attr or x4.shape[-1]
        if pos is not None:
            # rows of the cos/sin cache; negative ids do not count from its end
            check_positions(xp, pos, cos.shape[0], position_ids_where)
            cos = xp.take(cos, xp.reshape(pos, (-1,)), axis=0)
            sin = xp.take(sin, xp.reshape(pos, (-1,)), axis=0)
            cos = xp.reshape(cos, pos.shape + (cos.shape[-1],))
            sin = xp.reshape(sin, pos.shape + (sin.shape[-1],))
        # (B, S, rot/2) -> (B, S, 1, rot/2) against (B, S, H, D)
        cos = widen(cos, ct)[:, :, None, :]
        sin = widen(sin, ct)[:, :, None, :]
        y = rotate(xp, widen(x4, ct), cos, sin, interleaved, rot).astype(x.dtype)
        if x.ndim == 3:
            return (xp.reshape(y, shape),)
        return (xp.transpose(y, (0, 2, 1, 3)),)

    return run
