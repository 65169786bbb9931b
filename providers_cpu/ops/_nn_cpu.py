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
    buf = np.empty(shape, dtype=x.dtype)
    buf[(Ellipsis, *(slice(b, b + n) for b, n in zip(pb, sp)))] = x
    # Fill only the border slabs, not the whole buffer.
    k = len(lead)
    for a, (b, e) in enumerate(zip(pb, pe)):
        idx = [slice(None)] * len(shape)
        if b:
            idx[k + a] = slice(0, b)
            buf[tuple(idx)] = value
        if e:
            idx[k + a] = slice(shape[k + a] - e, None)
            buf[tuple(idx)] = value
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
    if xpad.flags.c_contiguous:
        # The ndarray constructor is several times cheaper than as_strided.
        return np.ndarray(shape, dtype=xpad.dtype, buffer=xpad, offset=0, strides=strides)
    return as_strided(xpad, shape=shape, strides=strides, writeable=False)


def window_reduce(xpad: np.ndarray, kernel, strides, dilations, out, ufunc) -> np.ndarray:
    """Reduce every pooling window of ``xpad`` (N, C, *padded) with ``ufunc``: (N, C, *out).

    The reduction runs axis by axis on the flattened spatial block, at every
    position (not only the strided ones), so each ufunc call streams one long
    contiguous run; the strided window starts are picked out at the end. That
    beats reducing strided views, whose short inner loops numpy cannot vectorize.
    """
    nsp = len(kernel)
    lead = xpad.shape[: xpad.ndim - nsp]
    sp = xpad.shape[xpad.ndim - nsp :]
    rows = 1
    for v in lead:
        rows *= v
    # One flat run over all rows: windows that wrap into the next row or
    # channel are computed too but never picked.
    flat = np.ascontiguousarray(xpad).reshape(-1)
    plane = flat.shape[0] // max(rows, 1)
    elem = [1] * nsp
    for i in range(nsp - 2, -1, -1):
        elem[i] = elem[i + 1] * sp[i + 1]
    cur = flat
    for a in range(nsp):
        k, d = kernel[a], dilations[a]
        if k == 1:
            continue
        shift = d * elem[a]
        n = cur.shape[0] - (k - 1) * shift
        acc = ufunc(cur[0:n], cur[shift : shift + n])
        for j in range(2, k):
            ufunc(acc, cur[j * shift : j * shift + n], out=acc)
        cur = acc
    if cur is flat:
        cur = flat.copy()
    isz = cur.itemsize
    view = np.ndarray(
        (rows, *out),
        dtype=cur.dtype,
        buffer=cur,
        offset=0,
        strides=(plane * isz, *(s * e * isz for s, e in zip(strides, elem))),
    )
    return np.ascontiguousarray(view).reshape(*lead, *out)
