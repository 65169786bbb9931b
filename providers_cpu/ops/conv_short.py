"""1-D convolutions of a few output positions (a short audio frame's encoder) in one
compiled call.

silero and akiki VAD's encoder convs are [64-128 filters] x [64-129 channels x 3 taps] on
1-4 output positions: a product of a few microseconds that the im2col plan wrapped in
five NumPy calls (the padding copy, the window copy, the output, BLAS, the activation),
4-5 us a node around a 1.5-12 us product; in a whole run, with the weights and the
interpreter's own data out of cache, more. Here one call copies each image's windows
into rows (the padding as zeros, the bias as a last 1), runs ``recurrent_loops.matvec``
(few_columns' loop) and stores the outputs, Relu applied as they are stored.

The route is by shape and dtype alone: float32 with numba, one group, constant weights
and bias, 1-D, at most ``MAX_POSITIONS`` outputs an image; pointwise ones too (the
decoders' [1, 128] x [128, 1]: conv_pointwise's 16-channel panels and its thread hand-off
check cost more than the product). With 2 to 6 positions the rows
and sums are few_columns' (the bits of the path it replaces, tested); one position was
BLAS's GEMV, whose order of sums differs: within float32 rounding of it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import jit

#: more positions an image and SGEMM's own kernels fit (few_columns.MAX_COLUMNS)
MAX_POSITIONS = 6
#: off: the im2col plan takes these convs (tests of that path switch it off)
ENABLED = True

_loop: Any = None


def applies(k: list[int], group: int, positions: int, dtype: Any) -> bool:
    """Whether a conv of kernel ``k`` with ``positions`` outputs an image runs here."""
    return (
        ENABLED
        and len(k) == 1
        and group == 1
        and 0 < positions <= MAX_POSITIONS
        and np.dtype(dtype) == np.float32
        and bool(jit.ENABLED)
    )


def plan(w_aug: np.ndarray, yshape: tuple, k: int, stride: int, dil: int, pb: int, relu: bool):
    """``core(x) -> y`` for inputs whose output is ``yshape`` (N, M, L): ``w_aug`` (M,
    C * k + 1) float32 with the bias column last; ``relu`` applies Relu as it stores."""
    global _loop
    if _loop is None:
        from .conv_short_loop import conv_short

        _loop = conv_short
    f = _loop
    w = np.ascontiguousarray(w_aug, dtype=np.float32)
    k, stride, dil, pb, relu = int(k), int(stride), int(dil), int(pb), bool(relu)

    def core(x: np.ndarray) -> np.ndarray:
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
        y = np.empty(yshape, np.float32)
        f(x, w, k, stride, dil, pb, relu, y)
        return y

    return core
