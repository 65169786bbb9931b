"""CausalConvWithState's channels-first depthwise taps, bias, SiLU and new state in one
compiled pass (numba).

The generic kernel concatenates the state and the input, then adds one NumPy product per
tap, the bias and the activation in separate passes, and copies the new state out: 42 us
a node for a decode step of 256 channels on the 2-core Zen 3, where onnxruntime's takes
13. Each output is the bias (or 0), then the taps in order, as the generic kernel's sum
(``y = term_0 + term_1 ...``, bias last: here first, the same terms in float32 either
way within a rounding), then x * sigmoid(x) as ``contrib.silu`` computes it.
"""

from __future__ import annotations

import numpy as np

from .. import jit


def conv(
    x: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray | None,
    state: np.ndarray | None,
    s_len: int,
    dilation: int,
    silu: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """(y (B, C, L), present (B, C, s_len)) for float32 ``x`` (B, C, L), ``w``
    (C, K), ``bias`` (C,) and ``state`` (B, C, s_len) (None: zeros), any strides."""
    b, c, seq = x.shape
    y = np.empty((b, c, seq), np.float32)
    present = np.empty((b, c, s_len), np.float32)
    st = np.zeros((b, c, s_len), np.float32) if state is None else state
    bs = _NO_BIAS if bias is None else bias
    _loop()(x, w, bs, bias is not None, st, dilation, silu, y, present)
    return y, present


_NO_BIAS = np.zeros(1, np.float32)


def _conv(x, w, bias, has_bias, state, dil, silu, y, present):
    b, c, seq = x.shape
    k = w.shape[1]
    s_len = state.shape[2]
    start = s_len - (k - 1) * dil
    one = np.float32(1.0)
    for i in range(b):
        for ch in range(c):
            for t in range(seq):
                acc = np.float32(0.0)
                for j in range(k):
                    p = start + j * dil + t  # place in [state | x]
                    v = state[i, ch, p] if p < s_len else x[i, ch, p - s_len]
                    acc += w[ch, j] * v
                if has_bias:
                    acc += bias[ch]
                if silu:
                    e = np.exp(-abs(acc))
                    sg = one / (one + e) if acc >= 0 else e / (one + e)
                    acc = acc * sg
                y[i, ch, t] = acc
            for p in range(s_len):  # the last s_len places of [state | x]
                q = seq + p
                present[i, ch, p] = state[i, ch, q] if q < s_len else x[i, ch, q - s_len]


_loop = jit.lazy(_conv)
