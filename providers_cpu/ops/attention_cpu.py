"""Grouped scaled-dot-product attention on NumPy in a few BLAS calls and in-place passes.

The query heads that share a KV head are stacked on the row axis, so scores and context
are each one stacked matmul ``(B, Hkv, G*L, D) @ (B, Hkv, D, S)`` over all heads at once
(no repeated K/V, no Python loop over heads); the scale is applied to Q (L*D values,
not L*S), the bias is added and the softmax taken in place on the scores.
"""

from __future__ import annotations

import numpy as np


def c_order(x: np.ndarray, dtype: np.dtype, scale: float | None = None) -> np.ndarray:
    """``x`` (times ``scale``) as a C-contiguous ``dtype`` array, in one pass."""
    out = np.empty(x.shape, dtype=dtype)
    if scale is None:
        np.copyto(out, x, casting="unsafe")
    else:
        np.multiply(x, dtype.type(scale), out=out, casting="unsafe")
    return out


def grouped_sdpa(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scale: float,
    bias: np.ndarray | None = None,
    cap: float = 0.0,
) -> np.ndarray:
    """softmax(cap(q k^T * scale) + bias) v for q (B, Hq, L, D), k/v (B, Hkv, S, D[v]).

    ``bias`` broadcasts to (B, Hq, L, S); a row whose bias is all ``-inf`` gives zeros,
    as the generic kernels. Returns (B, Hq, L, Dv) in the dtype of ``q``.
    """
    b, hq, lq, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    g = hq // hkv
    ct = q.dtype
    qg = c_order(q, ct, None if cap else scale).reshape(b, hkv, g * lq, d)
    kt = np.ascontiguousarray(k.transpose(0, 1, 3, 2))  # BLAS runs faster on it
    scores = np.matmul(qg, kt)  # (B, Hkv, G*L, S)
    if cap:
        # the cap acts on the scaled logits: scale and divide by the cap in one multiply
        scores *= ct.type(scale / cap)
        np.tanh(scores, out=scores)
        scores *= ct.type(cap)
    s5 = scores.reshape(b, hkv, g, lq, s)
    if bias is not None:
        bias = np.asarray(bias)
        b4 = bias.reshape((1,) * (4 - bias.ndim) + bias.shape)
        if b4.shape[1] == hq and g > 1:
            b5 = b4.reshape(b4.shape[0], hkv, g, *b4.shape[2:])
        else:
            b5 = b4[:, :, None]
        s5 += b5
    m = scores.max(axis=-1, keepdims=True)
    dead = None
    if bias is not None and not np.isfinite(m).all():
        # rows with no attendable key, decided on the bias (not on the logits): zeros
        top = b5.max(axis=-1, keepdims=True)
        dead = np.broadcast_to(np.isneginf(top), s5.shape[:-1] + (1,)).reshape(m.shape)
        m[dead] = 0
    scores -= m
    np.exp(scores, out=scores)
    # the row sums as one matrix-vector product: a BLAS call, not a reduction per row
    tot = np.matmul(scores, np.ones((s, 1), dtype=ct))
    if dead is not None:
        tot[dead] = 1
    scores /= tot
    if dead is not None:
        np.copyto(scores, 0, where=dead)
    ctx = np.matmul(scores, v)  # (B, Hkv, G*L, Dv)
    return ctx.reshape(b, hq, lq, v.shape[-1])
