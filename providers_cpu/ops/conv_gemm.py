"""A compiled float32 GEMM for im2col convolutions, for where NumPy's OpenBLAS runs AVX2 kernels.

On an AVX-512 CPU whose OpenBLAS runs an AVX2 core's kernels (``OPENBLAS_CORETYPE=Haswell``,
or a CPU OpenBLAS does not know: ``openblas_core.py``) the convolution's SGEMM runs at
half the CPU's vector width. numba's LLVM compiles for the host CPU, so 16-float vectors
written here are zmm code there. The micro-kernel (a numba intrinsic, as jit.py's
depthwise tiles: a plain numba loop keeps its accumulators in memory) holds an 8 x 48
block of the output in 24 vector registers and, per K step, loads three 16-float vectors
of the im2col row, broadcasts eight weights and issues 24 fused multiply-adds: the
register-blocked outer product BLAS kernels are made of.

The weights are packed once per session into panels of 8 rows, K-major ((M/8, K, 8),
zero rows to a multiple of 8). The im2col buffer keeps its (K, N) layout, N rounded up
to a multiple of 48 (zero columns, written once), and the kernel reads its rows in
place; the output is pre-filled with the bias, which each sum starts from. Columns are
handed to threads 48 at a time and K is walked in blocks that keep a (KC x 48) slab of
columns in L1: every output element is the same sequence of multiply-adds (bias, then
k = 0, 1, ..., each rounded once: fused) whatever the split, so results are the same bits
on any thread count. They differ from BLAS's (another order) well inside the tolerances
the project compares with onnxruntime.
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
    step = _NR * (panels_per_call or max(1, npad // _NR))
    for j0 in range(0, npad, step):
        gemm(ap, bp.reshape(-1), c.reshape(-1), npad, npad, mp, k, j0, min(npad, j0 + step))
    return c[:m, :n].copy()


class ConvGemm:
    """One input shape's convolution: padded input, im2col buffer, output block, product.

    Built once per (input shape, thread); ``__call__(x, y)`` writes the (N, M, oh * ow)
    result into ``y``.
    """

    def __init__(self, xshape, ap: np.ndarray, bias: np.ndarray, k, strides, dil, pb, pe, out):
        from .nn_cpu import window_view

        n, c = xshape[:2]
        self.m = bias.shape[0]
        self.ap = ap.reshape(-1)
        self.mp, self.k = ap.shape[0] * _MR, ap.shape[1]
        self.lsz = out[0] * out[1]
        self.npad = -(-self.lsz // _NR) * _NR
        padded = any(pb) or any(pe)
        self.xp = np.zeros((1, c, *(s + b + e for s, b, e in zip(xshape[2:], pb, pe))), np.float32)
        self.interior = self.xp[0, :, pb[0] : pb[0] + xshape[2], pb[1] : pb[1] + xshape[3]]
        self.padded = padded
        self.view = window_view(self.xp, k, strides, dil, out)[0]  # (C, kh, kw, oh, ow)
        self.k_shape, self.strides, self.dil, self.out = k, strides, dil, out
        # zero columns past N: never NaN or denormal garbage in the padded lanes
        self.b = np.zeros((self.k, self.npad), np.float32)
        self.dst = self.b[:, : self.lsz].reshape(self.view.shape)
        # the output block (rows and columns padded) unless the padding is empty
        self.direct = self.mp == self.m and self.npad == self.lsz
        self.c = None if self.direct else np.empty((self.mp, self.npad), np.float32)
        bcol = np.zeros((self.mp, 1), np.float32)
        bcol[: self.m, 0] = bias
        self.bcol = bcol
        self.gemm = jit_gemm()

    def __call__(self, x: np.ndarray, y: np.ndarray) -> None:
        from .nn_cpu import window_view

        ap, b, gemm, k, npad, mp = (
            self.ap,
            self.b.reshape(-1),
            self.gemm,
            self.k,
            self.npad,
            self.mp,
        )
        panels = npad // _NR
        work = mp * k * npad
        for i in range(x.shape[0]):
            if self.padded:
                self.interior[...] = x[i]
                view = self.view
            else:
                view = window_view(x[i : i + 1], self.k_shape, self.strides, self.dil, self.out)[0]
            np.copyto(self.dst, view)
            c = y[i] if self.direct else self.c
            c[...] = self.bcol  # the sums start from the bias
            cf = c.reshape(-1)
            parallel_rows(
                panels,
                work,
                lambda p0, p1, cf=cf: gemm(ap, b, cf, npad, npad, mp, k, _NR * p0, _NR * p1),
            )
            if not self.direct:
                y[i] = self.c[: self.m, : self.lsz]


# The micro-kernel's block: 8 rows of weights x 48 columns (three 16-float vectors); K
# in blocks of 256 (a 48 KB slab of columns, this CPU's L1).
_MR = 8
_NR = 48
_KC = 256
_compiled: dict[str, Any] = {}


def jit_gemm() -> Any:
    """The compiled ``gemm(ap, b, c, ldb, ldc, mp, k, j0, j1)`` (compiled on first use,
    cached on disk): ``c[:mp, j0:j1] += A @ b[:, j0:j1]``, flat arrays, j0 and j1 multiples
    of 48."""
    f = _compiled.get("gemm")
    if f is None:
        if not jit.ENABLED:  # imports numba
            raise RuntimeError("the Conv GEMM needs numba")
        globals()["_mk"] = _make_micro_kernel()
        f = _compiled["gemm"] = jit.nb.njit(cache=True, nogil=True, boundscheck=False)(_gemm)
    return f


def _gemm(ap, b, c, ldb, ldc, mp, k, j0, j1):
    for jc in range(j0, j1, 48):
        for k0 in range(0, k, 256):
            kc = min(256, k - k0)
            for ip in range(mp // 8):
                _mk(ap, ip * 8 * k + k0 * 8, b, k0 * ldb + jc, ldb, c, ip * 8 * ldc + jc, ldc, kc)


def _mk(*args):  # replaced by the intrinsic before ``_gemm`` is compiled
    raise NotImplementedError


def _make_micro_kernel() -> Any:
    """``mk(ap, aoff, b, boff, ldb, c, coff, ldc, kc)``, a numba intrinsic: for r < 8 and
    the 48 columns from ``boff`` / ``coff``, ``c[coff + r ldc + j] += sum over k < kc of
    ap[aoff + 8 k + r] * b[boff + k ldb + j]``, one fused multiply-add a term, in k order.
    The 24 sums live in registers across the k loop (allocas LLVM promotes)."""
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    nv = _NR // 16

    def codegen(context, builder, signature, args):
        names = ("ap", "aoff", "b", "boff", "ldb", "c", "coff", "ldc", "kc")
        val = dict(zip(names, args))
        ty = dict(zip(names, signature.args))
        arr = {n: context.make_array(ty[n])(context, builder, val[n]) for n in ("ap", "b", "c")}
        i64 = ir.IntType(64)
        aoff, boff, ldb, coff, ldc, kc = (
            context.cast(builder, val[n], ty[n], types.intp)
            for n in ("aoff", "boff", "ldb", "coff", "ldc", "kc")
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
            bo = builder.add(boff, builder.mul(kk, ldb))
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

    def typer(typingctx, ap, aoff, b, boff, ldb, c, coff, ldc, kc):
        return types.void(ap, aoff, b, boff, ldb, c, coff, ldc, kc), codegen

    return intrinsic(typer)
