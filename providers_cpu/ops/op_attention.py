"""ONNX Attention (opsets 23-25) on NumPy: float32/float64 through ``grouped_sdpa``.

What the exporters write (torch's ``F.scaled_dot_product_attention`` at opset 23, with
or without a KV cache, GQA, boolean or float masks, causal, softcap) runs here; a
requested ``qk_matmul_output`` (output 3), a ``softmax_precision`` other than the
input's and half-precision inputs go to the generic kernel, which stays the reference.
"""

from __future__ import annotations

import math

import numpy as np

from onnxep.providers.dtypes import np_dtype
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops.op_attention import attention as generic
from onnxep.providers.ops.op_attention import attention_bias

from .attention_cpu import grouped_sdpa

_FLOATS = ("float", "float16", "bfloat16", "double")
_FAST = (np.dtype(np.float32), np.dtype(np.float64))


@kernel("Attention", since=(23, 24, 25), dtypes={0: _FLOATS, 1: _FLOATS, 2: _FLOATS})
def attention(node: NodeInfo, xp):
    general = generic(node, xp)
    sm_prec = node.attr("softmax_precision", None)
    in_dt = node.input_dtype(0)
    if (
        node.has_output(3)
        or in_dt is None
        or np.dtype(in_dt) not in _FAST
        or (sm_prec is not None and np_dtype(int(sm_prec)) != np.dtype(in_dt))
    ):
        return general
    is_causal = bool(node.attr("is_causal", 0))
    q_heads = node.attr("q_num_heads", None)
    kv_heads = node.attr("kv_num_heads", None)
    scale_attr = node.attr("scale", None)
    cap = float(node.attr("softcap", 0.0))
    left = int(node.attr("left_window_size", -1)) if node.opset >= 25 else -1
    right = int(node.attr("right_window_size", -1)) if node.opset >= 25 else -1

    def run(q, k, v, mask=None, past_k=None, past_v=None, nonpad=None):
        ct = q.dtype
        same = k.dtype == ct and v.dtype == ct
        if q.ndim == 3:
            if q_heads is None or kv_heads is None or not same:
                return general(q, k, v, mask, past_k, past_v, nonpad)
            b, lq, _ = q.shape
            q4 = q.reshape(b, lq, q_heads, -1).transpose(0, 2, 1, 3)
            k4 = k.reshape(b, k.shape[1], kv_heads, -1).transpose(0, 2, 1, 3)
            v4 = v.reshape(b, v.shape[1], kv_heads, -1).transpose(0, 2, 1, 3)
        else:
            q4, k4, v4 = q, k, v
        if not same or q4.shape[1] % max(k4.shape[1], 1):
            return general(q, k, v, mask, past_k, past_v, nonpad)
        if past_k is not None:
            if past_k.dtype != ct or past_v is None or past_v.dtype != ct:
                return general(q, k, v, mask, past_k, past_v, nonpad)
            k4 = np.concatenate((past_k, k4), axis=2)
            v4 = np.concatenate((past_v, v4), axis=2)
        b, hq, lq, d = q4.shape
        s = k4.shape[2]
        scale = scale_attr if scale_attr is not None else 1.0 / math.sqrt(d)
        bias = attention_bias(np, mask, past_k, nonpad, lq, s, b, ct, is_causal, left, right)
        y = grouped_sdpa(q4, k4, v4, scale, bias, cap)
        if q.ndim == 3:
            y = y.transpose(0, 2, 1, 3).reshape(b, lq, -1)
        return (y, k4, v4, None)

    return run
