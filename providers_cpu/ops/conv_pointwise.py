"""Pointwise (1x1) float32 convolutions on few positions: output channels in the vector.

A 1x1 convolution of a map of L positions is ``Y = W X + b``, (M, C) times (C, L). With
L in the single digits to a few dozen (squeeze-and-excitation convolutions on a 1x1 map,
the last stages of mobile CNNs on 2x3 or 4x6 maps) OpenBLAS's SGEMM runs at a third of
its rate (the [768, 384] x [384, 6] product of rapidocr-v6-det: 23 GFLOP/s against 70 on
wide maps, 155 us against onnxruntime's 60), and the bias and the activation are two
more passes and a few Python calls each: on a 1x1 map those calls were most of a node's
40 us.

Here the weights are packed once per session into panels of ``2V`` output channels,
C-major ((P, C, 2V), ``V`` the lanes of one vector register: 8 float32 on AVX2, 16 on
AVX-512, ``jit.vector_bytes``), and a numba intrinsic (LLVM vector IR, as jit.py's
depthwise tiles and conv_gemm's micro-kernel: a plain numba loop keeps its accumulators
in memory) holds a tile of ``2V`` channels x 6 positions in 12 vector registers: per input
channel two weight vectors, six broadcast inputs, twelve fused multiply-adds. Each sum
starts from the bias, then adds ``w[m, c] x[c, l]`` for c = 0, 1, ... fused (one
rounding a term); the bits differ from BLAS's (another order, fused) within the
tolerances onnxruntime is compared with. Images of a batch run one after the other in
the same call; output panels go to the run's threads when there is enough work, each
output computed the same way whatever the split.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import jit
from .nn_cpu import parallel_rows
from .packed_gemm import vector_codegen

#: At most this many positions (per image) take the kernel; wider maps keep BLAS, whose
#: SGEMM is at its full rate there (one thread, Zen 3: 384 -> 768 at 2x3 51 us against
#: BLAS's 127 with the bias pass, 192 -> 384 at 4x6 45 against 51, 32 -> 200 at 48
#: positions 28 against 29, 48 -> 96 at 96 positions 18 against 17).
MAX_POSITIONS = 48
#: With AVX-512 (16-float vectors: a tile of 32 channels) up to 8x8 maps: Zen 4, one
#: thread, hot, kernel / BLAS + bias pass: 512 -> 512 at 7x7 0.85, 256 -> 512 0.87, 512 ->
#: 128 0.92; at 96-400 positions 1.01-1.5 (docs/cpu_kernels.md, "orient").
MAX_POSITIONS_AVX512 = 64
#: Below this many input channels the product is too short for the packing to pay.
_MIN_C = 4
#: Switch for tests and A/B measurements (``False``: every pointwise conv keeps BLAS).
ENABLED = True
_compiled: dict[str, Any] = {}


def applies(c: int, m: int, positions: int, dtype, const_weights: bool) -> bool:
    """Whether a pointwise 2-D conv of this shape runs here (shapes and dtype only)."""
    return (
        ENABLED
        and const_weights
        and np.dtype(dtype) == np.float32
        and c >= _MIN_C
        and jit.ENABLED
        and 1 <= positions <= max_positions()
    )


def max_positions() -> int:
    """The most positions an image the kernel takes on this CPU (numba imported)."""
    return MAX_POSITIONS_AVX512 if lanes() >= 16 else MAX_POSITIONS


def lanes() -> int:
    return jit.vector_bytes() // 4


def pack(w: np.ndarray, bias: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(M, C, ...) weights and (M,) bias or None to (panels (P, C, 2V), bias (P * 2V,)),
    zero channels past M."""
    m = w.shape[0]
    a = np.asarray(w, dtype=np.float32).reshape(m, -1)
    c = a.shape[1]
    mb = 2 * lanes()
    p = -(-m // mb)
    wp = np.zeros((p * mb, c), np.float32)
    wp[:m] = a
    bp = np.zeros(p * mb, np.float32)
    if bias is not None:
        bp[:m] = np.asarray(bias, dtype=np.float32).reshape(-1)
    return np.ascontiguousarray(wp.reshape(p, mb, c).transpose(0, 2, 1)), bp


class Pointwise:
    """One input shape's product: ``__call__(x) -> y`` for x (N, C, *sp), y (N, M, *sp).

    ``wp`` and ``bp`` are ``pack``'s; the packed-input and tile buffers are kept here,
    so a run is one compiled call (and the threads' hand-off when split)."""

    def __init__(self, xshape, m: int, wp: np.ndarray, bp: np.ndarray) -> None:
        self.n, self.c = xshape[0], xshape[1]
        self.sp = tuple(xshape[2:])
        self.l = 1
        for s in self.sp:
            self.l *= s
        self.m = m
        self.wp = wp.reshape(-1)
        self.bp = bp
        self.panels = wp.shape[0]
        self.f = loop()
        self.mb = 2 * lanes()
        self.work = self.n * self.panels * self.mb * self.c * self.l
        self.xshape3 = (self.n, self.c, self.l)
        self.yshape = (self.n, m, *self.sp)
        self.yshape3 = (self.n, m, self.l)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
        xf = x.reshape(self.xshape3)
        y = np.empty(self.yshape, np.float32)
        yf = y.reshape(self.yshape3)
        f, wp, bp, mb = self.f, self.wp, self.bp, self.mb
        # parallel_rows runs small work (a squeeze-and-excitation conv) on this thread alone
        parallel_rows(self.panels, self.work, lambda p0, p1: f(wp, bp, xf, mb, p0, p1, yf))
        return y


def product(w: np.ndarray, bias: np.ndarray | None, x: np.ndarray) -> np.ndarray:
    """``w @ x[i] + bias[:, None]`` for each image i of x (N, C, L), through the kernel: for
    tests."""
    wp, bp = pack(w, bias)
    return Pointwise(x.shape, w.shape[0], wp, bp)(x)


def loop() -> Any:
    """The compiled ``run(wp, bp, x, mb, p0, p1, y)``: output panels p0..p1 of every
    image (compiled on first use, cached on disk)."""
    f = _compiled.get("pw")
    if f is None:
        if not jit.ENABLED:  # imports numba
            raise RuntimeError("the pointwise kernel needs numba")
        globals()["_pw_tile6"] = _make_tile(6)
        globals()["_pw_tile1"] = _make_tile(1)
        f = _compiled["pw"] = jit.nb.njit(cache=True, nogil=True, boundscheck=False)(_run)
    return f


def _run(wp, bp, x, mb, p0, p1, y):
    """Panels p0..p1 (``mb`` output channels each) of ``y`` (N, M, L) from ``x`` (N, C, L).

    Positions go 6 a tile (``_pw_tile6``), the last ``L % 6`` one a tile (``_pw_tile1``,
    whose sums run four chains over the channels: one chain waited on each fused
    multiply-add's latency)."""
    n, c, ln = x.shape
    m = y.shape[1]
    full = ln // 6
    rem = ln - full * 6
    xb = np.empty(ln * c, np.float32)
    ot = np.empty(ln * mb, np.float32)
    for i in range(n):
        # the image's positions: 6 a tile, channel-major inside a tile, then the rest
        xi = x[i]
        for ch in range(c):
            src = xi[ch]
            for t in range(full):
                base = (t * c + ch) * 6
                for j in range(6):
                    xb[base + j] = src[t * 6 + j]
            for r in range(rem):
                xb[full * c * 6 + r * c + ch] = src[full * 6 + r]
        yi = y[i]
        for p in range(p0, p1):
            for t in range(full):
                _pw_tile6(wp, p * c * mb, xb, t * c * 6, c, bp, p * mb, ot, t * 6 * mb)  # noqa: F821
            for r in range(rem):
                at = full * c * 6 + r * c
                _pw_tile1(wp, p * c * mb, xb, at, c, bp, p * mb, ot, (full * 6 + r) * mb)  # noqa: F821
            m0 = p * mb
            for mm in range(m0, min(m, m0 + mb)):
                row = yi[mm]
                j = mm - m0
                for q in range(ln):
                    row[q] = ot[q * mb + j]


def _make_tile(npos: int) -> Any:
    """``tile(wp, woff, xb, xoff, c, bp, boff, ot, ooff)``, a numba intrinsic: for the
    ``2V`` channels r of a panel and the ``npos`` positions j of a tile, ``ot[ooff + j 2V
    + r] = bp[boff + r] + sum over k < c of wp[woff + k 2V + r] * xb[xoff + npos k + j]``,
    fused multiply-adds in k order from the bias; with one position, four chains (k mod 4,
    the first from the bias, the rest from zero) added ``(s0 + s1) + (s2 + s3)`` at the
    end. The sums are vectors held in registers across the k loop (allocas LLVM
    promotes)."""
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    v = lanes()
    names = ("wp", "woff", "xb", "xoff", "c", "bp", "boff", "ot", "ooff")
    chains = 4 if npos == 1 else 1

    def codegen(context, builder, signature, args):
        val = dict(zip(names, args))
        ty = dict(zip(names, signature.args))
        arr = {
            k: context.make_array(ty[k])(context, builder, val[k]) for k in ("wp", "xb", "bp", "ot")
        }
        woff, xoff, c, boff, ooff = (
            context.cast(builder, val[k], ty[k], types.intp)
            for k in ("woff", "xoff", "c", "boff", "ooff")
        )
        vty, fma, const, vptr = vector_codegen(builder, arr, v)

        bias = [builder.load(vptr("bp", builder.add(boff, const(h * v))), align=4) for h in (0, 1)]
        zero = ir.Constant(vty, None)
        # accs[chain][position][half]
        accs = [
            [
                [cgutils.alloca_once_value(builder, bias[h] if ch == 0 else zero) for h in (0, 1)]
                for _ in range(npos)
            ]
            for ch in range(chains)
        ]
        undef = ir.Constant(vty, ir.Undefined)
        lane0 = ir.Constant(ir.IntType(32), 0)
        splat = ir.Constant(ir.VectorType(ir.IntType(32), v), [0] * v)

        def step(k, chain):
            wo = builder.add(woff, builder.mul(k, const(2 * v)))
            wv = (builder.load(vptr("wp", wo), align=4),
                  builder.load(vptr("wp", builder.add(wo, const(v))), align=4))  # fmt: skip
            xo = builder.add(xoff, builder.mul(k, const(npos)))
            for j in range(npos):
                xv = builder.load(builder.gep(arr["xb"].data, [builder.add(xo, const(j))]))
                bx = builder.shuffle_vector(builder.insert_element(undef, xv, lane0), undef, splat)
                for h in (0, 1):
                    a = accs[chain][j][h]
                    builder.store(builder.call(fma, [wv[h], bx, builder.load(a)]), a)

        if chains == 1:
            with cgutils.for_range(builder, c) as lp:
                step(lp.index, 0)
        else:
            quads = builder.sdiv(c, const(chains))
            with cgutils.for_range(builder, quads) as lp:
                k4 = builder.mul(lp.index, const(chains))
                for ch in range(chains):
                    step(builder.add(k4, const(ch)), ch)
            with cgutils.for_range(
                builder, builder.sub(c, builder.mul(quads, const(chains)))
            ) as lp:
                step(builder.add(builder.mul(quads, const(chains)), lp.index), 0)
        for j in range(npos):
            for h in (0, 1):
                if chains == 1:
                    s = builder.load(accs[0][j][h])
                else:
                    s01 = builder.fadd(builder.load(accs[0][j][h]), builder.load(accs[1][j][h]))
                    s23 = builder.fadd(builder.load(accs[2][j][h]), builder.load(accs[3][j][h]))
                    s = builder.fadd(s01, s23)
                at = builder.add(ooff, const(j * 2 * v + h * v))
                builder.store(s, vptr("ot", at), align=4)
        return context.get_dummy_value()

    def typer(typingctx, wp, woff, xb, xoff, c, bp, boff, ot, ooff):
        return types.void(wp, woff, xb, xoff, c, bp, boff, ot, ooff), codegen

    return intrinsic(typer)
