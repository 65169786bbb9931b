"""DFT (opset 17: axis attribute; opset 20: axis input) through xp.fft."""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel

from .nn import from_complex, to_complex


def _dft(xp, x, n, axis, inverse, onesided):
    z, is_complex = to_complex(xp, x)
    r = x.ndim
    if axis < 0:
        axis += r
    if inverse and onesided:
        if not is_complex:
            z = z.astype(xp.complex64 if z.dtype == xp.float32 else xp.complex128)
        if n is None:
            n = 2 * (x.shape[axis] - 1)
        y = xp.fft.irfft(z, n=n, axis=axis)
        return y[..., None].astype(x.dtype)
    if inverse:
        y = xp.fft.ifft(z, n=n, axis=axis)
    elif onesided and not is_complex:
        y = xp.fft.rfft(z, n=n, axis=axis)
    else:
        y = xp.fft.fft(z, n=n, axis=axis)
        if onesided:
            keep = y.shape[axis] // 2 + 1
            y = xp.take(y, xp.arange(keep), axis=axis)
    return from_complex(xp, y, x.dtype)


def _len(v):
    return None if v is None else int(np.asarray(v).reshape(-1)[0])


@kernel("DFT", since=17, host_inputs=(1,))
def dft_17(node, xp):
    axis = int(node.attr("axis", 1))
    inverse = bool(node.attr("inverse", 0))
    onesided = bool(node.attr("onesided", 0))

    def run(x, dft_length=None):
        return (_dft(xp, x, _len(dft_length), axis, inverse, onesided),)

    return run


@kernel("DFT", since=20, host_inputs=(1, 2))
def dft_20(node, xp):
    inverse = bool(node.attr("inverse", 0))
    onesided = bool(node.attr("onesided", 0))

    def run(x, dft_length=None, axis=None):
        ax = -2 if axis is None else _len(axis)
        return (_dft(xp, x, _len(dft_length), ax, inverse, onesided),)

    return run
