"""Winograd F(2x2, 3x3) convolution for 3x3, stride-1, undilated, ungrouped 2-D Conv.

Each 4x4 input tile d (step 2) becomes V = B^T d B, each filter g U = G g G^T
(once, for constant weights), and the 2x2 output tile is A^T (U * V) A: the 16
elementwise products over the channels are 16 GEMMs (M, C) @ (C, tiles), a
sixteenth of the positions each, so the products cost 16 / 36 of the direct
convolution's multiply-adds and no im2col buffer is built. The transforms are
compiled loops (``jit``); without numba the Conv keeps im2col + GEMM.

The transforms' entries are 0, +-1 and +-1/2, so the rounding stays close to the
direct sum's (within the parity kit's float32 tolerances of onnxruntime, with an
error of the same size as im2col's); the path is chosen by shape and dtype only,
never by timing, so a given model always gets the same bits.
"""

from __future__ import annotations

import os

import numpy as np

from .. import jit
from ..threads import run_threads
from .nn_cpu import Scratch, parallel_rows

_G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])
_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
# Below these channel counts the 16 GEMMs are too thin to beat one im2col GEMM
# (the stem's 3 input channels): measured in docs/cpu_kernels.md.
MIN_IN = 8
MIN_OUT = 8
# Only on one BLAS thread: with more, each of the 16 products is split and pays BLAS's
# thread hand-off (the im2col path pays it once); on two threads of a calm machine
# YOLOv8n ran 41.3 ms with it against 39.3 without (docs/cpu_kernels.md).
# ``ONNXEP_CPU_WINOGRAD=0`` keeps every Conv on im2col + GEMM (for A/B measurements and
# for bit-equality with results made before this path existed).
_ON = os.environ.get("ONNXEP_CPU_WINOGRAD", "1").strip() != "0"


def applies(k, strides, dil, group, c, m, dtype) -> bool:
    """Whether the Winograd path runs this convolution (shape, dtype and thread count only)."""
    return (
        len(k) == 2
        and tuple(k) == (3, 3)
        and tuple(strides) == (1, 1)
        and tuple(dil) == (1, 1)
        and group == 1
        and c >= MIN_IN
        and m >= MIN_OUT
        and np.dtype(dtype) in _DTYPES
        and _ON
        and run_threads() == 1
        and jit.ENABLED
    )


def filter_transform(w: np.ndarray, dtype) -> np.ndarray:
    """(M, C, 3, 3) weights to U (16, M, C), computed in float64 and rounded once."""
    u = np.einsum("ai,mcij,bj->abmc", _G, np.asarray(w, dtype=np.float64), _G)
    return np.ascontiguousarray(u.reshape(16, w.shape[0], w.shape[1]).astype(dtype))


def winograd(
    scratch: Scratch, x: np.ndarray, u: np.ndarray, bias: np.ndarray, pb, pe, out
) -> np.ndarray:
    """(N, C, H, W) input, U (16, M, C), bias (M,): the (N, M, *out) convolution."""
    n, c = x.shape[:2]
    m = u.shape[1]
    oh, ow = out
    th, tw = (oh + 1) // 2, (ow + 1) // 2
    # Tiles read rows and columns up to 2 * th + 2 and 2 * tw + 2: pad the far
    # edges that far (the extra zeros only reach outputs that are not written).
    hp, wp = x.shape[2] + pb[0] + pe[0], x.shape[3] + pb[1] + pe[1]
    pe2 = (pe[0] + max(0, 2 * th + 2 - hp), pe[1] + max(0, 2 * tw + 2 - wp))
    xpad = scratch.padded(x, pb, pe2)
    if not xpad.flags.c_contiguous:
        xpad = np.ascontiguousarray(xpad)
    planes = xpad.reshape(n * c, xpad.shape[2], xpad.shape[3])
    t = th * tw
    v = scratch.bufs.get(("wino_v", n * c, t, x.dtype))
    if v is None:
        v = scratch.bufs[("wino_v", n * c, t, x.dtype)] = np.empty((16, n * c, t), x.dtype)
    fin = jit.loop("winograd_in")
    parallel_rows(n * c, n * c * t * 16, lambda r0, r1: fin(planes, th, tw, r0, r1, v))
    key = ("wino_m", n * m, t, x.dtype)
    prod = scratch.bufs.get(key)
    if prod is None:
        prod = scratch.bufs[key] = np.empty((16, n * m, t), x.dtype)
    if n == 1:
        np.matmul(u, v, out=prod)
    else:
        # (16, M, C) @ (16, C, N * T): one GEMM per tile position over every image.
        vv = v.reshape(16, n, c, t).transpose(0, 2, 1, 3).reshape(16, c, n * t)
        res = np.matmul(u, vv).reshape(16, m, n, t).transpose(0, 2, 1, 3)
        np.copyto(prod.reshape(16, n, m, t), res)
    y = np.empty((n, m, oh, ow), x.dtype)
    fout = jit.loop("winograd_out")
    rows = y.reshape(n * m, oh, ow)
    parallel_rows(n * m, n * m * t * 16, lambda r0, r1: fout(prod, bias, tw, r0, r1, rows))
    return y
