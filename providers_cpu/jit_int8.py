"""Compiled 8-bit loops: u8 x s8 products on AVX-512 VNNI, dynamic quantisation, byte im2col.

The integer kernels' products run on float BLAS when nothing better is here
(ops/int_gemm.py), which reads four bytes per weight where the model stores one:
ddddocr's [12, 1024] x [1024, 8210] classifier read 33 MB a run. On a CPU with
AVX-512 VNNI, ``vpdpbusd`` multiplies 64 unsigned by 64 signed bytes and adds each
group of four products into a 32-bit lane, the instruction onnxruntime's MLAS uses
for these products. LLVM does not emit it from a plain loop (it widens to 16 bits
and uses ``vpdpwssd``, a quarter of the work per instruction), so the tiles here call
it by name, through a numba intrinsic that writes the loop in LLVM IR.

Exactness needs no bound here: every product and sum is an integer in two's
complement, so the int32 lanes hold the true sum modulo 2^32 whatever the order,
and so do the zero-point corrections (``sum (a - za)(b - zb) = sum ab - zb sum a
- za sum b + K za zb``, in int32 that wraps). That is the int32 accumulator's
result, wrapping included.

Like ``jit.py``: numba optional (``jit.ENABLED``), loops compiled on first use with
the same options (cached on disk, GIL released). The products also need the
instruction: :func:`vnni` says whether numba targets this CPU and it has AVX-512
VNNI; without it the kernels keep the float BLAS path. The intrinsics, the drivers
that call them and the loops those call stay in this one file: numba's disk cache
checks only the file that defines a compiled function, so a callee kept elsewhere
could change under a stale cached caller.
"""

from __future__ import annotations

import functools
import hashlib
import types
from pathlib import Path
from typing import Any

import numpy as np

from . import jit, jit_int8_avx2

_compiled: dict[tuple[str, str], Any] = {}
_isa: str | None = None
_digest: str | None = None
_namespaces: dict[str, dict[str, Any]] = {}


def tiles() -> str:
    """Which tiles run here: "vnni" (AVX-512 VNNI's vpdpbusd), "avx2" (jit_int8_avx2's
    exact vpmaddwd product), or "" (numba off, another target, or no AVX2: the callers'
    float BLAS paths)."""
    global _isa
    if not jit.ENABLED:
        return ""
    if _isa is None:
        _isa = _host_isa()
    return _isa


def vnni() -> bool:
    """True when the tiles run on AVX-512 VNNI."""
    return tiles() == "vnni"


def runnable(isa: str) -> bool:
    """Whether ``isa``'s tiles can run here (AVX2's on a VNNI CPU too: tests run both)."""
    if not jit.ENABLED:
        return False
    host = _host_isa()
    return bool(host) and (isa in ("avx2", "avx2s") or isa == host)


def weights_isa(k: int, low: int) -> str:
    """The tiles for a uint8 x int8 product whose int8 side (K rows) has ``low`` as its
    least value: on AVX2 "avx2s" (sign pairs, 1.4x the widened product's rate) when no
    weight is -128 and K is a multiple of 4, else :func:`tiles`."""
    isa = tiles()
    if isa == "avx2" and k % 4 == 0 and low > -128:
        return "avx2s"
    return isa


@functools.cache
def _host_isa() -> str:
    try:
        import llvmlite.binding as ll
        from numba.core import config
    except Exception:  # a broken numba install: no tiles
        return ""
    if config.CPU_NAME or config.CPU_FEATURES:
        # numba told to compile for another CPU (a portable cache): the host's
        # features say nothing about the target's.
        return ""
    features = ll.get_host_cpu_features()
    if all(features.get(f, False) for f in ("avx512f", "avx512bw", "avx512vnni")):
        return "vnni"
    return "avx2" if features.get("avx2", False) else ""


def source_digest() -> str:
    """A digest of this file and jit_int8_avx2.py, for compiled callers kept in other files:
    numba's disk cache checks only the file that defines the caller, so recurrent_vnni's
    loops and the tile drivers here put this in their cache names, and an edited tile never
    comes back from a stale cache."""
    global _digest
    if _digest is None:
        h = hashlib.sha256(Path(__file__).read_bytes())
        h.update(Path(jit_int8_avx2.__file__).read_bytes())
        _digest = h.hexdigest()[:16]
    return _digest


def loop(name: str, isa: str | None = None) -> Any:
    """The compiled function ``name`` (defined below), compiling it on first use. Loops that
    run the tiles are compiled once per instruction set (``isa``, by default
    :func:`tiles`), each copy with its own tiles and its own cache name."""
    if not jit.ENABLED:  # also imports numba into jit.nb
        raise RuntimeError(f"jit_int8.loop({name!r}): compiled loops are off here")
    needs = name in _WITH_TILES
    if needs:
        isa = isa or tiles()
        if not isa:
            raise RuntimeError(f"jit_int8.loop({name!r}): no 8-bit tiles on this CPU")
    key = (name, isa if needs else "")
    f = _compiled.get(key)
    if f is None:
        src = _SOURCES[name]
        g = _namespace(isa) if needs else globals()
        for dep in _CALLS.get(name, ()):
            # a compiled callee, where the caller's compiled code looks it up
            g[f"_c_{dep}"] = loop(dep, isa)
        if needs:
            # a copy reading this ISA's tiles, under a name of its own: the disk cache
            # keys on the qualified name and checks only this file, not jit_int8_avx2.py
            src = types.FunctionType(src.__code__, g, src.__name__, src.__defaults__)
            src.__qualname__ = f"{name}_{isa}_{source_digest()}"
        f = _compiled[key] = jit.nb.njit(cache=True, nogil=True, boundscheck=False)(src)
    return f


def _namespace(isa: str) -> dict[str, Any]:
    """This module's globals with ``isa``'s tile intrinsics, where that ISA's copies of the
    drivers look their callees up."""
    g = _namespaces.get(isa)
    if g is None:
        g = _namespaces[isa] = dict(globals())
        g.update(make_tiles(isa))
    return g


def _tile_intrinsic(
    rows: int,
    vecs: int,
    x_unsigned: bool,
    float_out: bool,
    row_scale: bool,
    panel: bool = False,
    ways: int = 1,
    isa: str = "vnni",
) -> Any:
    """A rows x (16 * vecs) tile of a product on ``vpdpbusd`` (``isa`` "vnni") or widened
    ``vpmaddwd`` (``isa`` "avx2": jit_int8_avx2's loop, ``ways`` unused), as a numba
    intrinsic. ``isa`` "avx2s" is "avx2" with the uint8 x int8 kinds on sign pairs
    (jit_int8_avx2.accumulate_sign_pairs), for a ``y`` with no -128 and K a multiple of 4:

    ``tile(x, i0, y, j0, nk4, rs, zr, rc, zc, cc, mult, bias, out, jvalid)`` sets, for
    r < rows and the 16 * vecs columns j from j0 (those below ``jvalid``),

        acc = sum over k4 < nk4 of sum_q x[i0 + r, 4 k4 + q] * y[k4, 4 j + q]
        v = acc - rs[i] * zc[j] + zr[i] * cc[j] + rc[i]          (int32, wrapping)
        out[i, j] = v, or float32(v) * mult[j] + bias[j] when ``float_out``

    With ``row_scale`` the float32 output is ``float32(v) * mult[i]`` (a scale per row, no
    bias). ``x`` (rows, >= 4 nk4) is read four bytes at a time and broadcast to all 16 lanes;
    ``y`` (nk4, 4 * padded columns) holds, for each group of four k, each column's four
    bytes together, so one 64-byte load is 16 columns' next four k. ``x`` is the uint8
    operand when ``x_unsigned``, else the int8 one. The per-column arrays are padded to
    the 16-column vectors; ``out`` is written with masked stores, so it is not.

    With ``panel``, ``y`` is in panels of 64 columns (vnni_gemm.PackedB(panels=True)):
    panel p's nk4 rows of 256 bytes follow each other, so a 64-column tile streams one
    contiguous block (rows of ``y``: panels x nk4), and column j0 starts at byte
    ``(j0 // 64) * nk4 * 256 + (j0 % 64) * 4``. ``ways`` > 1 keeps that many sets of
    sums (k4 = w mod ways in set w), added at the end.
    """
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    names = ("x", "i0", "y", "j0", "nk4", "rs", "zr", "rc", "zc", "cc", "mult", "bias", "out")
    names += ("jvalid",)
    arrays = ("x", "y", "rs", "zr", "rc", "zc", "cc", "mult", "bias", "out")

    def codegen(context, builder, signature, args):
        val = dict(zip(names, args))
        ty = dict(zip(names, signature.args))
        i8, i32, i64, f32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
        v16, f16 = ir.VectorType(i32, 16), ir.VectorType(f32, 16)
        m16 = ir.VectorType(ir.IntType(1), 16)
        arr = {k: context.make_array(ty[k])(context, builder, val[k]) for k in arrays}

        def index(k):
            return context.cast(builder, val[k], ty[k], types.intp)

        def const(v):
            return ir.Constant(i64, v)

        def byte_ptr(k):
            return builder.bitcast(arr[k].data, i8.as_pointer())

        def at(k, idx, elem):
            return builder.gep(builder.bitcast(arr[k].data, elem.as_pointer()), [idx])

        def vector_at(k, idx, vty, elem):
            return builder.load(builder.bitcast(at(k, idx, elem), vty.as_pointer()), align=4)

        lanes0 = ir.Constant(v16, [0] * 16)

        def splat(v):
            und = ir.Constant(ir.VectorType(v.type, 16), ir.Undefined)
            one = builder.insert_element(und, v, ir.Constant(i32, 0))
            return builder.shuffle_vector(one, und, lanes0)

        i0, j0, nk4, jvalid = index("i0"), index("j0"), index("nk4"), index("jvalid")
        ldx = builder.extract_value(arr["x"].strides, 0)
        ldy = builder.extract_value(arr["y"].strides, 0)
        ldo = builder.extract_value(arr["out"].strides, 0)
        xrows = [
            builder.gep(byte_ptr("x"), [builder.mul(builder.add(i0, const(r)), ldx)])
            for r in range(rows)
        ]
        if panel:
            start = builder.add(
                builder.mul(builder.mul(builder.sdiv(j0, const(64)), nk4), ldy),
                builder.mul(builder.srem(j0, const(64)), const(4)),
            )
        else:
            start = builder.mul(j0, const(4))
        ycols = builder.gep(byte_ptr("y"), [start])
        ety = f16 if float_out else v16
        store = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(ir.VoidType(), [ety, ety.as_pointer(), i32, m16]),
            "llvm.masked.store.v16f32.p0" if float_out else "llvm.masked.store.v16i32.p0",
        )
        lanes = ir.Constant(v16, list(range(16)))
        out_bytes = byte_ptr("out")

        def finish(r, c, v):
            """Row r's sums ``v`` of vector c: the zero-point terms, the scale, the store."""
            col = builder.add(j0, const(16 * c))
            zc = vector_at("zc", col, v16, i32)
            cc = vector_at("cc", col, v16, i32)
            row = builder.add(i0, const(r))
            v = builder.sub(v, builder.mul(splat(builder.load(at("rs", row, i32))), zc))
            v = builder.add(v, builder.mul(splat(builder.load(at("zr", row, i32))), cc))
            v = builder.add(v, splat(builder.load(at("rc", row, i32))))
            if row_scale:
                scale = splat(builder.load(at("mult", row, f32)))
                v = builder.fmul(builder.sitofp(v, f16), scale)
            elif float_out:
                mult = vector_at("mult", col, f16, f32)
                bias = vector_at("bias", col, f16, f32)
                v = builder.fadd(builder.fmul(builder.sitofp(v, f16), mult), bias)
            off = builder.add(builder.mul(row, ldo), builder.mul(col, const(4)))
            dst = builder.bitcast(builder.gep(out_bytes, [off]), ety.as_pointer())
            # lanes past jvalid are not stored (a vector wholly past it stores nothing)
            left = builder.trunc(builder.sub(jvalid, col), i32)
            if isa in ("avx2", "avx2s"):
                # AVX2's masked store (vpmaskmovd) is microcoded on Zen: whole vectors
                # take a plain one
                full = builder.icmp_signed(">=", left, ir.Constant(i32, 16))
                with builder.if_else(full, likely=True) as (whole, part):
                    with whole:
                        builder.store(v, dst, align=4)
                    with part:
                        mask = builder.icmp_signed("<", lanes, splat(left))
                        builder.call(store, [v, dst, ir.Constant(i32, 4), mask])
            else:
                mask = builder.icmp_signed("<", lanes, splat(left))
                builder.call(store, [v, dst, ir.Constant(i32, 4), mask])

        if isa == "avx2s" and x_unsigned:
            # sums of (x - 128) y: 128 sum y = 128 (4 nk4 zc - cc) goes back on (K = 4 nk4
            # on this ISA, so cc = 4 nk4 zb - sum y, all wrapping alike)
            def finish_sign_pairs(r, c, v):
                col = builder.add(j0, const(16 * c))
                k4z = builder.mul(vector_at("zc", col, v16, i32), splat(builder.trunc(nk4, i32)))
                sums = builder.sub(builder.shl(k4z, splat(ir.Constant(i32, 2))),
                                   vector_at("cc", col, v16, i32))  # fmt: skip
                finish(r, c, builder.add(v, builder.shl(sums, splat(ir.Constant(i32, 7)))))

            # one row on sign pairs, pairs of rows widened (jit_int8_avx2 says why)
            jit_int8_avx2.accumulate(
                builder, xrows, ycols, ldy, nk4, rows, vecs, True, finish, lambda n: n == 2
            )
            jit_int8_avx2.accumulate_sign_pairs(
                builder, xrows, ycols, ldy, nk4, rows, vecs, finish_sign_pairs, lambda n: n == 1
            )
            return context.get_dummy_value()
        if isa in ("avx2", "avx2s"):
            wide = ty["x"].dtype.bitwidth == 16  # PackedConv's weights on AVX2
            jit_int8_avx2.accumulate(
                builder, xrows, ycols, ldy, nk4, rows, vecs, x_unsigned, finish, x_wide=wide
            )
            return context.get_dummy_value()
        dp = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(v16, [v16, v16, v16]), "llvm.x86.avx512.vpdpbusd.512"
        )
        zero = ir.Constant(v16, None)
        accs = [
            [[cgutils.alloca_once_value(builder, zero) for _ in range(vecs)] for _ in range(rows)]
            for _ in range(ways)
        ]
        acc = accs[0]

        def step(k, acc):
            ybase = builder.gep(ycols, [builder.mul(k, ldy)])
            yv = [
                builder.load(
                    builder.bitcast(builder.gep(ybase, [const(64 * c)]), v16.as_pointer()), align=1
                )
                for c in range(vecs)
            ]
            for r in range(rows):
                xp = builder.gep(xrows[r], [builder.mul(k, const(4))])
                xv = splat(builder.load(builder.bitcast(xp, i32.as_pointer()), align=1))
                for c in range(vecs):
                    ops = [xv, yv[c]] if x_unsigned else [yv[c], xv]
                    cur = builder.load(acc[r][c])
                    builder.store(builder.call(dp, [cur, *ops]), acc[r][c])

        if ways == 1:
            with cgutils.for_range(builder, nk4) as lp:
                step(lp.index, acc)
        else:
            # ``ways`` independent sums, each over every ways-th k4, added at the end (exact:
            # integers): a few rows' tile has too few accumulators to cover vpdpbusd's latency
            main = builder.sdiv(nk4, const(ways))
            with cgutils.for_range(builder, main) as lp:
                for w in range(ways):
                    step(builder.add(builder.mul(lp.index, const(ways)), const(w)), accs[w])
            tail = builder.sub(nk4, builder.mul(main, const(ways)))
            with cgutils.for_range(builder, tail) as lp:
                step(builder.add(builder.mul(main, const(ways)), lp.index), acc)
            for r in range(rows):
                for c in range(vecs):
                    total = builder.load(acc[r][c])
                    for w in range(1, ways):
                        total = builder.add(total, builder.load(accs[w][r][c]))
                    builder.store(total, acc[r][c])
        for c in range(vecs):
            for r in range(rows):
                finish(r, c, builder.load(acc[r][c]))
        return context.get_dummy_value()

    def typer(typingctx, x, i0, y, j0, nk4, rs, zr, rc, zc, cc, mult, bias, out, jvalid):
        sig = types.void(x, i0, y, j0, nk4, rs, zr, rc, zc, cc, mult, bias, out, jvalid)
        return sig, codegen

    return intrinsic(typer)


def make_tiles(isa: str) -> dict[str, Any]:
    """``isa``'s tile intrinsics by the names the drivers call: _u (uint8 x, int32 out), _s
    (int8 x, int32 out), _f (uint8 x, float32 out, a scale and bias per column), _r (int8
    x, float32 out, a scale per row); 4x4, 4x1, 1x4, 1x1. On panels (64 columns, padded):
    _pu (as _u) and _pf (as _f), 1 to 4 rows: a recurrent step's product has as many rows
    as the batch, and each row tile reads the panel once."""
    g = {}
    for tag, float_out in (("pu", False), ("pf", True)):
        for rows in (1, 2, 3, 4):
            # one row: two sets of sums (8 in flight), 20% faster on [1, 256] x [256, 1024];
            # two rows already run at the cache's bandwidth
            ways = 2 if rows == 1 else 1
            g[f"_{tag}{rows}4"] = _tile_intrinsic(
                rows, 4, True, float_out, False, panel=True, ways=ways, isa=isa
            )
    kinds = (
        ("u", True, False, False),
        ("s", False, False, False),
        ("f", True, True, False),
        ("r", False, True, True),
    )
    for tag, x_unsigned, float_out, row_scale in kinds:
        for rows, vecs in ((4, 4), (4, 1), (1, 4), (1, 1)):
            g[f"_{tag}{rows}{vecs}"] = _tile_intrinsic(
                rows, vecs, x_unsigned, float_out, row_scale, isa=isa
            )
    return g


def _gemm_int(x_signed, x, y, nk4, rs, zr, rc, zc, cc, out, jvalid, i0, i1, j0, j1):
    """Rows i0..i1 and columns j0..j1 (j0 a multiple of 16) of the int32 tile product
    (see _tile_intrinsic), x uint8 (``x_signed`` 0) or int8 (1): 4 x 64 tiles, then
    narrower ones at the edges."""
    f = np.empty(0, np.float32)
    j = j0
    while j < j1:
        wide = j + 48 < j1
        i = i0
        while i < i1:
            four = i + 4 <= i1
            if x_signed:
                if four and wide:
                    _s44(x, i, y, j, nk4, rs, zr, rc, zc, cc, f, f, out, jvalid)  # noqa: F821
                elif four:
                    _s41(x, i, y, j, nk4, rs, zr, rc, zc, cc, f, f, out, jvalid)  # noqa: F821
                elif wide:
                    _s14(x, i, y, j, nk4, rs, zr, rc, zc, cc, f, f, out, jvalid)  # noqa: F821
                else:
                    _s11(x, i, y, j, nk4, rs, zr, rc, zc, cc, f, f, out, jvalid)  # noqa: F821
            elif four and wide:
                _u44(x, i, y, j, nk4, rs, zr, rc, zc, cc, f, f, out, jvalid)  # noqa: F821
            elif four:
                _u41(x, i, y, j, nk4, rs, zr, rc, zc, cc, f, f, out, jvalid)  # noqa: F821
            elif wide:
                _u14(x, i, y, j, nk4, rs, zr, rc, zc, cc, f, f, out, jvalid)  # noqa: F821
            else:
                _u11(x, i, y, j, nk4, rs, zr, rc, zc, cc, f, f, out, jvalid)  # noqa: F821
            i += 4 if four else 1
        j += 64 if wide else 16


def _gemm_float(x, y, nk4, rs, zr, rc, zc, cc, mult, bias, out, jvalid, i0, i1, j0, j1):
    """_gemm_int for uint8 x with the float32 output ``float32(v) * mult + bias``."""
    j = j0
    while j < j1:
        wide = j + 48 < j1
        i = i0
        while i < i1:
            four = i + 4 <= i1
            if four and wide:
                _f44(x, i, y, j, nk4, rs, zr, rc, zc, cc, mult, bias, out, jvalid)  # noqa: F821
            elif four:
                _f41(x, i, y, j, nk4, rs, zr, rc, zc, cc, mult, bias, out, jvalid)  # noqa: F821
            elif wide:
                _f14(x, i, y, j, nk4, rs, zr, rc, zc, cc, mult, bias, out, jvalid)  # noqa: F821
            else:
                _f11(x, i, y, j, nk4, rs, zr, rc, zc, cc, mult, bias, out, jvalid)  # noqa: F821
            i += 4 if four else 1
        j += 64 if wide else 16


def _gemm_row_scaled(x, y, nk4, rs, zr, rc, zc, cc, mult, out, jvalid, i0, i1, j0, j1):
    """_gemm_int for int8 x with the float32 output ``float32(v) * mult[row]``."""
    j = j0
    while j < j1:
        wide = j + 48 < j1
        i = i0
        while i < i1:
            four = i + 4 <= i1
            if four and wide:
                _r44(x, i, y, j, nk4, rs, zr, rc, zc, cc, mult, mult, out, jvalid)  # noqa: F821
            elif four:
                _r41(x, i, y, j, nk4, rs, zr, rc, zc, cc, mult, mult, out, jvalid)  # noqa: F821
            elif wide:
                _r14(x, i, y, j, nk4, rs, zr, rc, zc, cc, mult, mult, out, jvalid)  # noqa: F821
            else:
                _r11(x, i, y, j, nk4, rs, zr, rc, zc, cc, mult, mult, out, jvalid)  # noqa: F821
            i += 4 if four else 1
        j += 64 if wide else 16


def _panels_int(x, y, nk4, rs, zr, rc, zc, cc, out, jvalid, i0, i1, j0, j1):
    """Rows i0..i1, columns j0..j1 (j0 a multiple of 64) of the int32 product of uint8 ``x``
    by ``y`` in panels (see _tile_intrinsic): per panel, every row tile (4 rows, then the
    3, 2 or 1 left), so the panel is read from memory once and from cache after."""
    f = np.empty(0, np.float32)
    for j in range(j0, j1, 64):
        i = i0
        while i + 4 <= i1:
            _pu44(x, i, y, j, nk4, rs, zr, rc, zc, cc, f, f, out, jvalid)  # noqa: F821
            i += 4
        left = i1 - i
        if left == 3:
            _pu34(x, i, y, j, nk4, rs, zr, rc, zc, cc, f, f, out, jvalid)  # noqa: F821
        elif left == 2:
            _pu24(x, i, y, j, nk4, rs, zr, rc, zc, cc, f, f, out, jvalid)  # noqa: F821
        elif left == 1:
            _pu14(x, i, y, j, nk4, rs, zr, rc, zc, cc, f, f, out, jvalid)  # noqa: F821


def _panels_float(x, y, nk4, rs, zr, rc, zc, cc, mult, bias, out, jvalid, i0, i1, j0, j1):
    """_panels_int with the float32 output ``float32(v) * mult + bias`` (per column)."""
    for j in range(j0, j1, 64):
        i = i0
        while i + 4 <= i1:
            _pf44(x, i, y, j, nk4, rs, zr, rc, zc, cc, mult, bias, out, jvalid)  # noqa: F821
            i += 4
        left = i1 - i
        if left == 3:
            _pf34(x, i, y, j, nk4, rs, zr, rc, zc, cc, mult, bias, out, jvalid)  # noqa: F821
        elif left == 2:
            _pf24(x, i, y, j, nk4, rs, zr, rc, zc, cc, mult, bias, out, jvalid)  # noqa: F821
        elif left == 1:
            _pf14(x, i, y, j, nk4, rs, zr, rc, zc, cc, mult, bias, out, jvalid)  # noqa: F821


def _mm_prep(a, flip, za, buf, sa, zr, ncols, mult, bias, mv, bv):
    """A's side of a product on the tiles, and the scale and bias padded to the vectors.

    Rows of ``a`` (M, K) into ``buf`` (M, 4 nk4) as uint8 (int8 ``a`` plus 128: ``flip``),
    zeros after K; their sums into ``sa``; ``zr[m] = za[m % len(za)] + flip`` (a zero point
    per tensor or per row of each matrix). ``mv`` gets ``mult`` (one value or one per
    column) and ``bv`` ``bias`` (none: -0.0, which adding leaves every float32 as it is,
    -0.0 included), both zero past ``ncols``; both empty for an int32 product."""
    m_rows, k = a.shape
    for m in range(m_rows):
        s = np.int32(0)
        src = a[m]
        dst = buf[m]
        for j in range(k):
            v = np.uint8(np.int32(src[j]) + flip)
            dst[j] = v
            s += np.int32(v)
        for j in range(k, dst.shape[0]):
            dst[j] = 0
        sa[m] = s
        zr[m] = np.int32(za[m % za.shape[0]] + flip)
    if mv.shape[0] == 0:
        return
    n = mult.shape[0]
    nb = bias.shape[0]
    for j in range(mv.shape[0]):
        mv[j] = 0
        bv[j] = 0
    for j in range(ncols):
        mv[j] = mult[j if n > 1 else 0]
        bv[j] = bias[j if nb > 1 else 0] if nb else np.float32(-0.0)


def _im2col4(x, flip, pad, kh, kw, sh, sw, dh, dw, ph, pw, oh, ow, cols, zplane):
    """Windows of ``x`` (C, H, W) as the tiles' ``y``: ``cols`` (taps * C4 / 4, P') uint32.

    Word ``[(tap * C4 + c) // 4, p]`` holds, for output position p (row-major over OH x
    OW), the bytes of channels c..c+3 (low byte first) at tap (kh, kw) of its window:
    the pixel xor ``flip`` (128 for int8 x), ``pad`` (the zero point) outside the image,
    and 0 for the channels past C up to C4 (a multiple of 4); ``zplane`` is H * W zeros.
    Each word is made from four channels and stored whole, so the loops vectorize. When
    a window's rows follow each other as the output's do (stride 1, output as wide as
    the input: "same" convolutions), one loop runs over all of a tap's rows, and the
    columns it took from the neighbouring row are set to ``pad`` after; otherwise each
    output row is a loop of its own.
    """
    c_n, h, w = x.shape
    c4n = cols.shape[0] // (kh * kw)
    p = oh * ow
    flat = sw == 1 and sh * w == ow
    for ky in range(kh):
        dy = ky * dh - ph
        # output rows whose tap row is inside the image: 0 <= oy * sh + dy < h
        oy_lo = 0 if dy >= 0 else min(oh, (-dy + sh - 1) // sh)
        oy_hi = max(oy_lo, min(oh, (h - dy + sh - 1) // sh))
        for kx in range(kw):
            dx = kx * dw - pw
            # and columns: 0 <= ox * sw + dx < w
            lo = 0 if dx >= 0 else min(ow, (-dx + sw - 1) // sw)
            hi = max(lo, min(ow, (w - dx + sw - 1) // sw))
            n = hi - lo
            for c4 in range(c4n):
                dst = cols[(ky * kw + kx) * c4n + c4]
                c = 4 * c4
                fw = np.uint32(0)
                pw_ = np.uint32(0)
                for q in range(4):
                    if c + q < c_n:
                        fw |= np.uint32(flip) << np.uint32(8 * q)
                        pw_ |= np.uint32(pad) << np.uint32(8 * q)
                p0 = x[c].reshape(-1) if c < c_n else zplane
                p1 = x[c + 1].reshape(-1) if c + 1 < c_n else zplane
                p2 = x[c + 2].reshape(-1) if c + 2 < c_n else zplane
                p3 = x[c + 3].reshape(-1) if c + 3 < c_n else zplane
                dst[: oy_lo * ow] = pw_
                dst[oy_hi * ow : p] = pw_
                if oy_hi == oy_lo:
                    continue
                if n <= 0:
                    dst[oy_lo * ow : oy_hi * ow] = pw_
                    continue
                if flat:
                    t0 = oy_lo * ow + lo
                    m = (oy_hi - 1) * ow + hi - t0
                    s0 = (oy_lo * sh + dy) * w + lo + dx
                    # slices, so the loop's indices start at 0 (no negative-index checks)
                    d = dst[t0 : t0 + m]
                    a0 = p0[s0 : s0 + m]
                    a1 = p1[s0 : s0 + m]
                    a2 = p2[s0 : s0 + m]
                    a3 = p3[s0 : s0 + m]
                    for t in range(m):
                        v = (
                            np.uint32(a0[t])
                            | (np.uint32(a1[t]) << np.uint32(8))
                            | (np.uint32(a2[t]) << np.uint32(16))
                            | (np.uint32(a3[t]) << np.uint32(24))
                        )
                        d[t] = v ^ fw
                    if lo > 0 or hi < ow:
                        for oy in range(oy_lo, oy_hi):
                            dst[oy * ow : oy * ow + lo] = pw_
                            dst[oy * ow + hi : (oy + 1) * ow] = pw_
                    continue
                for oy in range(oy_lo, oy_hi):
                    base = oy * ow
                    dst[base : base + lo] = pw_
                    dst[base + hi : base + ow] = pw_
                    s0 = (oy * sh + dy) * w + lo * sw + dx
                    e = s0 + (n - 1) * sw + 1
                    d = dst[base + lo : base + hi]
                    a0 = p0[s0:e:sw]
                    a1 = p1[s0:e:sw]
                    a2 = p2[s0:e:sw]
                    a3 = p3[s0:e:sw]
                    for t in range(n):
                        v = (
                            np.uint32(a0[t])
                            | (np.uint32(a1[t]) << np.uint32(8))
                            | (np.uint32(a2[t]) << np.uint32(16))
                            | (np.uint32(a3[t]) << np.uint32(24))
                        )
                        d[t] = v ^ fw


def _conv_image(
    x,
    flip,
    pad,
    kh,
    kw,
    sh,
    sw,
    dh,
    dw,
    ph,
    pw,
    oh,
    ow,
    cols,
    cols8,
    zplane,
    wx,
    nk4,
    rs,
    zr,
    kzs,
    add,
    mult,
    y,
    yf,
):
    """One image of a convolution on the tiles from ``x`` (C, H, W) uint8 (int8 read as
    uint8, ``flip`` 128) minus ``pad`` - flip, and the packed weights ``wx``
    (vnni_gemm.PackedConv): the windows (im2col4) into ``cols`` (uint32; ``cols8`` the
    same memory as bytes), their sums, and the product, whose per-row constant is
    ``pad * kzs + add`` (``add`` one int32 per output channel, or empty). The int32
    result goes to ``y`` (O, OH * OW); when ``yf`` is not empty, ``float32(it) *
    mult[channel]`` goes to ``yf`` instead."""
    p = oh * ow
    _c_im2col4(x, flip, pad, kh, kw, sh, sw, dh, dw, ph, pw, oh, ow, cols, zplane)  # noqa: F821
    sums = np.empty(cols.shape[1], np.int32)
    _c_col_sums(cols8, p, sums)  # noqa: F821
    cc = np.zeros(cols.shape[1], np.int32)
    o_n = kzs.shape[0]
    rc = np.empty(o_n, np.int32)
    for o in range(o_n):
        v = np.int64(pad) * kzs[o]
        if add.shape[0]:
            v += np.int64(add[o])
        rc[o] = np.int32(v)
    if yf.shape[0]:
        _c_gemm_row_scaled(wx, cols8, nk4, rs, zr, rc, sums, cc, mult, yf, p, 0, o_n, 0, p)  # noqa: F821
    else:
        _c_gemm_int(1, wx, cols8, nk4, rs, zr, rc, sums, cc, y, p, 0, o_n, 0, p)  # noqa: F821


def _col_sums(cols, p, out):
    """out[j] = the sum of column j's bytes over every row of the tiles' ``y`` layout."""
    for j in range(p):
        out[j] = 0
    for r in range(cols.shape[0]):
        row = cols[r]
        for j in range(p):
            q = 4 * j
            out[j] += (
                np.int32(row[q])
                + np.int32(row[q + 1])
                + np.int32(row[q + 2])
                + np.int32(row[q + 3])
            )


def _dq_uint8(x, xi, out):
    """DynamicQuantizeLinear of flat float32 ``x`` (``xi`` its bits as int32) into ``out``.

    Returns (finite, scale, zero point): the range in one pass over the bits (ordered
    as integers, so the reduction vectorizes without fast-math: a float's bits xor
    0x7fffffff where negative sort as the floats do, NaN past the infinities), then
    the NumPy kernel's float32 operations: range widened to 0, scale, zero point, and
    clip(rint(x / scale) + zp, 0, 255) element by element. False, with ``out``
    unwritten, if a value is NaN or infinite (NumPy's rules then apply).
    """
    mask = np.int32(0x7FFFFFFF)
    kmin = np.int32(0x7FFFFFFF)
    kmax = np.int32(-0x80000000)
    for i in range(xi.shape[0]):
        v = xi[i]
        key = np.int32(v ^ ((v >> np.int32(31)) & mask))
        kmin = min(kmin, key)
        kmax = max(kmax, key)
    # +inf is 0x7f800000; -inf's key is 0xff800000 ^ 0x7fffffff
    if kmax >= np.int32(0x7F800000) or kmin <= np.int32(-0x7F800001):
        return False, np.float32(0.0), np.float32(0.0)
    bits = np.empty(2, np.int32)
    bits[0] = np.int32(kmin ^ ((kmin >> np.int32(31)) & mask))
    bits[1] = np.int32(kmax ^ ((kmax >> np.int32(31)) & mask))
    fl = bits.view(np.float32)
    zero = np.float32(0.0)
    top = np.float32(255.0)
    lo = min(fl[0], zero)
    hi = max(fl[1], zero)
    scale = np.float32((hi - lo) / top)
    safe = np.float32(1.0) if scale == zero else scale
    zp = np.float32(min(max(np.float32(np.rint(-lo / safe)), zero), top))
    for i in range(x.shape[0]):
        q = np.float32(np.rint(x[i] / safe)) + zp
        if q < zero:
            q = zero
        if q > top:
            q = top
        out[i] = np.uint8(q)
    return True, scale, zp


def _dq_matmul(x, k, nk4, y, zc, cc, bs, bv, out):
    """DynamicQuantizeMatMul on the tiles in one call: ``x`` (M * K float32) quantized as
    DynamicQuantizeLinear does, its rows (padded to 4 nk4 when K is not), sums and zero
    points, the scale ``a_scale * bs[j]`` (a_scale 1 for a zero range, as the op has it),
    and ``float32(acc) * scale + bv`` into ``out`` (M, N). False, with nothing written to
    ``out``, when a value of ``x`` is NaN or infinite. The buffers are made here: each
    array handed in from Python costs a dispatch check (about 0.1 us)."""
    q = np.empty(x.shape[0], np.uint8)
    ok, scale, zp = _c_dq_uint8(x, x.view(np.int32), q)  # noqa: F821
    if not ok:
        return False
    m_rows, n = out.shape
    rows = q.reshape(m_rows, k)
    if 4 * nk4 == k:
        buf = rows
    else:
        buf = np.zeros((m_rows, 4 * nk4), np.uint8)
        buf[:, :k] = rows
    sa = np.empty(m_rows, np.int32)
    zr = np.full(m_rows, np.int32(zp), np.int32)
    rc = np.zeros(m_rows, np.int32)
    for m in range(m_rows):
        s = np.int32(0)
        r = rows[m]
        for j in range(k):
            s += np.int32(r[j])
        sa[m] = s
    a_scale = np.float32(1.0) if scale == np.float32(0.0) else scale
    mv = np.empty(bs.shape[0], np.float32)
    for j in range(mv.shape[0]):
        mv[j] = a_scale * bs[j]
    _c_gemm_float(buf, y, nk4, sa, zr, rc, zc, cc, mv, bv, out, n, 0, m_rows, 0, n)  # noqa: F821
    return True


_SOURCES = {
    "gemm_int": _gemm_int,
    "gemm_float": _gemm_float,
    "gemm_row_scaled": _gemm_row_scaled,
    "panels_int": _panels_int,
    "panels_float": _panels_float,
    "mm_prep": _mm_prep,
    "im2col4": _im2col4,
    "col_sums": _col_sums,
    "conv_image": _conv_image,
    "dq_uint8": _dq_uint8,
    "dq_matmul": _dq_matmul,
}
_CALLS = {
    "conv_image": ("im2col4", "col_sums", "gemm_int", "gemm_row_scaled"),
    "dq_matmul": ("dq_uint8", "gemm_float"),
}
# the loops that call tiles (directly or through a callee): compiled once per ISA
_WITH_TILES = frozenset(
    {"gemm_int", "gemm_float", "gemm_row_scaled", "panels_int", "panels_float"}
    | {"conv_image", "dq_matmul"}
)
