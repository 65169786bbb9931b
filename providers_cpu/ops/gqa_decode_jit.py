"""One decode token of GroupQueryAttention in one compiled pass (numba): the rotary
embedding of q and k, the present caches (past plus the new row), and each query head's
softmax over the cache with its readout.

The NumPy fast path (op_group_query_attention.py) is about fifteen calls (transposes, two
concatenations, two batched products, the softmax's four passes): 53 us a node on the
2-core Zen 3 for 4 heads of 32 over 17 cached rows, where onnxruntime's takes 20. The
arithmetic is the NumPy path's, in float32: q and k rotated (``attention.rotate``), q
times the scale, the scores' dot products over the head in order, the row's maximum
subtracted before ``exp``, the sum divided out, the readout summed over the cache in
order (BLAS sums in another order: results agree to float32 rounding).
"""

from __future__ import annotations

import numpy as np

from .. import jit

_NO_ROWS = np.zeros((1, 1), np.float32)


def token(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    past_k: np.ndarray | None,
    past_v: np.ndarray | None,
    cos: np.ndarray | None,
    sin: np.ndarray | None,
    interleaved: bool,
    scale: float,
    filled: int | None = None,
    in_place: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(y (B, 1, nh * D), present_k, present_v) for one token.

    ``q`` (B, nh, D), ``k`` and ``v`` (B, nkv, D) (views of a packed input), the pasts
    (B, nkv, P, D) or None, ``cos``/``sin`` the new position's rows (D_rot / 2,) or None
    (no rotary); float32, any strides. ``filled`` None: the pasts are all cached rows and
    the presents (B, nkv, P + 1, D) are new arrays. Else the pasts are fixed-capacity
    buffers holding ``filled`` rows (``filled`` < P): the presents are the buffers with
    the new row at ``filled`` (the rows after it as they were), written into the pasts
    themselves when ``in_place`` (the caller gave them up), else into copies."""
    b, nh, d = q.shape
    nkv = k.shape[1]
    y = np.empty((b, 1, nh * d), np.float32)
    if filled is None:
        p = 0 if past_k is None else past_k.shape[2]
        pk = np.empty((b, nkv, p + 1, d), np.float32)
        pv = np.empty((b, nkv, p + 1, d), np.float32)
        empty = np.empty((b, nkv, 0, d), np.float32)
        src_k = empty if past_k is None else past_k
        src_v = empty if past_v is None else past_v
    else:
        p = filled
        pk, pv = (past_k, past_v) if in_place else (past_k.copy(), past_v.copy())
        src_k, src_v = pk, pv  # rows before ``p`` are where they are: nothing to copy
    rot = cos is not None
    c = cos.reshape(1, -1) if rot else _NO_ROWS
    s = sin.reshape(1, -1) if rot else _NO_ROWS
    _loop()(
        q,
        k,
        v,
        src_k,
        src_v,
        c,
        s,
        rot,
        interleaved,
        np.float32(scale),
        y.reshape(b, nh, d),
        pk,
        pv,
        p,
        filled is None,
    )
    return y, pk, pv


def _rotate(x, c, s, interleaved, out):
    """``attention.rotate`` of one head's row ``x`` into ``out`` (the first 2 * len(c)
    values rotate, the rest pass through)."""
    half = c.shape[1]
    d = x.shape[0]
    for i in range(half):
        if interleaved:
            x1 = x[2 * i]
            x2 = x[2 * i + 1]
        else:
            x1 = x[i]
            x2 = x[half + i]
        re = c[0, i] * x1 - s[0, i] * x2
        im = s[0, i] * x1 + c[0, i] * x2
        if interleaved:
            out[2 * i] = re
            out[2 * i + 1] = im
        else:
            out[i] = re
            out[half + i] = im
    for i in range(2 * half, d):
        out[i] = x[i]


def _token(q, k, v, past_k, past_v, c, s, rot, interleaved, scale, y, pk, pv, p, copy):
    b, nh, d = q.shape
    nkv = k.shape[1]
    t = p + 1
    group = nh // nkv
    qr = np.empty(d, np.float32)
    scores = np.empty(t, np.float32)
    for i in range(b):
        for h in range(nkv):
            for r in range(p if copy else 0):
                for j in range(d):
                    pk[i, h, r, j] = past_k[i, h, r, j]
                    pv[i, h, r, j] = past_v[i, h, r, j]
            if rot:
                _rotate(k[i, h], c, s, interleaved, pk[i, h, p])
            else:
                for j in range(d):
                    pk[i, h, p, j] = k[i, h, j]
            for j in range(d):
                pv[i, h, p, j] = v[i, h, j]
            for g in range(group):
                hq = h * group + g
                if rot:
                    _rotate(q[i, hq], c, s, interleaved, qr)
                else:
                    for j in range(d):
                        qr[j] = q[i, hq, j]
                for j in range(d):
                    qr[j] = qr[j] * scale
                top = -np.inf
                for r in range(t):
                    acc = np.float32(0.0)
                    for j in range(d):
                        acc += qr[j] * pk[i, h, r, j]
                    scores[r] = acc
                    if acc > top:
                        top = acc
                total = np.float32(0.0)
                for r in range(t):
                    e = np.exp(scores[r] - top)
                    scores[r] = e
                    total += e
                for j in range(d):
                    y[i, hq, j] = 0.0
                for r in range(t):
                    w = scores[r] / total
                    for j in range(d):
                        y[i, hq, j] += w * pv[i, h, r, j]


_loop = jit.lazy(_token, helpers=("_rotate",))
