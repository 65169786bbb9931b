"""One token of com.microsoft LinearAttention in one compiled pass (numba): decay, delta
update and readout per head, the state written once.

The generic kernel's decode step is about twenty NumPy calls over (B, H, dk, dv) views
(exp, two matmuls, broadcasts, a transpose and a concatenate): 50 us a node on the 2-core
Zen 3 for 4 heads of 16 x 32, where onnxruntime's takes 34. The arithmetic is the
generic ``_step``'s, in float32, in the same order per element:
  S = exp(g) S;  u = b (v - S^T k);  S = S + k u^T;  o = scale * (q^T S)
(without a decay or an update rate, the ``linear``/``gated``/``delta`` rules drop
those terms). The dot products S^T k and q^T S sum over dk in order.
"""

from __future__ import annotations

import numpy as np

from .. import jit

_NONE = np.zeros((1, 1), np.float32)


def token(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    state: np.ndarray | None,
    decay: np.ndarray | None,
    beta: np.ndarray | None,
    hq: int,
    hkv: int,
    dk: int,
    scale: float,
) -> tuple[np.ndarray, np.ndarray]:
    """(o (B, 1, hkv * group * dv), new state (B, hkv, dk, dv)) for one token.

    ``q`` (B, hq * dk), ``k`` (B, nk * dk), ``v`` (B, hkv * dv), ``state`` (B, hkv, dk,
    dv) or None (zeros), ``decay`` (B, hkv * dk) or (B, hkv), ``beta`` (B, hkv) or (B, 1);
    float32, any strides."""
    b = q.shape[0]
    dv = v.shape[1] // hkv
    group = hq // hkv if hq >= hkv else 1
    o = np.empty((b, 1, hkv * group * dv), np.float32)
    new = np.empty((b, hkv, dk, dv), np.float32)
    s0 = np.zeros((b, hkv, dk, dv), np.float32) if state is None else state
    g = _NONE if decay is None else decay
    bt = _NONE if beta is None else beta
    _loop()(
        q,
        k,
        v,
        s0,
        g,
        decay is not None,
        bt,
        beta is not None,
        hq,
        hkv,
        dk,
        scale,
        o.reshape(b, hkv * group, dv),
        new,
    )
    return o, new


def _token(q, k, v, s0, g, has_g, bt, has_b, hq, hkv, dk, scale, o, s):
    b = q.shape[0]
    dv = s.shape[3]
    nk = k.shape[1] // dk
    group = hq // hkv if hq >= hkv else 1
    per_key = g.shape[1] == hkv * dk  # a decay per key dimension, else per head
    share_b = bt.shape[1] == 1
    sc = np.float32(scale)
    retrieved = np.empty(dv, np.float32)
    for i in range(b):
        for h in range(hkv):
            kh = h // (hkv // nk)
            for r in range(dk):
                if has_g:
                    e = np.exp(g[i, h * dk + r] if per_key else g[i, h])
                    for c in range(dv):
                        s[i, h, r, c] = s0[i, h, r, c] * e
                else:
                    for c in range(dv):
                        s[i, h, r, c] = s0[i, h, r, c]
            if has_b:
                rate = bt[i, 0] if share_b else bt[i, h]
                for c in range(dv):
                    retrieved[c] = 0.0
                for r in range(dk):
                    kr = k[i, kh * dk + r]
                    for c in range(dv):
                        retrieved[c] += kr * s[i, h, r, c]
                for c in range(dv):
                    retrieved[c] = rate * (v[i, h * dv + c] - retrieved[c])
            else:
                for c in range(dv):
                    retrieved[c] = v[i, h * dv + c]
            for r in range(dk):
                kr = k[i, kh * dk + r]
                for c in range(dv):
                    s[i, h, r, c] += kr * retrieved[c]
            for gi in range(group):
                qh = h * group + gi if hq >= hkv else h // (hkv // hq)
                row = h * group + gi
                for c in range(dv):
                    o[i, row, c] = 0.0
                for r in range(dk):
                    qr = q[i, qh * dk + r]
                    for c in range(dv):
                        o[i, row, c] += qr * s[i, h, r, c]
                for c in range(dv):
                    o[i, row, c] *= sc


_loop = jit.lazy(_token)
