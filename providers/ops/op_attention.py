"""ONNX Attention (opsets 23, 24, 25): SDPA with GQA, masks, caches, windows, softcap."""

from __future__ import annotations

import math

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.dtypes import np_dtype
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops.attention import (
    additive,
    compute_dtype,
    grouped_context,
    grouped_scores,
    merge_heads,
    softcap,
    softmax_rows,
    split_heads,
    widen,
)

_FLOATS = ("float", "float16", "bfloat16", "double")


@kernel("Attention", since=(23, 24, 25), dtypes={0: _FLOATS, 1: _FLOATS, 2: _FLOATS})
def attention(node: NodeInfo, xp):
    is_causal = bool(node.attr("is_causal", 0))
    q_heads = node.attr("q_num_heads", None)
    kv_heads = node.attr("kv_num_heads", None)
    scale_attr = node.attr("scale", None)
    cap = float(node.attr("softcap", 0.0))
    mode = int(node.attr("qk_matmul_output_mode", 0))
    sm_prec = node.attr("softmax_precision", None)
    left = int(node.attr("left_window_size", -1)) if node.opset >= 25 else -1
    right = int(node.attr("right_window_size", -1)) if node.opset >= 25 else -1
    if mode not in (0, 1, 2, 3):
        raise NotSupported(f"Attention: qk_matmul_output_mode={mode} is not 0..3")
    in_dt = node.input_dtype(0)
    ct = compute_dtype(in_dt) if in_dt is not None else np.dtype(np.float32)
    if sm_prec is not None and np_dtype(int(sm_prec)) == np.float64:
        ct = np.dtype(np.float64)
    want_qk = node.has_output(3)

    def run(q, k, v, mask=None, past_k=None, past_v=None, nonpad=None):
        out_dt = q.dtype
        rank3 = q.ndim == 3
        if rank3:
            if q_heads is None or kv_heads is None:
                raise ValueError("Attention: 3-D inputs need q_num_heads and kv_num_heads")
            q4 = split_heads(xp, q, q_heads)
            k4 = split_heads(xp, k, kv_heads)
            v4 = split_heads(xp, v, kv_heads)
        else:
            q4, k4, v4 = q, k, v
        if past_k is not None:
            k4 = xp.concatenate((past_k, k4.astype(past_k.dtype)), axis=2)
            v4 = xp.concatenate((past_v, v4.astype(past_v.dtype)), axis=2)
        present_k, present_v = k4, v4
        b, _, lq, d = q4.shape
        s = k4.shape[2]
        scale = scale_attr if scale_attr is not None else 1.0 / math.sqrt(d)
        # The spec scales Q and K by sqrt(scale) each (overflow guard); in
        # float32 a single multiply of the product is equivalent.
        scores = grouped_scores(xp, widen(q4, ct), widen(k4, ct)) * ct.type(scale)
        raw = scores
        scores = softcap(xp, scores, cap)
        capped = scores

        bias = attention_bias(xp, mask, past_k, nonpad, lq, s, b, ct, is_causal, left, right)
        if bias is not None:
            scores = scores + bias
        probs = softmax_rows(xp, scores)
        if bias is not None:
            # A row with no attendable key (decided on the bias, not on the
            # possibly NaN logits) is all zeros.
            dead = xp.max(bias, axis=-1, keepdims=True)
            dead = xp.isinf(dead) & (dead < 0)
            probs = xp.where(dead, xp.zeros((), dtype=ct), probs)
        y = grouped_context(xp, probs, widen(v4, ct)).astype(out_dt)
        if rank3:
            y = merge_heads(xp, y)
        qk = None
        if want_qk:
            qk = (raw, capped, scores, probs)[mode]
            if qk.ndim == 4 and qk.shape[1] != q4.shape[1]:
                qk = xp.broadcast_to(qk, (b, q4.shape[1], lq, s))
            qk = qk.astype(out_dt)
        return (y, present_k, present_v, qk)

    return run


def attention_bias(xp, mask, past_k, nonpad, lq, s, b, ct, is_causal, left, right):
    """The additive bias (0 / -inf / float mask) broadcastable to (B, H, L, S), or None."""
    bias = None
    if mask is not None:
        if mask.dtype == np.bool_:
            m = additive(xp, mask, ct)
        else:
            m = mask.astype(ct)
        pad = s - m.shape[-1]
        if pad > 0:
            fill = xp.full(m.shape[:-1] + (pad,), float("-inf"), dtype=ct)
            m = xp.concatenate((m, fill), axis=-1)
        bias = m
    if is_causal or left >= 0 or right >= 0:
        i = xp.reshape(xp.arange(lq), (lq, 1))
        j = xp.reshape(xp.arange(s), (1, s))
        if past_k is not None:
            pos = i + past_k.shape[2]
        elif nonpad is not None:
            off = xp.reshape(nonpad.astype(xp.int64), (-1, 1, 1, 1)) - lq
            pos = i + off  # (B, 1, L, 1)
        else:
            pos = i
        allowed = None
        if is_causal:
            allowed = j <= pos
        if left >= 0:
            w = pos - j <= left
            allowed = w if allowed is None else allowed & w
        if right >= 0:
            w = j - pos <= right
            allowed = w if allowed is None else allowed & w
        a = additive(xp, allowed, ct)
        bias = a if bias is None else bias + a
    if nonpad is not None:
        keep = xp.reshape(xp.arange(s), (1, s)) < xp.reshape(nonpad.astype(xp.int64), (-1, 1))
        a = xp.reshape(additive(xp, keep, ct), (b, 1, 1, s))
        bias = a if bias is None else bias + a
    return bias
