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


def _shape_fits(k, strides, dil, group, c, m) -> bool:
    """A 3x3 convolution of stride and dilation 1, one group, enough channels each way."""
    return (
        len(k) == 2
        and tuple(k) == (3, 3)
        and tuple(strides) == (1, 1)
        and tuple(dil) == (1, 1)
        and group == 1
        and c >= MIN_IN
        and m >= MIN_OUT
    )


def applies(k, strides, dil, group, c, m, dtype) -> bool:
    """Whether the Winograd path runs this convolution (shape, dtype and thread count only)."""
    return (
        _shape_fits(k, strides, dil, group, c, m)
        and np.dtype(dtype) in _DTYPES
        and _ON
        and run_threads() == 1
        and jit.ENABLED
    )


def compiled_applies(k, strides, dil, group, c, m, dtype, threads: int) -> bool:
    """Whether the Winograd path runs with its 16 products on the compiled GEMM: the
    shapes above, float32, in a session of more than one thread where the compiled GEMM
    runs (``conv_gemm``): it hands the products' column panels to the threads in chunks,
    where OpenBLAS split each of the 16 and paid its hand-off each time."""
    from . import conv_gemm

    return (
        COMPILED
        and threads > 1
        and _shape_fits(k, strides, dil, group, c, m)
        and np.dtype(dtype) == np.float32
        and _ON
        and conv_gemm.runs_at(threads)
    )


#: The compiled-products path (``compiled_applies``), opt-in (``ONNXEP_CPU_WINOGRAD_GEMM=1``):
#: on the loaded 2-core Zen 3 of session 11 it was no faster than the im2col-free GEMM
#: (64 -> 64 3x3 40x40, two threads, best of 25: 1.65 against 1.59 ms; 128 -> 128 20x20
#: 1.23 against 1.57; 64 -> 64 80x80 11.5 against 10.0): its transforms' passes over
#: V and the products (16 C T and 16 M T values) cost what the 16/36 multiply-adds save
#: at these sizes. Kept for a measurement on a quiet machine (docs/cpu_kernels.md).
COMPILED = os.environ.get("ONNXEP_CPU_WINOGRAD_GEMM", "0").strip() == "1"


def filter_transform(w: np.ndarray, dtype) -> np.ndarray:
    """(M, C, 3, 3) weights to U (16, M, C), computed in float64 and rounded once."""
    u = np.einsum("ai,mcij,bj->abmc", _G, np.asarray(w, dtype=np.float64), _G)
    return np.ascontiguousarray(u.reshape(16, w.shape[0], w.shape[1]).astype(dtype))


def pack_filters(u: np.ndarray) -> np.ndarray:
    """U (16, M, C) float32 as 16 panel sets of the compiled GEMM, flat per position."""
    from .packed_gemm import pack_weights

    return np.stack([pack_weights(u[p]).reshape(-1) for p in range(16)])


def _row_stride(t: int) -> int:
    """Floats between rows of V and of the products for the compiled GEMM: whole panels,
    an odd number of cache lines (rows a power of two apart share a few L1 sets)."""
    from .packed_gemm import _NR

    ts = -(-t // max(_NR, 16)) * max(_NR, 16)
    return ts + 16 * (1 - (ts // 16) % 2)


def winograd(
    scratch: Scratch,
    x: np.ndarray,
    u: np.ndarray,
    bias: np.ndarray,
    pb,
    pe,
    out,
    packed: np.ndarray | None = None,
) -> np.ndarray:
    """(N, C, H, W) input, U (16, M, C), bias (M,): the (N, M, *out) convolution; the 16
    products on the compiled GEMM when ``packed`` (``pack_filters(U)``) is given."""
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
    ts = _row_stride(t) if packed is not None else t
    v = scratch.bufs.get(("wino_v", n * c, ts, x.dtype))
    if v is None:
        # zeros: the compiled GEMM reads the lanes past t (their products are dropped)
        v = scratch.bufs[("wino_v", n * c, ts, x.dtype)] = np.zeros((16, n * c, ts), x.dtype)
    fin = jit.loop("winograd_in")
    vt = v[:, :, :t]
    parallel_rows(n * c, n * c * t * 16, lambda r0, r1: fin(planes, th, tw, r0, r1, vt))
    key = ("wino_m", n * m, ts, x.dtype)
    prod = scratch.bufs.get(key)
    if prod is None:
        prod = scratch.bufs[key] = np.empty((16, n * m, ts), x.dtype)
    if packed is not None:
        _compiled_products(packed, v, prod, n, c, m, t)
    elif n == 1:
        np.matmul(u, v, out=prod)
    else:
        # (16, M, C) @ (16, C, N * T): one GEMM per tile position over every image.
        vv = v.reshape(16, n, c, t).transpose(0, 2, 1, 3).reshape(16, c, n * t)
        res = np.matmul(u, vv).reshape(16, m, n, t).transpose(0, 2, 1, 3)
        np.copyto(prod.reshape(16, n, m, t), res)
    prod = prod[:, :, :t]
    y = np.empty((n, m, oh, ow), x.dtype)
    fout = jit.loop("winograd_out")
    rows = y.reshape(n * m, oh, ow)
    parallel_rows(n * m, n * m * t * 16, lambda r0, r1: fout(prod, bias, tw, r0, r1, rows))
    return y


def _compiled_products(packed, v, prod, n, c, m, t) -> None:
    """``prod[p, i M + r] = U[p] @ V[p, i C:(i + 1) C]`` for every tile position p and
    image i on the compiled GEMM; the threads take column panels of (p, i) pairs."""
    from .packed_gemm import _MR, _NR, ROW_BIAS, jit_gemm

    gemm = jit_gemm()
    ts = v.shape[2]
    mp = -(-m // _MR) * _MR
    panels = -(-t // _NR)
    koff = np.arange(c, dtype=np.int64) * ts
    zero = np.zeros(mp, np.float32)
    vf, pf = v.reshape(-1), prod.reshape(-1)

    def run(u0: int, u1: int) -> None:
        w = u0
        while w < u1:
            pi, q = divmod(w, panels)
            last = min(u1, (pi + 1) * panels)
            p, i = divmod(pi, n)
            b = vf[(p * n * c + i * c) * ts :]
            cc = pf[(p * n * m + i * m) * ts :]
            gemm(packed[p], _MR * c, _MR, 1, b, koff, _NR, cc, ts, mp, m, c, q * _NR,
                 (last - pi * panels) * _NR, zero, ROW_BIAS)  # fmt: skip
            w = last

    parallel_rows(16 * n * panels, 16 * n * mp * c * panels * _NR, run)
