"""com.microsoft MultiHeadAttention: self/cross attention with bias, padding mask and KV cache."""

from __future__ import annotations

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops.attention import (
    compute_dtype,
    contrib_mask_bias,
    contrib_sdpa,
    default_scale,
    merge_heads,
    split_heads,
    widen,
)


@kernel(
    "MultiHeadAttention",
    since=1,
    domain="com.microsoft",
    dtypes={0: ("float", "float16", "bfloat16")},
)
def multi_head_attention(node: NodeInfo, xp):
    nh = int(node.attr("num_heads"))
    scale_attr = float(node.attr("scale", 0.0))
    filt = float(node.attr("mask_filter_value", -10000.0))
    uni = bool(node.attr("unidirectional", 0))
    if node.has_input(8) or node.has_input(9):
        raise NotSupported(
            "MultiHeadAttention: past_sequence_length / cache_indirection "
            "(decoder-masked beam search) are not supported"
        )
    if node.has_output(3):
        raise NotSupported("MultiHeadAttention: the qk output is not supported")

    def run(
        query,
        key=None,
        value=None,
        bias=None,
        kpm=None,
        attn_bias=None,
        past_k=None,
        past_v=None,
        *_,
    ):
        ct = compute_dtype(query.dtype)
        out_dt = query.dtype
        b, s = query.shape[0], query.shape[1]
        kv_proj = True  # key/value still need their bias and may join the cache
        if query.ndim == 5:  # packed QKV (B, S, N, 3, H)
            qf = widen(query, ct)
            q = xp.transpose(qf[:, :, :, 0], (0, 2, 1, 3))
            k = xp.transpose(qf[:, :, :, 1], (0, 2, 1, 3))
            v = xp.transpose(qf[:, :, :, 2], (0, 2, 1, 3))
        else:
            q = split_heads(xp, widen(query, ct), nh)
            if key.ndim == 5:  # packed KV (B, L, N, 2, H)
                kf = widen(key, ct)
                k = xp.transpose(kf[:, :, :, 0], (0, 2, 1, 3))
                v = xp.transpose(kf[:, :, :, 1], (0, 2, 1, 3))
            elif key.ndim == 4:  # already projected BNSH (cross-attention cache)
                k, v = widen(key, ct), widen(value, ct)
                kv_proj = False
            else:
                k = split_heads(xp, widen(key, ct), nh)
                v = split_heads(xp, widen(value, ct), nh)
        hd = q.shape[-1]
        vd = v.shape[-1]
        if bias is not None:
            bf = widen(bias, ct)
            qh = nh * hd
            q = q + xp.reshape(bf[:qh], (1, nh, 1, hd))
            if kv_proj:
                k = k + xp.reshape(bf[qh : 2 * qh], (1, nh, 1, hd))
                v = v + xp.reshape(bf[2 * qh : 2 * qh + nh * vd], (1, nh, 1, vd))
        past = 0
        if past_k is not None and kv_proj:
            past = past_k.shape[2]
            k = xp.concatenate((widen(past_k, ct), k), axis=2)
            v = xp.concatenate((widen(past_v, ct), v), axis=2)
        total = k.shape[2]
        scale = scale_attr if scale_attr else default_scale(hd)
        mbias = contrib_mask_bias(xp, kpm, uni, b, s, past, total, ct, filt)
        ab = widen(attn_bias, ct) if attn_bias is not None else None
        y = merge_heads(xp, contrib_sdpa(xp, q, k, v, scale, mbias, ab)).astype(out_dt)
        pk = k.astype(out_dt) if node.has_output(1) else None
        pv = v.astype(out_dt) if node.has_output(2) else None
        return (y, pk, pv)

    return run
