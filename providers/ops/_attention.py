"""Shared math for the attention and rotary kernels (ONNX and com.microsoft).

Everything works on arrays of the provider namespace ``xp``. Low-precision
inputs (float16, bfloat16) are widened to float32 before any matmul or
softmax, so sums accumulate in float32; float64 stays float64.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

NEG_INF = float("-inf")


def compute_dtype(dt: Any) -> np.dtype:
    """The dtype the math runs in for inputs of dtype ``dt``."""
    return np.dtype(np.float64) if np.dtype(dt) == np.float64 else np.dtype(np.float32)


def widen(x: Any, ct: np.dtype) -> Any:
    return x if x.dtype == ct else x.astype(ct)


def softmax_rows(xp: Any, x: Any) -> Any:
    """Softmax over the last axis; a row that is entirely ``-inf`` gives zeros, not NaN."""
    m = xp.max(x, axis=-1, keepdims=True)
    m = xp.where(xp.isinf(m) & (m < 0), xp.zeros_like(m), m)
    e = xp.exp(x - m)
    s = xp.sum(e, axis=-1, keepdims=True)
    s = xp.where(s == 0, xp.ones_like(s), s)
    return e / s


def softcap(xp: Any, x: Any, cap: float) -> Any:
    if cap and cap > 0:
        return xp.tanh(x / cap) * cap
    return x


def grouped_scores(xp: Any, q: Any, k: Any) -> Any:
    """``q @ k^T`` for q (B, Hq, L, D) and k (B, Hkv, S, D) with Hq a multiple of Hkv.

    Query head ``h`` reads key head ``h // (Hq // Hkv)``; the group is folded
    into the row axis instead of repeating K.
    """
    b, hq, lq, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    if hq == hkv:
        return xp.matmul(q, xp.swapaxes(k, -1, -2))
    g = hq // hkv
    qg = xp.reshape(q, (b, hkv, g * lq, d))
    sc = xp.matmul(qg, xp.swapaxes(k, -1, -2))
    return xp.reshape(sc, (b, hq, lq, s))


def grouped_context(xp: Any, p: Any, v: Any) -> Any:
    """``p @ v`` for p (B, Hq, L, S) and v (B, Hkv, S, Dv), grouped like :func:`grouped_scores`."""
    b, hq, lq, s = p.shape
    hkv, dv = v.shape[1], v.shape[3]
    if hq == hkv:
        return xp.matmul(p, v)
    g = hq // hkv
    pg = xp.reshape(p, (b, hkv, g * lq, s))
    return xp.reshape(xp.matmul(pg, v), (b, hq, lq, dv))


def split_heads(xp: Any, x: Any, heads: int) -> Any:
    """(B, S, H*D) -> (B, H, S, D)."""
    b, s, hd = x.shape
    return xp.transpose(xp.reshape(x, (b, s, heads, hd // heads)), (0, 2, 1, 3))


def split_qkv(xp: Any, query: Any, key: Any, value: Any, nh: int, nkv: int):
    """Q, K, V as (B, H, S, D) from separate inputs, or from packed QKV in ``query`` when
    ``key`` is None (``nh`` query heads then ``nkv`` key and ``nkv`` value heads)."""
    if key is not None:
        return split_heads(xp, query, nh), split_heads(xp, key, nkv), split_heads(xp, value, nkv)
    b, s, width = query.shape
    qkv = xp.reshape(query, (b, s, nh + 2 * nkv, width // (nh + 2 * nkv)))
    q = xp.transpose(qkv[:, :, :nh], (0, 2, 1, 3))
    k = xp.transpose(qkv[:, :, nh : nh + nkv], (0, 2, 1, 3))
    v = xp.transpose(qkv[:, :, nh + nkv :], (0, 2, 1, 3))
    return q, k, v


def merge_heads(xp: Any, x: Any) -> Any:
    """(B, H, S, D) -> (B, S, H*D)."""
    b, h, s, d = x.shape
    return xp.reshape(xp.transpose(x, (0, 2, 1, 3)), (b, s, h * d))


def additive(xp: Any, allowed: Any, ct: np.dtype) -> Any:
    """Boolean "may attend" -> 0 / -inf bias."""
    z = xp.zeros((), dtype=ct)
    return xp.where(allowed, z, xp.asarray(NEG_INF, dtype=ct))


def default_scale(head_size: int) -> float:
    return 1.0 / math.sqrt(head_size)


def rotate(xp: Any, x: Any, cos: Any, sin: Any, interleaved: bool, rot_dim: int) -> Any:
    """Apply rotary embedding to the last axis of ``x``.

    ``cos``/``sin`` broadcast against ``x[..., :rot_dim//2]``. Only the first
    ``rot_dim`` channels rotate; the rest pass through.
    """
    head = x.shape[-1]
    xr = x[..., :rot_dim] if rot_dim < head else x
    half = rot_dim // 2
    if interleaved:
        pairs = xp.reshape(xr, xr.shape[:-1] + (half, 2))
        x1, x2 = pairs[..., 0], pairs[..., 1]
    else:
        x1, x2 = xr[..., :half], xr[..., half:]
    real = cos * x1 - sin * x2
    imag = sin * x1 + cos * x2
    if interleaved:
        out = xp.reshape(xp.stack((real, imag), axis=-1), xr.shape)
    else:
        out = xp.concatenate((real, imag), axis=-1)
    if rot_dim < head:
        out = xp.concatenate((out, x[..., rot_dim:].astype(out.dtype)), axis=-1)
    return out


def contrib_mask_bias(xp, mask, unidirectional, b, s, past, total, ct, filter_value):
    """onnxruntime-style mask for Attention/MultiHeadAttention as an additive (B, 1, S, T) bias.

    Disallowed keys get ``filter_value`` (finite, -10000 by default) rather
    than -inf, so a row with no allowed key averages uniformly like onnxruntime
    instead of producing zeros; future keys (``unidirectional``) get the dtype's
    lowest value, as onnxruntime's causal mask. ``mask`` may be key lengths (B,),
    end and start positions (2B,), a 0/1 raw mask (B, T) or (B, S, T), or a
    (B, 1, M, M) Megatron mask read at rows [past, past + S).
    """
    if mask is None and not unidirectional:
        return None
    j = xp.reshape(xp.arange(total), (1, 1, 1, total))
    allowed = None
    if mask is not None:
        if mask.ndim == 1:
            m = mask.astype(xp.int64)
            if mask.shape[0] == b:
                allowed = j < xp.reshape(m, (b, 1, 1, 1))
            elif mask.shape[0] == 2 * b:
                end = xp.reshape(m[:b], (b, 1, 1, 1))
                start = xp.reshape(m[b:], (b, 1, 1, 1))
                allowed = (j < end) & (j >= start)
            else:
                raise ValueError(
                    f"attention mask of shape {mask.shape} is not (B,) or (2B,) with B={b}"
                )
        elif mask.ndim == 2:
            allowed = xp.reshape(mask[:, -total:] > 0, (b, 1, 1, total))
        elif mask.ndim == 3:
            allowed = xp.reshape(mask[:, :, -total:] > 0, (b, 1, s, total))
        elif mask.ndim == 4:
            allowed = mask[:, :, past : past + s, :total] > 0
        else:
            raise ValueError(f"attention mask of rank {mask.ndim} is not supported")
    zero, filt = xp.zeros((), dtype=ct), xp.asarray(filter_value, dtype=ct)
    bias = None if allowed is None else xp.where(allowed, zero, filt)
    if unidirectional:
        i = xp.reshape(xp.arange(s), (1, 1, s, 1))
        # onnxruntime masks future keys outright (the dtype's lowest value) and padding
        # softly (the filter value), so a row whose past keys are all padding still
        # averages over them and never over the future
        low = xp.asarray(float(np.finfo(np.dtype(ct)).min), dtype=ct)
        causal = xp.where(j <= i + past, zero, low)
        bias = causal if bias is None else xp.maximum(bias + causal, low)
    return bias


def contrib_sdpa(xp, q, k, v, scale, bias=None, attn_bias=None):
    """Plain softmax attention on (B, N, S, H) x (B, N, T, H): the onnxruntime contrib flavour."""
    scores = xp.matmul(q, xp.swapaxes(k, -1, -2)) * q.dtype.type(scale)
    if bias is not None:
        scores = scores + bias
    if attn_bias is not None:
        scores = scores + attn_bias
    return xp.matmul(softmax_rows(xp, scores), v)
