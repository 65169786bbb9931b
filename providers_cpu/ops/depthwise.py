"""Depthwise convolution on NumPy (group == input channels): shifted multiply-adds.

Each output channel is a weighted sum of shifted copies of one input plane, one
term per kernel offset. Computing the sum over the flat plane (wrapped positions
included, dropped at the end) lets every term be one contiguous ufunc call; a
stride is handled by splitting the padded input into its stride phases first
(the ``s**d`` interleaved sub-grids), after which every kernel offset is a plain
shift inside one phase plane and no computed position is wasted on skipped
outputs. Rows (image, channel) are processed in blocks that fit the L2 cache,
so the accumulator is not streamed through memory once per kernel offset.
"""

from __future__ import annotations

import numpy as np

from .. import jit
from .nn_cpu import parallel_rows

# Elements of one block's accumulator: its input rows, accumulator and
# product temporary then stay in a core's L2 cache.
_BLOCK = 1 << 16


def depthwise(xpad: np.ndarray, w: np.ndarray, k, strides, dil, out) -> np.ndarray:
    """(N, C, *padded) input, C * mult * prod(k) weights: the (N, C * mult, *out) output."""
    n, c = xpad.shape[:2]
    planes, term_plane, term_off, elem = _phases(xpad, k, strides, dil, out)
    # Flat positions computed per row: through the last kept output.
    ln = sum((o - 1) * e for o, e in zip(out, elem)) + 1
    nt = len(term_off)
    mult = w.size // (nt * c)
    rows = n * c * mult
    # Per output row (image, channel), its weight of every term.
    wk = np.ascontiguousarray(
        np.broadcast_to(w.reshape(1, c * mult, nt), (n, c * mult, nt)).reshape(rows, nt)
    )
    acc = np.empty((rows, ln), dtype=xpad.dtype)
    if jit.ENABLED:
        f = jit.loop("depthwise_rows")
        tp = np.asarray(term_plane, dtype=np.int64)
        to = np.asarray(term_off, dtype=np.int64)
        parallel_rows(rows, rows * ln * nt, lambda r0, r1: f(planes, tp, to, wk, mult, r0, r1, acc))
    else:
        _numpy_rows(planes, term_plane, term_off, wk, mult, acc)
    isz = acc.itemsize
    view = np.ndarray(
        (n, c * mult, *out),
        dtype=acc.dtype,
        buffer=acc,
        offset=0,
        strides=(c * mult * ln * isz, ln * isz, *(e * isz for e in elem)),
    )
    return np.ascontiguousarray(view)


# Channels-last loop (``jit._depthwise_2d_cl``) where it measured faster: at least two
# vectors of channels and at most 1024 output positions (a 32x32 map), or one vector on
# maps of at most 256. On larger maps the flat-plane sums' long runs win (16 channels at
# 112x112: 63 us against 150; 32 at 64x64: 47 against 74), and with fewer channels than
# a vector the lanes idle.
_CL_MAX_POSITIONS = 1024
_CL_ONE_VECTOR_POSITIONS = 256


def channels_last(c: int, mult: int, out, dtype) -> bool:
    """Whether ``depthwise_2d`` runs the channels-in-vector loop for this shape and dtype."""
    lanes = jit.vector_bytes() // np.dtype(dtype).itemsize
    positions = out[0] * out[1]
    if mult != 1 or c < lanes:
        return False
    return positions <= (_CL_MAX_POSITIONS if c >= 2 * lanes else _CL_ONE_VECTOR_POSITIONS)


def transposed_weights(w, k) -> np.ndarray:
    """The channels-last loop's weights, (KH*KW, C): made once for constant weights."""
    return np.ascontiguousarray(w.reshape(-1, k[0] * k[1]).T)


def depthwise_2d(x, w, bias, k, strides, dil, pb, out, code=0, prm=None, wt=None) -> np.ndarray:
    """2-D depthwise conv of the unpadded ``x`` (N, C, H, W) in one compiled loop (numba only).

    ``w`` holds C * mult * prod(k) weights, ``bias`` (C * mult,) or None, ``pb`` the
    top and left pads (the bottom and right ones follow from ``out``); ``code`` and
    ``prm`` a fused activation (``conv_epilogue``), applied as each row is written.
    The padding, the stride phases, the sums, the bias and the activation happen per
    input plane in cache (``jit._depthwise_2d``), with the flat-plane loop's order of
    terms: the same bits as ``depthwise`` plus the bias. Small maps with many channels
    (``channels_last``) run ``jit._depthwise_2d_cl`` instead, the same operations in the
    same order per output, a vector of channels at a time; ``wt`` is its
    ``transposed_weights``, made here when not given.
    """
    return depthwise_2d_runner(x.shape, x.dtype, w, bias, k, strides, dil, pb, out, code, prm, wt)(
        x
    )


def depthwise_2d_runner(shape, dtype, w, bias, k, strides, dil, pb, out, code=0, prm=None, wt=None):
    """``depthwise_2d`` for inputs of one shape and dtype as ``run(x) -> y``: the weights'
    layout, the loop and its arguments chosen here, once (a convolution's plan keeps it
    for constant weights; a small map's whole run is a few microseconds)."""
    n, c, h, wd = shape
    dtype = np.dtype(dtype)
    m = w.size // (k[0] * k[1])
    has_bias = bias is not None
    bv = np.ascontiguousarray(bias, dtype=dtype).reshape(m) if has_bias else np.zeros(1, dtype)
    if prm is None:
        prm = np.zeros(8, dtype)
    geo = (k[0], k[1], strides[0], strides[1], dil[0], dil[1], pb[0], pb[1])
    rows = n * m
    yshape = (n, m, *out)
    plane = out[0] * out[1]
    work = rows * plane * k[0] * k[1]
    if channels_last(c, m // c, out, dtype):
        lanes = jit.vector_bytes() // dtype.itemsize
        wt = transposed_weights(w, k) if wt is None else wt
        g = jit.loop("depthwise_2d_cl")
        blocks = -(-rows // lanes)

        def run(x):
            xc = np.ascontiguousarray(x).reshape(n * c, h, wd)
            y = np.empty(yshape, dtype)
            y2 = y.reshape(rows, plane)

            def run_blocks(b0, b1):
                r0, r1 = b0 * lanes, min(rows, b1 * lanes)
                g(xc, wt, bv, has_bias, geo, *out, lanes, code, prm, r0, r1, y2)

            # whole vectors of channels to each thread
            parallel_rows(blocks, work, run_blocks)
            return y

        return run
    wk = np.ascontiguousarray(w.reshape(m, k[0] * k[1]))
    f = jit.loop("depthwise_2d")
    mult = m // c

    def run(x):
        xc = np.ascontiguousarray(x).reshape(n * c, h, wd)
        y = np.empty(yshape, dtype)
        y2 = y.reshape(rows, plane)
        parallel_rows(
            rows,
            work,
            lambda r0, r1: f(xc, wk, bv, has_bias, mult, geo, *out, code, prm, r0, r1, y2),
        )
        return y

    return run


def _phases(xpad, k, strides, dil, out):
    """(planes (P, N*C, plane), plane of each term, flat offset of each term, element strides).

    Kernel offset ``t`` reads padded index ``o * s + t * d``: stride phase
    ``(t * d) % s`` at position ``o + (t * d) // s``. With unit strides the
    one phase is the padded input itself (no copy).
    """
    n, c = xpad.shape[:2]
    shifts = []
    phase_of: dict = {}
    term_plane = []
    for kpos in np.ndindex(*k):
        ph = tuple((t * d) % s for t, d, s in zip(kpos, dil, strides))
        term_plane.append(phase_of.setdefault(ph, len(phase_of)))
        shifts.append(tuple((t * d) // s for t, d, s in zip(kpos, dil, strides)))
    if all(s == 1 for s in strides):
        ext = list(xpad.shape[2:])
        planes = xpad.reshape(1, n * c, -1)
    else:
        ext = [o + max(sh[a] for sh in shifts) for a, o in enumerate(out)]
        planes = np.zeros((len(phase_of), n, c, *ext), dtype=xpad.dtype)
        for ph, i in phase_of.items():
            src = xpad[(Ellipsis, *(slice(p, None, s) for p, s in zip(ph, strides)))]
            # Positions past the phase's end are never read for a kept output.
            part = (Ellipsis, *(slice(0, min(e, v)) for e, v in zip(ext, src.shape[2:])))
            planes[i][part] = src[part]
        planes = planes.reshape(len(phase_of), n * c, -1)
    nsp = len(k)
    elem = [1] * nsp
    for i in range(nsp - 2, -1, -1):
        elem[i] = elem[i + 1] * ext[i + 1]
    term_off = [sum(a * e for a, e in zip(sh, elem)) for sh in shifts]
    return planes, term_plane, term_off, elem


def _numpy_rows(planes, term_plane, term_off, wk, mult, acc):
    """The pure-NumPy loop: one multiply and one add per term, over L2-sized blocks of rows."""
    rows, ln = acc.shape
    step = max(1, _BLOCK // ln)
    tmp = np.empty((min(step, rows), ln), dtype=acc.dtype)
    wcols = [np.ascontiguousarray(wk[:, i, None]) for i in range(wk.shape[1])]
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        a = acc[r0:r1]
        t = tmp[: r1 - r0]
        # Input row of each output row: r // mult (a strided pick when mult > 1).
        sel = slice(r0, r1) if mult == 1 else np.arange(r0, r1) // mult
        for i, (p, off) in enumerate(zip(term_plane, term_off)):
            src = planes[p, sel, off : off + ln]
            if i == 0:
                np.multiply(src, wcols[i][r0:r1], out=a)
            else:
                np.multiply(src, wcols[i][r0:r1], out=t)
                a += t
