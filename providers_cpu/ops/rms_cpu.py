"""RMS normalization on NumPy float32 in a few in-place passes (the fast path of the norms)."""

from __future__ import annotations

import numpy as np

from . import norms_jit


def rms_scaled(s: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """s / sqrt(mean(s^2, -1) + eps) * w, for float32 ``s`` and 1-D ``w``."""
    if norms_jit.enabled() and norms_jit.rows_ok(s, w):
        return norms_jit.rms(s, w, eps)[0]
    ms = np.einsum("...i,...i->...", s, s)[..., None]
    ms *= np.float32(1.0 / s.shape[-1])
    ms += np.float32(eps)
    np.sqrt(ms, out=ms)
    np.reciprocal(ms, out=ms)
    y = s * ms
    y *= w
    return y


def fast_ok(x: np.ndarray, w: np.ndarray) -> bool:
    return (
        x.dtype == np.float32
        and w.dtype == np.float32
        and w.ndim == 1
        and x.ndim >= 1
        and x.shape[-1] == w.shape[0]
    )
