"""onnxep::Attention: ONNX Attention-23 under onnxep's domain, emitted by ``fuse_attention``.

Same inputs ``(Q, K, V, attn_mask, past_key, past_value)``, outputs ``(Y,
present_key, present_value, qk_matmul_output)`` and attributes as
Attention-23; K and V with fewer heads than Q are read by query-head group
(GQA), a bool mask says which keys take part, a float mask is added to the
scaled scores. The generic kernel is the ONNX op's own (it accumulates
float16 and bfloat16 in float32 and rounds once at the end); what it adds is
the checks Attention-23's shape rules imply, so a bad input is a clear error
here rather than a reshape failure deep in the math.
"""

from __future__ import annotations

from typing import Any

from onnxep.errors import InvalidArgument
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from . import op_attention
from .fused import FLOATS

#: Attention-23's inputs; opset 24's ``nonpad_kv_seqlen`` is not part of the contract.
_INPUTS = 6


@kernel("Attention", domain="onnxep", dtypes={0: FLOATS, 1: FLOATS, 2: FLOATS})
def onnxep_attention(node: NodeInfo, xp: Any):
    if node.num_inputs > _INPUTS:
        raise InvalidArgument(
            f"{node.describe()}: onnxep::Attention takes Attention-23's {_INPUTS} inputs "
            f"(Q, K, V, attn_mask, past_key, past_value); got {node.num_inputs}"
        )
    inner = op_attention.attention(node, xp)

    def run(q, k, v, mask=None, past_k=None, past_v=None):
        _check_heads(node, q, k, v)
        return inner(q, k, v, mask, past_k, past_v)

    return run


def _check_heads(node: NodeInfo, q: Any, k: Any, v: Any) -> None:
    """4-D Q, K, V agree on batch, K and V on heads and length, and Q's heads are a
    multiple of K's (each K/V head serves a group of query heads)."""
    if q.ndim != 4:
        return  # 3-D inputs: Attention-23 splits heads by attribute, and checks them there
    if k.ndim != 4 or v.ndim != 4:
        raise InvalidArgument(
            f"{node.describe()}: Q is 4-D {tuple(q.shape)}, so K and V must be 4-D "
            f"[batch, kv_heads, kv_length, head_size]; got K {tuple(k.shape)}, V {tuple(v.shape)}"
        )
    b, hq, _, d = q.shape
    if k.shape[0] != b or v.shape[0] != b or k.shape[3] != d:
        raise InvalidArgument(
            f"{node.describe()}: Q {tuple(q.shape)} and K {tuple(k.shape)} / V "
            f"{tuple(v.shape)} must share the batch, and Q and K the head size"
        )
    hkv = k.shape[1]
    if v.shape[1] != hkv or v.shape[2] != k.shape[2]:
        raise InvalidArgument(
            f"{node.describe()}: K {tuple(k.shape)} and V {tuple(v.shape)} must have the same "
            "number of heads and the same length"
        )
    if hkv == 0 or hq % hkv:
        raise InvalidArgument(
            f"{node.describe()}: Q's {hq} heads are not a multiple of K and V's {hkv} heads; "
            "each K/V head must serve a whole group of query heads"
        )
