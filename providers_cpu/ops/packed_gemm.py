"""The register-blocked float32 GEMM the CPU provider compiles (numba + llvmlite).

numba's LLVM compiles for the host CPU, so the vectors written here are that CPU's widest:
on AVX-512 an 8 x 48 block of the output in 24 zmm registers (per K step three 16-float
loads of B, eight broadcasts of A, 24 fused multiply-adds), on AVX2 a 6 x 16 block in 12
ymm registers (two loads, six broadcasts, 12 fused multiply-adds; 16 registers in all).
The block is fixed by the CPU's flags when the module is imported, never by a setting:
numba's disk cache is keyed by the source and the CPU, not by the globals it freezes.

A (the weights) is packed once into panels of ``_MR`` rows, K-major ((M/_MR, K, _MR), zero
rows to a multiple of ``_MR``). Row t of B is read from ``b[koff[t]:]``, so a caller may
point B's rows into a padded image (a stride-1 convolution's columns, no im2col copy) or
into a packed buffer. Columns are handed to threads ``_NR`` at a time and K is walked in
blocks of ``_KC`` that keep a (KC x NR) slab of B in L1: every output element is the same
sequence of fused multiply-adds (its start value, then k = 0, 1, ...) whatever the split,
so the bits do not depend on the thread count. They differ from BLAS's (another order).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import jit
from ..openblas_core import cpu_flags


def block_for(flags: frozenset[str]) -> tuple[int, int, int, int]:
    """(vector width, rows, columns, K block) of the micro-kernel for a CPU's flags.

    AVX-512: 8 x 48 and K blocks of 256 (a 48 KB slab: Zen 5's L1). Otherwise 8-float
    vectors, 6 x 16 (12 accumulators, as many as two FMA pipes of latency 4 need, and
    three registers left for B and the broadcast); on Zen 3, one core, it ran
    64 x 576 x 1600 at 84-88 GFLOP/s, OpenBLAS's Haswell kernel 83-84. 4 x 24 was
    10-25% slower, K blocks of 512 no better than 256 (docs/cpu_kernels.md).
    """
    if "avx512f" in flags:
        return 16, 8, 48, 256
    return 8, 6, 16, 256


def fits(flags: frozenset[str] | None) -> bool:
    """Whether the CPU has the vector FMA the kernel is built for (else it runs, slowly,
    on whatever LLVM makes of 8-float FMAs)."""
    return flags is not None and ("avx512f" in flags or {"avx2", "fma"} <= flags)


_VW, _MR, _NR, _KC = block_for(cpu_flags() or frozenset())


def block_name() -> str:
    """The block, for the status lines: ``AVX-512, 8 x 48``."""
    return f"{'AVX-512' if _VW == 16 else 'AVX2'}, {_MR} x {_NR}"


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
        gemm(
            ap,
            _MR * k,
            _MR,
            1,
            bp.reshape(-1),
            koff,
            _NR,
            c.reshape(-1),
            npad,
            mp,
            k,
            j0,
            min(npad, j0 + step),
        )
    return c[:m, :n].copy()


_compiled: dict[str, Any] = {}


def jit_gemm() -> Any:
    """The compiled ``gemm(ap, aps, ask, asr, b, koff, bps, c, ldc, mp, k, j0, j1)``
    (compiled on first use, cached on disk): ``c[:mp, j0:j1] += A @ B[:, j0:j1]``, flat
    arrays. A's element (i, t) is ``ap[(i // _MR) * aps + t * ask + (i % _MR) * asr]``:
    ``(_MR * K, _MR, 1)`` for packed panels (``pack_weights``), ``(_MR * lda, 1, lda)``
    for A as it is, rows ``lda`` apart (no copy; ``mp`` full panels of rows). Row t
    of the column panel that starts at column j is read from ``b[koff[t] + (j // _NR) *
    bps]``: ``bps = _NR`` for B's rows laid out whole (a padded image's), ``K * _NR`` for
    B packed panel by panel (a constant weight's: each panel's rows contiguous, where rows
    a power of two apart would share a few cache sets); j0 and j1 multiples of
    ``_NR``."""
    f = _compiled.get("gemm")
    if f is None:
        if not jit.ENABLED:  # imports numba
            raise RuntimeError("the Conv GEMM needs numba")
        globals()["_mk"] = _make_micro_kernel()
        f = _compiled["gemm"] = jit.nb.njit(cache=True, nogil=True, boundscheck=False)(_gemm)
    return f


def _gemm(ap, aps, ask, asr, b, koff, bps, c, ldc, mp, k, j0, j1):
    for jc in range(j0, j1, _NR):
        jb = (jc // _NR) * bps
        for k0 in range(0, k, _KC):
            kc = min(_KC, k - k0)
            for ip in range(mp // _MR):
                aoff = ip * aps + k0 * ask
                _mk(ap, aoff, ask, asr, b, koff, k0, jb, c, ip * _MR * ldc + jc, ldc, kc)


def _mk(*args):  # replaced by the intrinsic before ``_gemm`` is compiled
    raise NotImplementedError


def _make_micro_kernel() -> Any:
    """``mk(ap, aoff, ask, asr, b, koff, k0, jb, c, coff, ldc, kc)``, a numba intrinsic:
    for r < _MR and j < _NR, ``c[coff + r ldc + j] += sum over t < kc of ap[aoff + t ask
    + r asr] * b[koff[k0 + t] + jb + j]``, one fused multiply-add a term, in t order.
    The sums live in registers across the k loop (allocas LLVM promotes)."""
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    nv, vw = _NR // _VW, _VW

    def codegen(context, builder, signature, args):
        names = ("ap", "aoff", "ask", "asr", "b", "koff", "k0", "jb", "c", "coff", "ldc", "kc")
        val = dict(zip(names, args))
        ty = dict(zip(names, signature.args))
        arr = {
            n: context.make_array(ty[n])(context, builder, val[n]) for n in ("ap", "b", "koff", "c")
        }
        i64 = ir.IntType(64)
        aoff, ask, asr, k0, jb, coff, ldc, kc = (
            context.cast(builder, val[n], ty[n], types.intp)
            for n in ("aoff", "ask", "asr", "k0", "jb", "coff", "ldc", "kc")
        )
        vty = ir.VectorType(ir.FloatType(), vw)
        fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vty, [vty] * 3), f"llvm.fma.v{vw}f32"
        )

        def const(v):
            return ir.Constant(i64, v)

        def vptr(name, idx):
            return builder.bitcast(builder.gep(arr[name].data, [idx]), vty.as_pointer())

        def c_at(r, v):
            return vptr(
                "c", builder.add(builder.add(coff, builder.mul(ldc, const(r))), const(vw * v))
            )

        accs = [
            cgutils.alloca_once_value(builder, builder.load(c_at(r, v), align=4))
            for r in range(_MR)
            for v in range(nv)
        ]
        roff = [builder.mul(asr, const(r)) for r in range(_MR)]
        undef = ir.Constant(vty, ir.Undefined)
        lane0 = ir.Constant(ir.IntType(32), 0)
        splat = ir.Constant(ir.VectorType(ir.IntType(32), vw), [0] * vw)
        with cgutils.for_range(builder, kc) as lp:
            kk = lp.index
            row = builder.load(builder.gep(arr["koff"].data, [builder.add(k0, kk)]))
            bo = builder.add(row, jb)
            bv = [
                builder.load(vptr("b", builder.add(bo, const(vw * v))), align=4) for v in range(nv)
            ]
            ao = builder.add(aoff, builder.mul(kk, ask))
            for r in range(_MR):
                a = builder.load(builder.gep(arr["ap"].data, [builder.add(ao, roff[r])]))
                av = builder.shuffle_vector(builder.insert_element(undef, a, lane0), undef, splat)
                for v in range(nv):
                    p = accs[r * nv + v]
                    builder.store(builder.call(fma, [av, bv[v], builder.load(p)]), p)
        for r in range(_MR):
            for v in range(nv):
                builder.store(builder.load(accs[r * nv + v]), c_at(r, v), align=4)
        return context.get_dummy_value()

    def typer(typingctx, ap, aoff, ask, asr, b, koff, k0, jb, c, coff, ldc, kc):
        return types.void(ap, aoff, ask, asr, b, koff, k0, jb, c, coff, ldc, kc), codegen

    return intrinsic(typer)
