"""One compiled pass per call for the row norms and gates of small decoders (numba).

A decode step of a small model normalizes one row of 64 to a few thousand values per
node. NumPy needs six to nine calls for one RMSNorm (square-sum, scale, add, sqrt,
reciprocal, two products, the residual add), each 1-2.5 us of dispatch on a 2-core Zen 3
against nanoseconds of arithmetic: SkipSimplifiedLayerNormalization took 20 us a node,
LpNormalization 22, GatedRMSNorm 41, LinearAttentionGate 24 on the tiny hybrid decoder
(onnxruntime's: 8, 5, 20, 9). Here each is one numba call over float32 rows
(about 1.2 us of dispatch): docs/cpu_kernels.md, "Tiny decoders".

Sums of squares and absolute values accumulate in float64 and the scale is rounded to
float32 once per row, so results are within an ulp or two of the NumPy passes (which
sum in float32, pairwise). Activations use float32 ``exp`` per value.

Callers check dtypes and shapes; every function here assumes them. Without
numba (``jit.ENABLED`` false) nothing here is called.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import jit

_F32 = np.dtype(np.float32)


def enabled() -> bool:
    return bool(jit.ENABLED)


def rows_ok(*arrays: np.ndarray) -> bool:
    """Every array float32. Any strides: the loops take strided arrays as they are (a
    decode loop's state is a view into its capacity buffer), and a ``reshape`` copies
    only where it must."""
    for a in arrays:
        if a.dtype != _F32:
            return False
    return True


def _get(name: str) -> Any:
    return _loops[name]()


# ------------------------------------------------------------------ RMS norms


def rms(
    x: np.ndarray,
    w: np.ndarray,
    eps: float,
    skip: np.ndarray | None = None,
    bias: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """``(rms_norm(s) * w, s)`` with ``s = x + skip + bias`` (``s`` None without a skip).

    ``x`` and ``skip`` of one shape, ``w`` and ``bias`` 1-D of the last dim, all float32
    (any strides)."""
    k = x.shape[-1]
    if x.size == 0:  # no rows, or rows of nothing: nothing to normalize
        s = None if skip is None else np.empty(x.shape, _F32)
        return np.empty(x.shape, _F32), s
    x2 = x.reshape(-1, k)
    y = np.empty(x.shape, _F32)
    if skip is None:
        _get("rms_rows")(x2, w, eps, y.reshape(-1, k))
        return y, None
    s = np.empty(x.shape, _F32)
    b = _NO_BIAS if bias is None else bias
    _get("skip_rms_rows")(
        x2, skip.reshape(-1, k), b, bias is not None, w, eps, y.reshape(-1, k), s.reshape(-1, k)
    )
    return y, s


_NO_BIAS = np.zeros(1, np.float32)


def _rms_rows(x, w, eps, y):
    rows, k = x.shape
    for i in range(rows):
        acc = 0.0
        for j in range(k):
            v = np.float64(x[i, j])
            acc += v * v
        inv = np.float32(1.0 / math.sqrt(acc / k + eps))
        for j in range(k):
            y[i, j] = x[i, j] * inv * w[j]


def _skip_rms_rows(x, skip, bias, has_bias, w, eps, y, s):
    rows, k = x.shape
    for i in range(rows):
        acc = 0.0
        for j in range(k):
            v = x[i, j] + skip[i, j]
            if has_bias:
                v += bias[j]
            s[i, j] = v
            d = np.float64(v)
            acc += d * d
        inv = np.float32(1.0 / math.sqrt(acc / k + eps))
        for j in range(k):
            y[i, j] = s[i, j] * inv * w[j]


# ------------------------------------------------------------------ Lp norm


def lp_last(x: np.ndarray, p: int) -> np.ndarray:
    """LpNormalization over the last axis (``p`` 1 or 2); a zero norm gives zeros."""
    k = x.shape[-1]
    y = np.empty(x.shape, _F32)
    if x.size:
        _get("lp_rows")(x.reshape(-1, k), p, y.reshape(-1, k))
    return y


def _lp_rows(x, p, y):
    rows, k = x.shape
    for i in range(rows):
        acc = 0.0
        for j in range(k):
            v = np.float64(x[i, j])
            acc += v * v if p == 2 else abs(v)
        norm = np.float32(math.sqrt(acc) if p == 2 else acc)
        for j in range(k):
            y[i, j] = x[i, j] / norm if norm != 0 else np.float32(0.0)


# ------------------------------------------------------------------ gated RMS norm


def gated_rms(
    x: np.ndarray, gate: np.ndarray, scale: np.ndarray, eps: float, silu: bool
) -> np.ndarray:
    """GatedRMSNorm: groups of ``len(scale)`` along the last axis, each RMS-normalized,
    times ``scale`` and ``act(gate)`` (SiLU or sigmoid); ``gate`` of x's shape."""
    c = scale.shape[0]
    y = np.empty(x.shape, _F32)
    if x.size:
        _get("gated_rms_rows")(
            x.reshape(-1, c), gate.reshape(-1, c), scale, eps, silu, y.reshape(-1, c)
        )
    return y


def _gated_rms_rows(x, gate, scale, eps, silu, y):
    rows, c = x.shape
    one = np.float32(1.0)
    for i in range(rows):
        acc = 0.0
        for j in range(c):
            v = np.float64(x[i, j])
            acc += v * v
        inv = np.float32(1.0 / math.sqrt(acc / c + eps))
        for j in range(c):
            z = gate[i, j]
            e = np.exp(-abs(z))
            sg = one / (one + e) if z >= 0 else e / (one + e)
            g = z * sg if silu else sg
            y[i, j] = x[i, j] * inv * scale[j] * g


# ------------------------------------------------------------------ linear attention gate


def attention_gate(
    a: np.ndarray,
    bias: np.ndarray,
    scale: np.ndarray,
    b: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """(scale * softplus(a + bias), sigmoid(b)) over rows of ``h = len(bias)``."""
    h = bias.shape[0]
    decay = np.empty(a.shape, _F32)
    beta = None if b is None else np.empty(b.shape, _F32)
    if a.size:
        _get("gate_rows")(a.reshape(-1, h), bias, scale, decay.reshape(-1, h))
    if b is not None and b.size:
        _get("sigmoid_flat")(b.reshape(-1), beta.reshape(-1))
    return decay, beta


def _gate_rows(a, bias, scale, out):
    rows, h = a.shape
    for i in range(rows):
        for j in range(h):
            z = a[i, j] + bias[j]
            # softplus as max(z, 0) + log1p(exp(-|z|)), the generic kernel's form
            out[i, j] = scale[j] * (max(z, np.float32(0.0)) + np.log1p(np.exp(-abs(z))))


def _sigmoid_flat(x, out):
    one = np.float32(1.0)
    for i in range(x.shape[0]):
        z = x[i]
        e = np.exp(-abs(z))
        out[i] = one / (one + e) if z >= 0 else e / (one + e)


# No fastmath: the sums keep their order and NaN/inf propagate as in NumPy.
_loops = {
    f.__name__[1:]: jit.lazy(f)
    for f in (_rms_rows, _skip_rms_rows, _lp_rows, _gated_rms_rows, _gate_rows, _sigmoid_flat)
}
