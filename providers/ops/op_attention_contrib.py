"""com.microsoft Attention: packed QKV projection + multi-head attention (BERT/GPT-2 style)."""

from __future__ import annotations

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops._attention import (
    compute_dtype,
    contrib_mask_bias,
    contrib_sdpa,
    default_scale,
    merge_heads,
    split_heads,
    widen,
)


def packed_attention(node: NodeInfo, xp):
    """The attention after Attention's (and QAttention's) QKV projection, parsed once.

    Returns ``attend(proj, dtype, mask, past, attn_bias) -> (output, present)`` for the
    projected and biased (B, S, Dq + Dk + Dv) ``proj`` in its compute dtype.
    """
    op = f"{node.op_type} (com.microsoft)"
    nh = int(node.attr("num_heads"))
    scale_attr = float(node.attr("scale", 0.0))
    filt = float(node.attr("mask_filter_value", -10000.0))
    uni = bool(node.attr("unidirectional", 0))
    sizes = node.attr("qkv_hidden_sizes", None)
    if node.attr("do_rotary", 0):
        raise NotSupported(f"{op}: do_rotary=1 is not supported")
    if node.attr("past_present_share_buffer", 0):
        raise NotSupported(f"{op}: past_present_share_buffer is not supported")

    def attend(proj, dtype, mask=None, past=None, attn_bias=None):
        ct = proj.dtype
        b, s, total_w = proj.shape
        if sizes is not None:
            dq, dk, dv = (int(t) for t in sizes)
        else:
            dq = dk = dv = total_w // 3
        q = split_heads(xp, proj[..., :dq], nh)
        k = split_heads(xp, proj[..., dq : dq + dk], nh)
        v = split_heads(xp, proj[..., dq + dk : dq + dk + dv], nh)
        pl = 0
        if past is not None:
            pl = past.shape[3]
            k = xp.concatenate((widen(past[0], ct), k), axis=2)
            v = xp.concatenate((widen(past[1], ct), v), axis=2)
        total = k.shape[2]
        scale = scale_attr if scale_attr else default_scale(q.shape[-1])
        mbias = contrib_mask_bias(xp, mask, uni, b, s, pl, total, ct, filt)
        ab = widen(attn_bias, ct) if attn_bias is not None else None
        y = merge_heads(xp, contrib_sdpa(xp, q, k, v, scale, mbias, ab)).astype(dtype)
        present = None
        if node.has_output(1):
            present = xp.stack((k, v), axis=0).astype(dtype)
        return (y, present)

    return attend


@kernel("Attention", since=1, domain="com.microsoft", dtypes={0: ("float", "float16", "bfloat16")})
def attention_contrib(node: NodeInfo, xp):
    if node.has_input(6):
        raise NotSupported("Attention (com.microsoft): past_sequence_length is not supported")
    attend = packed_attention(node, xp)

    def run(x, w, bias=None, mask=None, past=None, attn_bias=None, *_):
        ct = compute_dtype(x.dtype)
        proj = xp.matmul(widen(x, ct), widen(w, ct))
        if bias is not None:
            proj = proj + widen(bias, ct)
        return attend(proj, x.dtype, mask, past, attn_bias)

    return run
