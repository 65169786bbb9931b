"""A compiled float32 GEMM for im2col convolutions, for where NumPy's OpenBLAS runs AVX2 kernels.

On an AVX-512 CPU whose OpenBLAS runs an AVX2 core's kernels (``OPENBLAS_CORETYPE=Haswell``,
or a CPU OpenBLAS does not know: ``openblas_core.py``) the convolution's SGEMM runs at
half the CPU's vector width. numba's LLVM compiles for the host CPU, so 16-float vectors
written here are zmm code there. The micro-kernel (a numba intrinsic, as jit.py's
depthwise tiles: a plain numba loop keeps its accumulators in memory) holds an 8 x 48
block of the output in 24 vector registers and, per K step, loads three 16-float vectors
of the im2col row, broadcasts eight weights and issues 24 fused multiply-adds: the
register-blocked outer product BLAS kernels are made of.

The weights are packed once per session into panels of 8 rows, K-major ((M/8, K, 8), zero
rows to a multiple of 8). The kernel reads row t of the columns from ``b[koff[t]:]``: for
stride 1, straight from the padded input (``ConvGemm``: no im2col copy), otherwise from an
im2col buffer (K, N), N rounded up to a multiple of 48 (zero columns, written once). The
output is pre-filled with the bias, which each sum starts from. Columns are handed to
threads 48 at a time and K is walked in blocks that keep a (KC x 48) slab of columns in L1:
every output element is the same sequence of multiply-adds (bias, then k = 0, 1, ..., each
rounded once: fused) whatever the split, so results are the same bits on any thread count.
They differ from BLAS's (another order) well inside the tolerances the project compares with
onnxruntime.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from .. import jit
from ..openblas_core import AVX512_CORES, AVX512_FLAGS, cpu_flags
from .nn_cpu import parallel_rows

# ``ONNXEP_CPU_CONV_GEMM``: ``auto`` (default) where OpenBLAS runs AVX2 kernels on an
# AVX-512 CPU, ``1`` wherever numba runs (tests, A/B measurements), ``0`` never.
MODE = os.environ.get("ONNXEP_CPU_CONV_GEMM", "auto").strip().lower()

# Below this many multiply-adds (M * K * N) the call and the padding cost more than
# BLAS's AVX2 kernel loses (docs/cpu_kernels.md).
_MIN_MACS = 1 << 18
_MIN_K = 8
_MIN_M = 8
# A pointwise convolution's BLAS path multiplies the input in place, where this one
# copies it first: below 32 channels that copy is as long as the product's gain (16 ->
# 16 at 160x160: 0.23 ms against BLAS's 0.21).
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


def applies(
    k, group: int, m: int, ck: int, lsz: int, dtype, const_weights: bool, pointwise: bool = False
) -> bool:
    """Whether a 2-D convolution of this shape runs here (shape and dtype only)."""
    return (
        len(k) == 2
        and (not pointwise or ck >= _MIN_K_POINTWISE)
        and group == 1
        and const_weights
        and np.dtype(dtype) == np.float32
        and m >= _MIN_M
        and ck >= _MIN_K
        and m * ck * lsz >= _MIN_MACS
        and enabled()
    )


def pack_weights(w: np.ndarray) -> np.ndarray:
    """(M, C, *kernel) weights to the kernel's panels (ceil(M / 8), K, 8), float32, once."""
    m = w.shape[0]
    a = np.asarray(w, dtype=np.float32).reshape(m, math.prod(w.shape[1:]))
    mp = -(-m // _MR) * _MR
    p = np.zeros((mp, a.shape[1]), np.float32)
    p[:m] = a
    return np.ascontiguousarray(p.reshape(mp // _MR, _MR, a.shape[1]).transpose(0, 2, 1))


def product(a: np.ndarray, b: np.ndarray, bias: np.ndarray, panels_per_call: int = 0) -> np.ndarray:
    """``a @ b + bias[:, None]`` (float32) through the kernel, ``panels_per_call`` column
    panels of 48 a call (0: one call), as threads would split it: for tests."""
    m, k = a.shape
    n = b.shape[1]
    ap = pack_weights(a).reshape(-1)
    mp, npad = -(-m // _MR) * _MR, -(-n // _NR) * _NR
    bp = np.zeros((k, npad), np.float32)
    bp[:, :n] = b
    c = np.zeros((mp, npad), np.float32)
    c[:m] = np.asarray(bias, np.float32).reshape(m, 1)
    gemm = jit_gemm()
    koff = np.arange(k, dtype=np.int64) * npad
    step = _NR * (panels_per_call or max(1, npad // _NR))
    for j0 in range(0, npad, step):
        gemm(ap, bp.reshape(-1), koff, c.reshape(-1), npad, mp, k, j0, min(npad, j0 + step))
    return c[:m, :n].copy()


class ConvGemm:
    """One input shape's convolution: padded input, columns, output block, the product.

    Stride 1 (any dilation) reads its columns from the padded input itself: over full
    padded rows (output column ``oh * Wp + ow``, as ``op_conv.im2col_wide``), the row of
    term (c, r, s) is the flat padded input from ``c Hp Wp + r dh Wp + s dw`` on, so
    there is no im2col copy; the columns that fall in the padding are computed and
    dropped. Other strides copy an im2col buffer (K, N), rows ``N`` rounded up to 48
    apart. Built once per (input shape, thread); ``__call__(x, y)`` writes the (N, M,
    oh * ow) result into ``y``.
    """

    def __init__(self, xshape, ap: np.ndarray, bias: np.ndarray, k, strides, dil, pb, pe, out):
        from .nn_cpu import window_view

        c, h, w = xshape[1:]
        self.m = bias.shape[0]
        self.ap = ap.reshape(-1)
        self.mp, self.k = ap.shape[0] * _MR, ap.shape[1]
        hp, wp = h + pb[0] + pe[0], w + pb[1] + pe[1]
        oh, ow = out
        self.out = out
        self.wide = tuple(strides) == (1, 1)
        if self.wide:
            self.ncols = oh * wp
            self.npad = -(-self.ncols // _NR) * _NR
            cc, rr, ss = np.meshgrid(np.arange(c), np.arange(k[0]), np.arange(k[1]), indexing="ij")
            koff = (cc * hp * wp + rr * dil[0] * wp + ss * dil[1]).reshape(-1)
            # the last panel reads past the plane: zeros (their columns are dropped)
            size = max(c * hp * wp, int(koff.max()) + self.npad)
            self.b = np.zeros(size, np.float32)
            plane = self.b[: c * hp * wp].reshape(c, hp, wp)
            self.interior = plane[:, pb[0] : pb[0] + h, pb[1] : pb[1] + w]
            self.wp = wp
        else:
            self.ncols = oh * ow
            self.npad = -(-self.ncols // _NR) * _NR
            koff = np.arange(self.k) * self.npad
            self.xp = np.zeros((1, c, hp, wp), np.float32)
            self.interior = self.xp[0, :, pb[0] : pb[0] + h, pb[1] : pb[1] + w]
            self.view = window_view(self.xp, k, strides, dil, out)[0]  # (C, kh, kw, oh, ow)
            # zero columns past N: never NaN or denormal garbage in the padded lanes
            b2 = np.zeros((self.k, self.npad), np.float32)
            self.dst = b2[:, : self.ncols].reshape(self.view.shape)
            self.b = b2.reshape(-1)
        self.koff = np.ascontiguousarray(koff, dtype=np.int64)
        self.direct = self.mp == self.m and self.npad == self.ncols == oh * ow
        self.c = None if self.direct else np.empty((self.mp, self.npad), np.float32)
        bcol = np.zeros((self.mp, 1), np.float32)
        bcol[: self.m, 0] = bias
        self.bcol = bcol
        self.gemm = jit_gemm()

    def __call__(self, x: np.ndarray, y: np.ndarray) -> None:
        ap, b, koff, gemm, k, npad, mp = (
            self.ap, self.b, self.koff, self.gemm, self.k, self.npad, self.mp
        )  # fmt: skip
        panels = npad // _NR
        work = mp * k * npad
        m, (oh, ow) = self.m, self.out
        for i in range(x.shape[0]):
            self.interior[...] = x[i]
            if not self.wide:
                np.copyto(self.dst, self.view)
            c = y[i] if self.direct else self.c
            c[...] = self.bcol  # the sums start from the bias
            cf = c.reshape(-1)
            parallel_rows(
                panels,
                work,
                lambda p0, p1, cf=cf: gemm(ap, b, koff, cf, npad, mp, k, _NR * p0, _NR * p1),
            )
            if self.direct:
                continue
            if self.wide:
                y[i].reshape(m, oh, ow)[...] = self.c[:m, : self.ncols].reshape(m, oh, self.wp)[
                    :, :, :ow
                ]
            else:
                y[i] = self.c[:m, : self.ncols]


# The micro-kernel's block: 8 rows of weights x 48 columns (three 16-float vectors); K
# in blocks of 256 (a 48 KB slab of columns, this CPU's L1).
_MR = 8
_NR = 48
_KC = 256
_compiled: dict[str, Any] = {}


def jit_gemm() -> Any:
    """The compiled ``gemm(ap, b, koff, c, ldc, mp, k, j0, j1)`` (compiled on first use,
    cached on disk): ``c[:mp, j0:j1] += A @ B[:, j0:j1]``, flat arrays, where row t of B
    starts at ``b[koff[t]]``; j0 and j1 multiples of 48."""
    f = _compiled.get("gemm")
    if f is None:
        if not jit.ENABLED:  # imports numba
            raise RuntimeError("the Conv GEMM needs numba")
        globals()["_mk"] = _make_micro_kernel()
        f = _compiled["gemm"] = jit.nb.njit(cache=True, nogil=True, boundscheck=False)(_gemm)
    return f


def _gemm(ap, b, koff, c, ldc, mp, k, j0, j1):
    for jc in range(j0, j1, 48):
        for k0 in range(0, k, 256):
            kc = min(256, k - k0)
            for ip in range(mp // 8):
                _mk(ap, ip * 8 * k + k0 * 8, b, koff, k0, jc, c, ip * 8 * ldc + jc, ldc, kc)


def _mk(*args):  # replaced by the intrinsic before ``_gemm`` is compiled
    raise NotImplementedError


def _make_micro_kernel() -> Any:
    """``mk(ap, aoff, b, koff, k0, jb, c, coff, ldc, kc)``, a numba intrinsic: for r < 8
    and j < 48, ``c[coff + r ldc + j] += sum over t < kc of ap[aoff + 8 t + r] *
    b[koff[k0 + t] + jb + j]``, one fused multiply-add a term, in t order.
    The 24 sums live in registers across the k loop (allocas LLVM promotes)."""
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    nv = _NR // 16

    def codegen(context, builder, signature, args):
        names = ("ap", "aoff", "b", "koff", "k0", "jb", "c", "coff", "ldc", "kc")
        val = dict(zip(names, args))
        ty = dict(zip(names, signature.args))
        arr = {
            n: context.make_array(ty[n])(context, builder, val[n]) for n in ("ap", "b", "koff", "c")
        }
        i64 = ir.IntType(64)
        aoff, k0, jb, coff, ldc, kc = (
            context.cast(builder, val[n], ty[n], types.intp)
            for n in ("aoff", "k0", "jb", "coff", "ldc", "kc")
        )
        vty = ir.VectorType(ir.FloatType(), 16)
        fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vty, [vty] * 3), "llvm.fma.v16f32"
        )

        def const(v):
            return ir.Constant(i64, v)

        def vptr(name, idx):
            return builder.bitcast(builder.gep(arr[name].data, [idx]), vty.as_pointer())

        def c_at(r, v):
            return vptr(
                "c", builder.add(builder.add(coff, builder.mul(ldc, const(r))), const(16 * v))
            )

        accs = [
            cgutils.alloca_once_value(builder, builder.load(c_at(r, v), align=4))
            for r in range(_MR)
            for v in range(nv)
        ]
        undef = ir.Constant(vty, ir.Undefined)
        lane0 = ir.Constant(ir.IntType(32), 0)
        splat = ir.Constant(ir.VectorType(ir.IntType(32), 16), [0] * 16)
        with cgutils.for_range(builder, kc) as lp:
            kk = lp.index
            row = builder.load(builder.gep(arr["koff"].data, [builder.add(k0, kk)]))
            bo = builder.add(row, jb)
            bv = [
                builder.load(vptr("b", builder.add(bo, const(16 * v))), align=4) for v in range(nv)
            ]
            ao = builder.add(aoff, builder.mul(kk, const(_MR)))
            for r in range(_MR):
                a = builder.load(builder.gep(arr["ap"].data, [builder.add(ao, const(r))]))
                av = builder.shuffle_vector(builder.insert_element(undef, a, lane0), undef, splat)
                for v in range(nv):
                    p = accs[r * nv + v]
                    builder.store(builder.call(fma, [av, bv[v], builder.load(p)]), p)
        for r in range(_MR):
            for v in range(nv):
                builder.store(builder.load(accs[r * nv + v]), c_at(r, v), align=4)
        return context.get_dummy_value()

    def typer(typingctx, ap, aoff, b, koff, k0, jb, c, coff, ldc, kc):
        return types.void(ap, aoff, b, koff, k0, jb, c, coff, ldc, kc), codegen

    return intrinsic(typer)
