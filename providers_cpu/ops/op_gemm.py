"""Gemm on NumPy: a constant B under transB laid out once as the product's right operand.

PyTorch exports every ``nn.Linear`` (and the GRU/LSTM cells it unrolls) as
``Gemm(x, W, b, transB=1)`` with W of shape [out, in]. NumPy's matmul on the
transposed view ``W.T`` takes a slow path for a few rows: [2, 256] @ [768, 256]^T
took 86 us against 13 us on a contiguous copy of the transpose, on one thread and on
two (the romanizer decoder's five Gemms were half its run). The copy is made once,
at session creation, and used for an input shape only where it gives the view's
bits on probe data (checked once per shape and thread count, as ``TunedMatmul``
checks its splits), so the result is the generic kernel's; elsewhere, and for every
other Gemm, the generic kernel runs.

With a few rows in A (a batch of one or two through an unrolled RNN cell, a decoder's
step) the product runs on W as it is stored, constant or fed (few_rows.py: two to eight
rows in one compiled loop that reads W once, or one GEMV a row): [2, 4096] x
[400, 4096]^T took 290-330 us as one SGEMM against two GEMVs of 40-75 us (the OCR
CRNN's forty LSTM input products, three quarters of its run).

Nodes that use the same initializer (an unrolled RNN's every step) share one copy of
W and of its transpose (shared_weights.py); the transpose is made on first use.
"""

from __future__ import annotations

import threading

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.op_gemm import gemm as generic
from onnxep.providers.ops.reduce import widen

from ..threads import run_threads
from . import few_rows, shared_weights
from .nn_cpu import probe_like, same_bits
from .weight_gemm import WeightGemm

_BLAS = (np.dtype(np.float32), np.dtype(np.float64))


@kernel("Gemm", since=(1, 6, 7, 9, 11, 13))
def gemm(node, xp):
    general = generic(node, xp)
    alpha = float(node.attr("alpha", 1.0))
    beta = float(node.attr("beta", 1.0))
    trans_a = bool(node.attr("transA", 0))
    const = node.const_input(1)
    if not node.attr("transB", 0):
        if isinstance(const, np.ndarray) and const.ndim == 2 and const.dtype == np.float32:
            return _on_weight_gemm(
                WeightGemm(shared_weights.shared(const), False), general, trans_a, alpha, beta, xp
            )
        return general
    if not isinstance(const, np.ndarray) or const.ndim != 2 or const.dtype not in _BLAS:

        def run_fed(a, b, c=None):
            am = a.T if trans_a else a
            if not few_rows.fits(am, b, 1):
                return general(a, b, c)
            y = few_rows.rows_times_transposed(am, np.ascontiguousarray(b))
            return _epilogue(y, a, c, alpha, beta, xp)

        return run_fed
    weight = shared_weights.shared(const)
    w = weight.array
    same: dict[tuple, bool] = {}  # (A's layout, threads) -> the copy gives the view's bits
    lock = threading.Lock()

    def agrees(am: np.ndarray) -> bool:
        key = (am.shape, am.strides, run_threads())
        ok = same.get(key)
        if ok is None:
            with lock:
                probe = probe_like(am)
                ok = same[key] = same_bits(
                    np.matmul(probe, weight.transposed), np.matmul(probe, w.T)
                )
        return ok

    packed = WeightGemm(weight, True) if w.dtype == np.float32 else None

    def run(a, b, c=None):
        am = a.T if trans_a else a
        if few_rows.fits(am, w, 1):
            return _epilogue(few_rows.rows_times_transposed(am, w), a, c, alpha, beta, xp)
        if packed is not None and packed.fits(am, run_threads()):
            return _packed(packed, am, a, c, alpha, beta, xp)
        if a.dtype != w.dtype or am.ndim != 2 or am.shape[1] != w.shape[1] or not agrees(am):
            return general(a, b, c)
        return _epilogue(np.matmul(am, weight.transposed), a, c, alpha, beta, xp)

    return run


def _on_weight_gemm(packed: WeightGemm, general, trans_a: bool, alpha: float, beta: float, xp):
    """Gemm of a constant, untransposed float32 B: the compiled GEMM where it fits."""

    def run(a, b, c=None):
        am = a.T if trans_a else a
        if packed.fits(am, run_threads()):
            return _packed(packed, am, a, c, alpha, beta, xp)
        return general(a, b, c)

    return run


def _packed(packed: WeightGemm, am: np.ndarray, a: np.ndarray, c, alpha, beta, xp) -> tuple:
    """The compiled product; a float32 bias row (N,) or (1, N) with alpha = beta = 1 is
    where its sums start (no pass over the output to add it)."""
    if (
        c is not None
        and alpha == 1.0
        and beta == 1.0
        and c.dtype == np.float32
        and c.shape in ((packed.n,), (1, packed.n))
    ):
        return (packed(am, c.reshape(-1)),)
    return _epilogue(packed(am), a, c, alpha, beta, xp)


def _epilogue(y: np.ndarray, a: np.ndarray, c, alpha: float, beta: float, xp) -> tuple:
    """alpha and beta * C on the product, in its own buffer ``y``, as the generic kernel."""
    if alpha != 1.0:
        y *= alpha  # the generic ``alpha * y``, without its second buffer
    if c is not None and beta != 0.0:
        cc = widen(c, xp)
        cc = cc if beta == 1.0 else beta * cc
        if cc.dtype == y.dtype and _into(cc.shape, y.shape):
            y += cc  # y is this run's own buffer
        else:
            y = y + cc
    return (y.astype(a.dtype, copy=False),)


def _into(c: tuple, y: tuple) -> bool:
    """Whether shape ``c`` broadcasts to ``y`` unchanged. The bias of a Gemm is [N] or
    [M, N] and matches y's trailing dims as it is: a tuple comparison (0.1 us) instead of
    np.broadcast_shapes (2 us a call; captcha-crnn runs 80 Gemms a run)."""
    if len(c) <= len(y) and c == y[len(y) - len(c) :]:
        return True
    return np.broadcast_shapes(c, y) == y
