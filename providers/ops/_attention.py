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
