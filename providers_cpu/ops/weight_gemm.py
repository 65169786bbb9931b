"""``X @ W`` for a constant float32 weight on the compiled GEMM (``packed_gemm.py``).

MatMul and Gemm against a constant weight (a classifier head, an LSTM's input projection,
a transformer's projections) ran NumPy's OpenBLAS SGEMM, whose even split over two
threads waits for the slower one: on this 2-core machine, loaded by other processes, the
OCR heads [10, 120] x [120, 6625] and [12, 1024] x [1024, 8210]^T took 25 and 33 ms a run
against onnxruntime's whole model of 9 and 24 ms. Here the weight is laid out once per
session (shared by every node that uses it: ``shared_weights.py``), the kernel reads A where it
is (rows of a row-major A; only the last rows short of a panel are copied), and blocks of rows and
columns are handed to the threads in chunks (``parallel_rows``), so a thread whose core
is taken does less of the work. Where it runs is ``conv_gemm``'s rule (the CPU, numpy's
OpenBLAS and the session's thread count), with its own switch, ``ONNXEP_CPU_WEIGHT_GEMM``.

The weight's layout: column panels of the kernel's width, each its K rows one after
another ((N/NR, K, NR), zero columns to a multiple of NR), from W or, for Gemm's transB,
its transpose: rows a power of two apart (a 512-wide weight) would share a few cache sets
and thrash the L1 the kernel keeps a slab of them in (512 x 512 x 512: 10 ms against
OpenBLAS's 4.1 with plain rows). Every output element is the bias (or 0), then its K
products added in order, each fused: the same bits on any thread count and any split;
they differ from BLAS's in the last places.
"""

from __future__ import annotations

import os

import numpy as np

from .. import jit
from . import conv_gemm, packed_gemm
from .nn_cpu import parallel_rows
from .packed_gemm import _MR, _NR, COLUMN_BIAS

# ``auto``: where conv_gemm's rule runs the kernel; ``1``: wherever numba runs (tests,
# A/B); ``0``: never.
MODE = os.environ.get("ONNXEP_CPU_WEIGHT_GEMM", "auto").strip().lower()

# Below this many multiply-adds the product stays on OpenBLAS: its call costs less than
# this one's (captcha-crnn's [40, 200] x [200, 37], 0.3M: 14 us against 33 on one thread),
# and it is short enough that its threads' hand-off costs little.
MIN_MACS = 1 << 20
# Below this many the compiled product runs on the calling thread alone: a helper's
# hand-off costs more than it saves (the same product: 110-130 us on two threads).
SPLIT_MIN = 1 << 22
MIN_K = 8
MIN_N = 16
# Rows of A a block: as many as keep the block's panels (rows x K floats) in this many
# bytes of L2 while the kernel passes over its columns (it re-reads the block for each
# column panel; the panel's slab of W stays in L1).
_A_BLOCK_BYTES = 192 << 10


def runs_at(threads: int) -> bool:
    """Whether a session of ``threads`` BLAS threads runs the kernel (where shapes fit)."""
    if MODE == "0" or not jit.ENABLED:
        return False
    if MODE == "1":
        return True
    rule = conv_gemm.auto_rule()
    return rule == "always" or (rule == "threads" and threads > 1)


def status() -> str:
    """One line for ``onnxep providers`` (imports nothing)."""
    if MODE == "0":
        return "MatMul/Gemm with a constant weight: OpenBLAS (ONNXEP_CPU_WEIGHT_GEMM=0)"
    if conv_gemm.jit_off():
        return "MatMul/Gemm with a constant weight: OpenBLAS (no compiled loops)"
    kind = f"onnxep's compiled kernel ({packed_gemm.block_name()}) for float32"
    if MODE == "1":
        return f"MatMul/Gemm with a constant weight: {kind} (ONNXEP_CPU_WEIGHT_GEMM=1)"
    rule = conv_gemm.auto_rule()
    if rule == "always":
        return f"MatMul/Gemm with a constant weight: {kind} (OpenBLAS runs AVX2 kernels here)"
    if rule == "threads":
        return (
            f"MatMul/Gemm with a constant weight: {kind} in sessions of more than one "
            f"thread, OpenBLAS at one"
        )
    return "MatMul/Gemm with a constant weight: OpenBLAS"


def session_notes(threads: int) -> tuple[str, ...]:
    return (status(),) if runs_at(threads) else ()


def _panel_layout(trans: bool):
    def make(w: np.ndarray) -> np.ndarray:
        wk = w.T if trans else w  # (K, N)
        k, n = wk.shape
        q = -(-n // _NR)
        panels = np.zeros((q, k, _NR), np.float32)
        full = n // _NR
        if full:
            panels[:full] = wk[:, : full * _NR].reshape(k, full, _NR).transpose(1, 0, 2)
        if n > full * _NR:
            panels[full, :, : n - full * _NR] = wk[:, full * _NR :]
        return panels.reshape(-1)

    return make


class WeightGemm:
    """``a @ W (+ bias row)`` for a constant 2-D weight: W is (K, N), or (N, K) under
    ``trans`` (Gemm's transB). Built once per node at session creation."""

    def __init__(self, weight, trans: bool) -> None:
        w = weight.array
        self.k, self.n = (w.shape[1], w.shape[0]) if trans else w.shape
        self.weight, self.trans = weight, trans
        self.koff = np.arange(self.k, dtype=np.int64) * _NR
        self.npad = -(-self.n // _NR) * _NR

    @property
    def b(self) -> np.ndarray:
        """The weight's panels, laid out on first use (a session of one thread on an AVX2
        CPU never makes them) and shared by every node with the same weight."""
        return self.weight.layout(("weight_gemm", self.trans), _panel_layout(self.trans))

    def worth(self, a: np.ndarray) -> bool:
        """The cheap half of :meth:`fits`: ``a``'s product has enough multiply-adds."""
        return a.shape[0] * self.k * self.n >= MIN_MACS

    def fits(self, a: np.ndarray, threads: int) -> bool:
        """A 2-D float32 ``a`` of this K, a product big enough, where the rule says."""
        m = a.shape[0] if a.ndim == 2 else 0
        return (
            a.ndim == 2
            and a.dtype == np.float32
            and a.shape[1] == self.k
            and self.k >= MIN_K
            and self.n >= MIN_N
            and m > 0
            and m * self.k * self.n >= MIN_MACS
            and runs_at(threads)
        )

    def __call__(
        self, a: np.ndarray, bias: np.ndarray | None = None, out: np.ndarray | None = None
    ) -> np.ndarray:
        """(M, N) float32: ``a @ W``, each sum started from ``bias`` (N,) when given; into
        ``out`` (M, N) when given (directly when N is a whole number of panels)."""
        m, k = a.shape
        n, npad = self.n, self.npad
        if npad == n:
            ok = out is not None and out.flags.c_contiguous and out.dtype == np.float32
            c = out if ok else np.empty((m, n), np.float32)
        else:
            c = np.empty((m, npad), np.float32)
        brow = np.zeros(npad, np.float32)
        if bias is not None:
            brow[:n] = bias
        if m:
            self._product(a, c, m, k, brow)
        if out is not None:
            if c is not out:
                out[...] = c[:, :n]
            return out
        return c if npad == n else c[:, :n].copy()

    def _product(self, a: np.ndarray, c: np.ndarray, m: int, k: int, brow) -> None:
        """``c = brow + a @ W``: A's full panels of rows read where they are (rows ``lda``
        apart), the last rows (fewer than a panel) from a zero-padded copy."""
        a = np.ascontiguousarray(a)  # Gemm's transA, a sliced input: one copy
        lda = k
        full = m // _MR * _MR
        rp = max(1, _A_BLOCK_BYTES // (4 * max(k, 1) * _MR))  # row panels a block
        # (A's flat buffer, its first element, its row stride, rows, C's first row)
        blocks = [
            (a.reshape(-1), r0 * lda, lda, min(rp * _MR, full - r0), r0)
            for r0 in range(0, full, rp * _MR)
        ]
        if full < m:
            tail = np.zeros((_MR, k), np.float32)
            tail[: m - full] = a[full:]
            blocks.append((tail.reshape(-1), 0, k, _MR, full))
        gemm, b, koff, npad = packed_gemm.jit_gemm(), self.b, self.koff, self.npad
        cpanels = npad // _NR
        cf = c.reshape(-1)
        bps = k * _NR

        # the unit of work: one column panel of one block of rows; parallel_rows hands
        # out runs of units, each run one kernel call per block of rows it touches
        def run(u0: int, u1: int) -> None:
            u = u0
            while u < u1:
                r, q = divmod(u, cpanels)
                last = min(u1, (r + 1) * cpanels)  # this row block's panels in [u, u1)
                ab, a0, ld, rows, c0 = blocks[r]
                j0, j1 = q * _NR, (last - r * cpanels) * _NR
                gemm(ab[a0:], _MR * ld, 1, ld, b, koff, bps, cf[c0 * npad :], npad, rows,
                     min(rows, m - c0), k, j0, j1, brow, COLUMN_BIAS)  # fmt: skip
                u = last

        work = m * k * npad
        parallel_rows(len(blocks) * cpanels, work if work >= SPLIT_MIN else 0, run)
