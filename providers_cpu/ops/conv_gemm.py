"""A compiled float32 GEMM for im2col convolutions, for where NumPy's OpenBLAS runs AVX2 kernels.

On an AVX-512 CPU whose OpenBLAS runs an AVX2 core's kernels (``OPENBLAS_CORETYPE=Haswell``,
or a CPU OpenBLAS does not know: ``openblas_core.py``) the convolution's SGEMM runs at
about half the CPU's vector width. numba's LLVM compiles for the host CPU, so a loop over
float32 here is AVX-512 code there. The product is written in *dot* form: the weights as
``a`` (M, K) and the im2col columns transposed, ``bt`` (N, K), both contiguous along K, and
each output element a dot product of two K-runs. The micro-kernel keeps a 6x4 block of
such dot products in flight (24 accumulators; each K step loads 6 + 4 values for 24
multiply-adds), and LLVM vectorises each running sum over K into one zmm register
(``reassoc``: the lanes are added at the end, a different order than BLAS's, well inside
the tolerances onnxruntime's results are compared with; no ``nnan``/``ninf``, so NaN and
infinities propagate as they do in BLAS).

The columns are written straight in that layout: the input goes to a zero-bordered
channels-last buffer (H, W, C), whose windows are (kh, kw, C) runs, so the im2col copy
moves whole channel runs, and the weights are reordered to (M, kh, kw, C) once per
session.

Which kernel computes an output column depends on its index and N alone (blocks of 4 from
0, the last N % 4 columns by the one-column kernel; rows by M alone), never on the thread
split, so results are the same bits on any thread count.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .. import jit
from ..openblas_core import AVX512_CORES, AVX512_FLAGS, cpu_flags
from .nn_cpu import parallel_rows

# ``ONNXEP_CPU_CONV_GEMM``: ``auto`` (default) where OpenBLAS runs AVX2 kernels on an
# AVX-512 CPU, ``1`` wherever numba runs (tests, A/B measurements), ``0`` never.
MODE = os.environ.get("ONNXEP_CPU_CONV_GEMM", "auto").strip().lower()

# Columns per cache block: a block of ``bt`` (cols x K floats) stays in L2 while every
# row block of the weights passes over it.
_BLOCK_BYTES = 256 << 10
# Below this many multiply-adds (M * K * N) the call and the layout copies cost more
# than BLAS's AVX2 kernel loses; the first layer's K of 27 keeps BLAS (measured, docs).
_MIN_MACS = 1 << 20
_MIN_K = 128
_MIN_M = 8


def blas_is_avx2_on_avx512() -> bool:
    """Whether a loaded OpenBLAS runs a core without AVX-512 on a CPU with it."""
    try:
        from threadpoolctl import threadpool_info

        cores = [
            (i.get("architecture") or "").lower()
            for i in threadpool_info()
            if i.get("internal_api") == "openblas"
        ]
    except Exception:  # threadpoolctl missing or failing: no evidence, keep BLAS
        return False
    flags = cpu_flags()
    if not cores or flags is None or AVX512_FLAGS - flags:
        return False
    return any(c and c not in AVX512_CORES for c in cores)


_auto: bool | None = None


def enabled() -> bool:
    """Whether convolutions may run this GEMM (decided per process; the mode by session)."""
    global _auto
    if MODE == "0" or not jit.ENABLED:
        return False
    if MODE == "1":
        return True
    if _auto is None:
        _auto = blas_is_avx2_on_avx512()
    return _auto


def jit_off() -> bool:
    """No compiled loops, without importing numba (``ENABLED`` imports it on first read)."""
    known = vars(jit).get("ENABLED")
    return known is False or not jit.jit_status().startswith("compiled loops: numba ")


def status() -> str:
    """One line for ``onnxep providers`` and the session notes: which GEMM dense float32
    convolutions run (imports nothing)."""
    if MODE == "0":
        return "dense Conv GEMM: OpenBLAS (ONNXEP_CPU_CONV_GEMM=0)"
    if jit_off():
        return "dense Conv GEMM: OpenBLAS (no compiled loops)"
    if MODE == "1":
        return "dense Conv GEMM: onnxep's compiled kernel for float32 (ONNXEP_CPU_CONV_GEMM=1)"
    if _auto if _auto is not None else blas_is_avx2_on_avx512():
        return (
            "dense Conv GEMM: onnxep's compiled AVX-512 kernel for float32 (OpenBLAS runs "
            "AVX2 kernels on this AVX-512 CPU)"
        )
    return "dense Conv GEMM: OpenBLAS"


def session_notes() -> tuple[str, ...]:
    """The status line for a session's notes where the compiled kernel runs (else none:
    OpenBLAS is what every other place says the provider runs)."""
    line = status()
    return (line,) if "compiled" in line else ()


def applies(k, group: int, m: int, ck: int, lsz: int, dtype, const_weights: bool) -> bool:
    """Whether a 2-D convolution of this shape runs here (shape and dtype only)."""
    return (
        len(k) == 2
        and group == 1
        and const_weights
        and np.dtype(dtype) == np.float32
        and m >= _MIN_M
        and ck >= _MIN_K
        and m * ck * lsz >= _MIN_MACS
        and enabled()
    )


def pack_weights(w: np.ndarray) -> np.ndarray:
    """(M, C, kh, kw) weights to the kernel's (M, kh * kw * C) rows, float32, once."""
    m = w.shape[0]
    return np.ascontiguousarray(np.asarray(w).transpose(0, 2, 3, 1).reshape(m, -1), np.float32)


class ConvGemm:
    """One image shape's convolution: channels-last padded buffer, columns, the product.

    Built once per (input shape, thread); ``__call__(x, y)`` writes the (N, M, oh * ow)
    result into ``y``.
    """

    def __init__(self, xshape, a: np.ndarray, bias: np.ndarray, k, strides, dil, pb, pe, out):
        n, c, h, w = xshape
        self.a, self.bias = a, bias
        hp, wp = h + pb[0] + pe[0], w + pb[1] + pe[1]
        self.xp = np.zeros((hp, wp, c), np.float32)
        self.interior = self.xp[pb[0] : pb[0] + h, pb[1] : pb[1] + w]
        oh, ow = out
        isz = 4
        self.view = np.ndarray(
            (oh, ow, k[0], k[1], c),
            dtype=np.float32,
            buffer=self.xp,
            strides=(
                strides[0] * wp * c * isz,
                strides[1] * c * isz,
                dil[0] * wp * c * isz,
                dil[1] * c * isz,
                isz,
            ),
        )
        self.lsz = oh * ow
        self.bt = np.empty((self.lsz, a.shape[1]), np.float32)
        self.dst = self.bt.reshape(self.view.shape)
        self.gemm = jit_gemm()

    def __call__(self, x: np.ndarray, y: np.ndarray) -> None:
        a, bias, bt, gemm = self.a, self.bias, self.bt, self.gemm
        blocks = (self.lsz + 3) // 4
        work = a.shape[0] * a.shape[1] * self.lsz
        for i in range(x.shape[0]):
            self.interior[...] = x[i].transpose(1, 2, 0)
            np.copyto(self.dst, self.view)
            yi = y[i]
            parallel_rows(blocks, work, lambda b0, b1, yi=yi: gemm(a, bt, bias, yi, 4 * b0, 4 * b1))


def jit_gemm() -> Any:
    """The compiled ``gemm(a, bt, bias, c, j0, j1)`` (compiled on first use, cached on disk)."""
    f = _compiled.get("gemm")
    if f is None:
        if not jit.ENABLED:  # imports numba
            raise RuntimeError("the Conv GEMM needs numba")
        nb = jit.nb
        opts = {"cache": True, "nogil": True, "boundscheck": False, "fastmath": _FAST}
        g = globals()
        for name in _KERNELS:
            g[name] = nb.njit(**opts)(g[name])
        f = _compiled["gemm"] = nb.njit(cache=True, nogil=True, boundscheck=False)(_gemm)
    return f


_compiled: dict[str, Any] = {}
# Reassociation (the vectorised sums over K) and fused multiply-adds; nothing that
# assumes finite values.
_FAST = {"reassoc", "contract"}
_KERNELS = ("_k6x4", "_k4x4", "_k2x4", "_k1x4", "_k6x1", "_k1x1")


def _gemm(a, bt, bias, c, j0, j1):
    """``c[:, j] = a @ bt[j] + bias`` for j in [j0, min(j1, N)); j0 a multiple of 4."""
    m, k = a.shape
    n = bt.shape[0]
    j1 = min(j1, n)
    full = n - n % 4  # columns [full, n) go to the one-column kernels
    step = max(4, (_BLOCK_BYTES // (4 * max(k, 1))) // 4 * 4)
    m6 = m - m % 6
    for c0 in range(j0, j1, step):
        c1 = min(j1, c0 + step)
        cm = min(c1, full)
        if cm > c0:
            _k6x4(a, bt, bias, c, 0, m6, c0, cm)
            i = m6
            if m - i >= 4:
                _k4x4(a, bt, bias, c, i, i + 4, c0, cm)
                i += 4
            if m - i >= 2:
                _k2x4(a, bt, bias, c, i, i + 2, c0, cm)
                i += 2
            if m - i >= 1:
                _k1x4(a, bt, bias, c, i, i + 1, c0, cm)
        if c1 > full:
            e0 = max(c0, full)
            _k6x1(a, bt, bias, c, 0, m6, e0, c1)
            _k1x1(a, bt, bias, c, m6, m, e0, c1)


# The micro-kernels (generated text, one per block shape: rows x columns). Each running
# sum starts at its row's bias, so the bias costs no pass of its own.


def _k6x4(a, bt, bias, c, i0, i1, j0, j1):
    for i in range(i0, i1, 6):
        for j in range(j0, j1, 4):
            s00 = s01 = s02 = s03 = bias[i]
            s10 = s11 = s12 = s13 = bias[i + 1]
            s20 = s21 = s22 = s23 = bias[i + 2]
            s30 = s31 = s32 = s33 = bias[i + 3]
            s40 = s41 = s42 = s43 = bias[i + 4]
            s50 = s51 = s52 = s53 = bias[i + 5]
            for k in range(a.shape[1]):
                a0 = a[i, k]
                a1 = a[i + 1, k]
                a2 = a[i + 2, k]
                a3 = a[i + 3, k]
                a4 = a[i + 4, k]
                a5 = a[i + 5, k]
                b0 = bt[j, k]
                b1 = bt[j + 1, k]
                b2 = bt[j + 2, k]
                b3 = bt[j + 3, k]
                s00 += a0 * b0
                s01 += a0 * b1
                s02 += a0 * b2
                s03 += a0 * b3
                s10 += a1 * b0
                s11 += a1 * b1
                s12 += a1 * b2
                s13 += a1 * b3
                s20 += a2 * b0
                s21 += a2 * b1
                s22 += a2 * b2
                s23 += a2 * b3
                s30 += a3 * b0
                s31 += a3 * b1
                s32 += a3 * b2
                s33 += a3 * b3
                s40 += a4 * b0
                s41 += a4 * b1
                s42 += a4 * b2
                s43 += a4 * b3
                s50 += a5 * b0
                s51 += a5 * b1
                s52 += a5 * b2
                s53 += a5 * b3
            c[i, j] = s00
            c[i, j + 1] = s01
            c[i, j + 2] = s02
            c[i, j + 3] = s03
            c[i + 1, j] = s10
            c[i + 1, j + 1] = s11
            c[i + 1, j + 2] = s12
            c[i + 1, j + 3] = s13
            c[i + 2, j] = s20
            c[i + 2, j + 1] = s21
            c[i + 2, j + 2] = s22
            c[i + 2, j + 3] = s23
            c[i + 3, j] = s30
            c[i + 3, j + 1] = s31
            c[i + 3, j + 2] = s32
            c[i + 3, j + 3] = s33
            c[i + 4, j] = s40
            c[i + 4, j + 1] = s41
            c[i + 4, j + 2] = s42
            c[i + 4, j + 3] = s43
            c[i + 5, j] = s50
            c[i + 5, j + 1] = s51
            c[i + 5, j + 2] = s52
            c[i + 5, j + 3] = s53


def _k4x4(a, bt, bias, c, i0, i1, j0, j1):
    for i in range(i0, i1, 4):
        for j in range(j0, j1, 4):
            s00 = s01 = s02 = s03 = bias[i]
            s10 = s11 = s12 = s13 = bias[i + 1]
            s20 = s21 = s22 = s23 = bias[i + 2]
            s30 = s31 = s32 = s33 = bias[i + 3]
            for k in range(a.shape[1]):
                a0 = a[i, k]
                a1 = a[i + 1, k]
                a2 = a[i + 2, k]
                a3 = a[i + 3, k]
                b0 = bt[j, k]
                b1 = bt[j + 1, k]
                b2 = bt[j + 2, k]
                b3 = bt[j + 3, k]
                s00 += a0 * b0
                s01 += a0 * b1
                s02 += a0 * b2
                s03 += a0 * b3
                s10 += a1 * b0
                s11 += a1 * b1
                s12 += a1 * b2
                s13 += a1 * b3
                s20 += a2 * b0
                s21 += a2 * b1
                s22 += a2 * b2
                s23 += a2 * b3
                s30 += a3 * b0
                s31 += a3 * b1
                s32 += a3 * b2
                s33 += a3 * b3
            c[i, j] = s00
            c[i, j + 1] = s01
            c[i, j + 2] = s02
            c[i, j + 3] = s03
            c[i + 1, j] = s10
            c[i + 1, j + 1] = s11
            c[i + 1, j + 2] = s12
            c[i + 1, j + 3] = s13
            c[i + 2, j] = s20
            c[i + 2, j + 1] = s21
            c[i + 2, j + 2] = s22
            c[i + 2, j + 3] = s23
            c[i + 3, j] = s30
            c[i + 3, j + 1] = s31
            c[i + 3, j + 2] = s32
            c[i + 3, j + 3] = s33


def _k2x4(a, bt, bias, c, i0, i1, j0, j1):
    for i in range(i0, i1, 2):
        for j in range(j0, j1, 4):
            s00 = s01 = s02 = s03 = bias[i]
            s10 = s11 = s12 = s13 = bias[i + 1]
            for k in range(a.shape[1]):
                a0 = a[i, k]
                a1 = a[i + 1, k]
                b0 = bt[j, k]
                b1 = bt[j + 1, k]
                b2 = bt[j + 2, k]
                b3 = bt[j + 3, k]
                s00 += a0 * b0
                s01 += a0 * b1
                s02 += a0 * b2
                s03 += a0 * b3
                s10 += a1 * b0
                s11 += a1 * b1
                s12 += a1 * b2
                s13 += a1 * b3
            c[i, j] = s00
            c[i, j + 1] = s01
            c[i, j + 2] = s02
            c[i, j + 3] = s03
            c[i + 1, j] = s10
            c[i + 1, j + 1] = s11
            c[i + 1, j + 2] = s12
            c[i + 1, j + 3] = s13


def _k1x4(a, bt, bias, c, i0, i1, j0, j1):
    for i in range(i0, i1, 1):
        for j in range(j0, j1, 4):
            s00 = s01 = s02 = s03 = bias[i]
            for k in range(a.shape[1]):
                a0 = a[i, k]
                b0 = bt[j, k]
                b1 = bt[j + 1, k]
                b2 = bt[j + 2, k]
                b3 = bt[j + 3, k]
                s00 += a0 * b0
                s01 += a0 * b1
                s02 += a0 * b2
                s03 += a0 * b3
            c[i, j] = s00
            c[i, j + 1] = s01
            c[i, j + 2] = s02
            c[i, j + 3] = s03


def _k6x1(a, bt, bias, c, i0, i1, j0, j1):
    for i in range(i0, i1, 6):
        for j in range(j0, j1, 1):
            s00 = bias[i]
            s10 = bias[i + 1]
            s20 = bias[i + 2]
            s30 = bias[i + 3]
            s40 = bias[i + 4]
            s50 = bias[i + 5]
            for k in range(a.shape[1]):
                a0 = a[i, k]
                a1 = a[i + 1, k]
                a2 = a[i + 2, k]
                a3 = a[i + 3, k]
                a4 = a[i + 4, k]
                a5 = a[i + 5, k]
                b0 = bt[j, k]
                s00 += a0 * b0
                s10 += a1 * b0
                s20 += a2 * b0
                s30 += a3 * b0
                s40 += a4 * b0
                s50 += a5 * b0
            c[i, j] = s00
            c[i + 1, j] = s10
            c[i + 2, j] = s20
            c[i + 3, j] = s30
            c[i + 4, j] = s40
            c[i + 5, j] = s50


def _k1x1(a, bt, bias, c, i0, i1, j0, j1):
    for i in range(i0, i1, 1):
        for j in range(j0, j1, 1):
            s00 = bias[i]
            for k in range(a.shape[1]):
                a0 = a[i, k]
                b0 = bt[j, k]
                s00 += a0 * b0
            c[i, j] = s00
