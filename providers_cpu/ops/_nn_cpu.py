"""NumPy-only helpers for the CPU convolution and pooling kernels: strided window views."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided


def pad_input(x: np.ndarray, pb, pe, value=0) -> np.ndarray:
    """Copy ``x`` into a buffer with the spatial padding (faster than np.pad for small tensors)."""
    if not any(pb) and not any(pe):
        return x
    nsp = len(pb)
    lead = x.shape[: x.ndim - nsp]
    sp = x.shape[x.ndim - nsp :]
    shape = (*lead, *(n + b + e for n, b, e in zip(sp, pb, pe)))
    if value == 0:
        buf = np.zeros(shape, dtype=x.dtype)
    else:
        buf = np.full(shape, value, dtype=x.dtype)
    buf[(Ellipsis, *(slice(b, b + n) for b, n in zip(pb, sp)))] = x
    return buf


def window_view(xpad: np.ndarray, kernel, strides, dilations, out) -> np.ndarray:
    """Read-only view (*lead, *kernel, *out) of every window of the padded input."""
    nsp = len(kernel)
    lead = xpad.shape[: xpad.ndim - nsp]
    st = xpad.strides
    sp_st = st[xpad.ndim - nsp :]
    shape = (*lead, *kernel, *out)
    strides = (
        *st[: xpad.ndim - nsp],
        *(s * d for s, d in zip(sp_st, dilations)),
        *(s * k for s, k in zip(sp_st, strides)),
    )
    return as_strided(xpad, shape=shape, strides=strides, writeable=False)
