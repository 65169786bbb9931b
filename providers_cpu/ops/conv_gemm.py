"""Dense float32 convolutions on the compiled GEMM (``packed_gemm.py``) instead of im2col + SGEMM.

Two rules, fixed per session by the CPU, numpy's OpenBLAS and the session's thread count:

- where OpenBLAS runs an AVX2 core's kernels on an AVX-512 CPU (``OPENBLAS_CORETYPE=Haswell``,
  or a CPU OpenBLAS does not know: ``openblas_core.py``), always: the compiled kernel runs
  at the CPU's full width, OpenBLAS's at half (session 10);
- elsewhere, on a CPU with AVX2 and FMA (or AVX-512), in sessions of more than one thread:
  OpenBLAS splits a product evenly over its threads and waits for the slowest, which on a
  loaded machine is a descheduled one (2-13x the one-thread time on this 2-core machine
  with one busy process beside it), while the compiled GEMM hands its column panels out
  one chunk at a time (``parallel_rows``), so a thread whose core is taken does less of
  the work. At one thread OpenBLAS and the Winograd path were as fast or faster and keep
  the convolutions.

The weights are packed once per session. Stride-1 convolutions read their columns from the
padded input itself (``ConvGemm``: no im2col copy); other strides copy an im2col buffer.
The output is pre-filled with the bias, which each sum starts from: the same bits on any
thread count, different from BLAS's in the last places (docs/cpu_kernels.md).
"""

from __future__ import annotations

import os

import numpy as np

from .. import jit
from ..openblas_core import AVX512_CORES, AVX512_FLAGS, cpu_flags
from . import packed_gemm
from .nn_cpu import parallel_compiled
from .packed_gemm import _MR, _NR, ROW_BIAS, jit_gemm, pack_weights, product

__all__ = ["ConvGemm", "PhasePlanes", "applies", "enabled", "pack_weights", "product", "status"]

# ``ONNXEP_CPU_CONV_GEMM``: ``auto`` (default: the two rules above), ``1`` wherever numba
# runs, at any thread count (tests, A/B measurements), ``0`` never.
MODE = os.environ.get("ONNXEP_CPU_CONV_GEMM", "auto").strip().lower()

# Below this many multiply-adds (M * K * N) the call and the padding cost more than
# BLAS's AVX2 kernel loses (docs/cpu_kernels.md).
_MIN_MACS = 1 << 18
_MIN_K = 8
_MIN_M = 8
# A pointwise convolution's BLAS path multiplies the input in place, where this one
# copies it first: below 32 channels, on one thread, that copy is as long as the
# product's gain (16 -> 16 at 160x160: 0.23 ms against BLAS's 0.21); on more, OpenBLAS's
# split costs more than the copy.
_MIN_K_POINTWISE = 32


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


_auto: str | None = None


def auto_rule() -> str:
    """``always`` (OpenBLAS runs AVX2 kernels on an AVX-512 CPU), ``threads`` (a CPU the
    kernel fits: sessions of more than one thread) or ``""`` (never), once per process."""
    global _auto
    if _auto is None:
        if blas_is_avx2_on_avx512():
            _auto = "always"
        else:
            _auto = "threads" if packed_gemm.fits(cpu_flags()) else ""
    return _auto


def enabled() -> bool:
    """Whether convolutions may run this GEMM in this process (``applies`` adds the
    session's thread count)."""
    if MODE == "0" or not jit.ENABLED:
        return False
    return MODE == "1" or bool(auto_rule())


def jit_off() -> bool:
    """No compiled loops, without importing numba (``ENABLED`` imports it on first read)."""
    known = vars(jit).get("ENABLED")
    return known is False or not jit.jit_status().startswith("compiled loops: numba ")


def status() -> str:
    """One line for ``onnxep providers``: which GEMM dense float32 convolutions run
    (imports nothing)."""
    if MODE == "0":
        return "dense Conv GEMM: OpenBLAS (ONNXEP_CPU_CONV_GEMM=0)"
    if jit_off():
        return "dense Conv GEMM: OpenBLAS (no compiled loops)"
    kind = f"onnxep's compiled kernel ({packed_gemm.block_name()}) for float32"
    if MODE == "1":
        return f"dense Conv GEMM: {kind} (ONNXEP_CPU_CONV_GEMM=1)"
    rule = auto_rule()
    if rule == "always":
        return f"dense Conv GEMM: {kind} (OpenBLAS runs AVX2 kernels on this AVX-512 CPU)"
    if rule == "threads":
        return (
            f"dense Conv GEMM: {kind} in sessions of more than one thread (it hands its "
            f"columns to the threads in chunks; OpenBLAS's even split waits for a "
            f"descheduled thread), OpenBLAS at one"
        )
    return "dense Conv GEMM: OpenBLAS"


def runs_at(threads: int) -> bool:
    """Whether a session of ``threads`` BLAS threads runs the kernel (where shapes fit)."""
    if not enabled():
        return False
    return MODE == "1" or auto_rule() == "always" or threads > 1


def session_notes(threads: int) -> tuple[str, ...]:
    """The status line for the notes of a session of ``threads`` threads where the
    compiled kernel runs (else none: OpenBLAS is what every other place says)."""
    return (status(),) if runs_at(threads) else ()


def applies(
    k,
    group: int,
    m: int,
    ck: int,
    lsz: int,
    dtype,
    const_weights: bool,
    pointwise: bool = False,
    threads: int = 1,
) -> bool:
    """Whether a 2-D convolution of this shape runs here (shape, dtype and the session's
    thread count)."""
    return (
        len(k) == 2
        and (not pointwise or ck >= _MIN_K_POINTWISE or threads > 1)
        and group == 1
        and const_weights
        and np.dtype(dtype) == np.float32
        and m >= _MIN_M
        and ck >= _MIN_K
        and m * ck * lsz >= _MIN_MACS
        and runs_at(threads)
    )


class PhasePlanes:
    """One input shape's columns, read from the padded input itself, with no im2col copy.

    With strides (sh, sw) the padded input is split into sh * sw phase planes, plane (p,
    q) holding the rows p, p + sh, ... and columns q, q + sw, ... (Hq = ceil(Hp / sh) by
    Wq = ceil(Wp / sw)); output (oh, ow) of term (c, r, s) reads padded (oh sh + r dh, ow
    sw + s dw), which is plane ((r dh) % sh, (s dw) % sw) at (oh + (r dh) // sh, ow + (s
    dw) // sw). Over full plane rows (output column ``oh * Wq + ow``, as
    ``op_conv.im2col_wide`` at stride 1, where there is one plane: the padded input), the
    row of term (c, r, s) is then one run of its flat plane from ``koff[t]`` = ``c Hq Wq +
    ((r dh) // sh) Wq + (s dw) // sw`` on (t = (c KH + r) KW + s). The split is one copy
    of the input (C H W values), where im2col copied K N (2.25x that for a 3x3 stride-2
    convolution, through a slow strided copy). The planes' borders are zeros written
    once; ``b`` runs ``tail`` values past the last term's row start.
    """

    def __init__(self, xshape, k, strides, dil, pb, pe, out, tail: int):
        c, h, w = xshape[1:]
        sh, sw = strides
        hp, wp = h + pb[0] + pe[0], w + pb[1] + pe[1]
        hq, wq = -(-hp // sh), -(-wp // sw)
        self.out = out
        # A channel's plane starts an odd number of 64-byte lines after the previous one:
        # the GEMM keeps a slab of B's rows (one a channel and kernel offset) in L1,
        # and channels a power of two (or near it) apart would fall in a few of its sets
        # (magika's 1-D conv, 516-float planes: 40 GFLOP/s on two threads).
        cs = -(-(hq * wq) // 16) * 16
        cs += 16 * (1 - (cs // 16) % 2)
        plane = c * cs
        cc, rr, ss = np.meshgrid(np.arange(c), np.arange(k[0]), np.arange(k[1]), indexing="ij")
        ry, sx = rr * dil[0], ss * dil[1]
        koff = (((ry % sh) * sw + sx % sw) * plane + cc * cs + (ry // sh) * wq + sx // sw).reshape(
            -1
        )
        # the last panel reads past the planes: zeros (their columns are dropped)
        size = max(sh * sw * plane, int(koff.max()) + tail)
        self.b = np.zeros(size, np.float32)
        planes = self.b[: sh * sw * plane].reshape(sh, sw, c, cs)[..., : hq * wq]
        planes = planes.reshape(sh, sw, c, hq, wq)
        # (destination in plane (p, q), the input's rows and columns that land there), and
        # the same as rows of (first value's offset in b, rows, columns, first input row,
        # first input column) for compiled fills
        self.copies = []
        table = []
        for p in range(sh):
            y0 = (p - pb[0]) % sh  # first input row whose padded row is p mod sh
            ny = len(range(y0, h, sh))
            for q in range(sw):
                x0 = (q - pb[1]) % sw
                nx = len(range(x0, w, sw))
                if ny and nx:
                    r0, c0 = (y0 + pb[0]) // sh, (x0 + pb[1]) // sw
                    dst = planes[p, q, :, r0 : r0 + ny, c0 : c0 + nx]
                    self.copies.append((dst, (slice(None), slice(y0, h, sh), slice(x0, w, sw))))
                    table.append(((p * sw + q) * plane + r0 * wq + c0, ny, nx, y0, x0))
        self.table = np.array(table, np.int64).reshape(-1, 5)
        self.geo = (sh, sw, wq, cs)
        self.wq = wq
        self.koff = np.ascontiguousarray(koff, dtype=np.int64)

    def fill(self, xi: np.ndarray) -> None:
        """Copy one image (C, H, W) into the planes."""
        for dst, src in self.copies:
            np.copyto(dst, xi[src])


class ConvGemm(PhasePlanes):
    """One input shape's convolution on the GEMM: the input's phase planes
    (``PhasePlanes``), the output block, the product. Built once per (input shape,
    thread); ``__call__(x, y)`` writes the (N, M, oh * ow) result into ``y``; the columns
    past ``ow`` of each plane row are computed and dropped.
    """

    def __init__(self, xshape, ap: np.ndarray, bias: np.ndarray, k, strides, dil, pb, pe, out):
        self.m = bias.shape[0]
        self.ap = ap.reshape(-1)
        self.mp, self.k = ap.shape[0] * _MR, ap.shape[1]
        sw = strides[1]
        wq = -(-(xshape[3] + pb[1] + pe[1]) // sw)
        oh, ow = out
        self.ncols = oh * wq
        self.npad = -(-self.ncols // _NR) * _NR
        super().__init__(xshape, k, strides, dil, pb, pe, out, self.npad)
        # rows past M are neither read nor written: the output is C itself where its
        # columns are the kernel's (no dropped columns, a whole number of panels)
        self.direct = self.npad == self.ncols == oh * ow
        self.c = None if self.direct else np.empty((self.m, self.npad), np.float32)
        self.brow = np.zeros(self.mp, np.float32)
        self.brow[: self.m] = bias
        self.gemm = jit_gemm()

    def __call__(self, x: np.ndarray, y: np.ndarray) -> None:
        ap, b, koff, gemm, k, npad, mp, brow = (
            self.ap, self.b, self.koff, self.gemm, self.k, self.npad, self.mp, self.brow
        )  # fmt: skip
        panels = npad // _NR
        work = mp * k * npad
        m, (oh, ow) = self.m, self.out
        for i in range(x.shape[0]):
            self.fill(x[i])
            c = y[i] if self.direct else self.c
            cf = c.reshape(-1)
            parallel_compiled(
                panels,
                work,
                gemm,
                (ap, _MR * k, _MR, 1, b, koff, _NR, cf, npad, mp, m, k),
                (brow, ROW_BIAS),
                _NR,
            )
            if not self.direct:
                y[i].reshape(m, oh, ow)[...] = self.c[:, : self.ncols].reshape(m, oh, self.wq)[
                    :, :, :ow
                ]
