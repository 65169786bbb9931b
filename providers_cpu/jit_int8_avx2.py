"""The 8-bit tiles' product on AVX2 (no VNNI): exact u8 x s8 sums with ``vpmaddwd``.

jit_int8's tiles multiply with AVX-512 VNNI's ``vpdpbusd``. Without it, x86 has
``vpmaddubsw`` (u8 x s8 pairs summed into int16), which SATURATES: two products of
255 * -128 sum to -65280, clamped to -32768. onnxruntime's MLAS uses it on AVX2 and its
results are then inexact (tests/ort_int8_reference.py); ours must be the integer sum.
So both operands are widened to int16 first and multiplied by ``vpmaddwd`` (int16 x
int16, adjacent pairs summed into int32): a pair of 8-bit products is at most 2 * 255 *
128 in magnitude, far inside int32, and the only case ``vpmaddwd`` itself wraps
(-32768 * -32768 twice) cannot occur on widened bytes. Two instructions (``vpmaddwd``,
``vpaddd``) for 16 multiply-adds, as many multiplies per product as MLAS's
``vpmaddubsw`` + ``vpmaddwd`` pair.

The layouts are jit_int8's, unchanged (the same packed weights, windows and drivers):
``y`` holds each column's four k together, so 16 bytes of a row of ``y`` widened to 16
int16 lanes are four columns' four k, and ``x``'s four bytes widened and repeated four
times line up with them. ``vpmaddwd`` leaves two int32 lanes per column (k 0+1, k 2+3);
they are added once per tile, after the loop over k (integers: exact in any order).

AVX2 has 16 vector registers: a block of 16 columns holds four accumulators a row, so a
tile runs in blocks of 2 rows x 16 columns or 1 row x 32 (8 accumulators, beside the
widened ``y`` and the rows' broadcast ``x``), each block a loop over k of its own; the
panel or rows of ``y`` it reads stay in L1 for the next block.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: llvm.x86.avx2.pmadd.wd: (<16 x i16>, <16 x i16>) -> <8 x i32>
_PMADDWD = "llvm.x86.avx2.pmadd.wd"


def blocks(rows: int, vecs: int, per_vector: int = 4) -> list[tuple[int, int, int, int]]:
    """A tile's blocks as (first row, rows, first vector, vectors) holding 8 accumulators
    (``per_vector`` a row and 16-column vector: 4 widened, 2 on sign pairs): 2 rows x 1
    vector or 1 row x 2 widened, 2 x 2 or 1 x 4 on sign pairs."""
    out = []
    # rows in pairs: three rows' 12 accumulators left LLVM rotating registers through
    # moves and the stack every k4 (1.5x the time of a pair and a single row)
    for r0 in range(0, rows, 2):
        nr = min(2, rows - r0)
        step = 8 // (per_vector * nr)
        for c0 in range(0, vecs, step):
            out.append((r0, nr, c0, min(step, vecs - c0)))
    return out


def accumulate(
    builder: Any,
    xrows: list,
    ycols: Any,
    ldy: Any,
    nk4: Any,
    rows: int,
    vecs: int,
    x_unsigned: bool,
    finish: Callable[[int, int, Any], None],
    rows_of: Callable[[int], bool] = lambda nr: True,
    x_wide: bool = False,
) -> None:
    """Emit the tile's product: for each block (:func:`blocks`), a loop over the ``nk4``
    groups of four k, then ``finish(r, c, v)`` with ``v`` (<16 x i32>) the sums of row r's
    16 columns of vector c (jit_int8's epilogue). ``xrows[r]`` points at row r of ``x``
    (i8*), ``ycols`` at the tile's first column in row 0 of ``y``, ``ldy`` is y's row
    stride in bytes; ``x_unsigned``: x is the uint8 operand and y the int8 one (else the
    other way round). ``x_wide``: x holds its 8-bit values as int16 already (convolution
    weights, widened once when packed), so each row's four k are one 8-byte broadcast
    load, with no shuffle. ``rows_of(n)`` says which blocks (by row count) to emit."""
    from llvmlite import ir
    from numba.core import cgutils

    i8, i16, i32, i64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
    v16b = ir.VectorType(i8, 16)
    v16w = ir.VectorType(i16, 16)
    v8d = ir.VectorType(i32, 8)
    pmadd = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(v8d, [v16w, v16w]), _PMADDWD
    )
    y_ext = builder.sext if x_unsigned else builder.zext
    v8i, v32b = ir.VectorType(i32, 8), ir.VectorType(i8, 32)
    # x's four bytes widened to int16 and repeated: the word broadcast (a load), then one
    # byte shuffle (vpshufb) that puts byte j % 4 in 16-bit lane j's low byte and zero in
    # its high one (uint8), or in its high byte and zero in the low one, then an arithmetic
    # shift by 8 (int8): a zext/sext and a broadcast cost three shuffles a row and k4
    picks = []
    for p in range(32):  # byte p of the result: 16-bit lane p // 2, in 128-bit half p // 16
        low_half = p % 2 == 0
        picks.append(16 * (p // 16) + (p // 2) % 4 if low_half == x_unsigned else 32)
    pick = ir.Constant(ir.VectorType(i32, 32), picks)
    splat8 = ir.Constant(v8i, [0] * 8)
    zeros32 = ir.Constant(v32b, None)
    by8 = ir.Constant(v16w, [8] * 16)

    undef8 = ir.Constant(v8i, ir.Undefined)

    def x_widened(word):
        one = builder.insert_element(undef8, word, ir.Constant(i32, 0))
        b = builder.bitcast(builder.shuffle_vector(one, undef8, splat8), v32b)
        w = builder.bitcast(builder.shuffle_vector(b, zeros32, pick), v16w)
        return w if x_unsigned else builder.ashr(w, by8)

    v4q = ir.VectorType(i64, 4)
    undef4q = ir.Constant(v4q, ir.Undefined)
    splat4 = ir.Constant(ir.VectorType(i32, 4), [0] * 4)

    def x_row(r, k):
        """Row r's four k, as int16 lanes repeated along the vector."""
        if x_wide:
            xp = builder.gep(xrows[r], [builder.mul(k, const(8))])
            four = builder.load(builder.bitcast(xp, i64.as_pointer()), align=2)
            one = builder.insert_element(undef4q, four, ir.Constant(i32, 0))
            return builder.bitcast(builder.shuffle_vector(one, undef4q, splat4), v16w)
        xp = builder.gep(xrows[r], [builder.mul(k, const(4))])
        return x_widened(builder.load(builder.bitcast(xp, i32.as_pointer()), align=1))

    evens = ir.Constant(ir.VectorType(i32, 8), list(range(0, 16, 2)))
    odds = ir.Constant(ir.VectorType(i32, 8), list(range(1, 16, 2)))
    halves = ir.Constant(ir.VectorType(i32, 16), list(range(16)))
    zero = ir.Constant(v8d, None)

    def const(v):
        return ir.Constant(i64, v)

    for r0, nr, c0, nc in blocks(rows, vecs):
        if not rows_of(nr):
            continue
        # accs[r][q]: row r0 + r, 4 columns (16 (c0 + q // 4) + 4 (q % 4) + 0..3), two lanes each
        accs = [
            [cgutils.alloca_once_value(builder, zero) for _ in range(4 * nc)] for _ in range(nr)
        ]
        with cgutils.for_range(builder, nk4) as lp:
            k = lp.index
            ybase = builder.gep(ycols, [builder.mul(k, ldy)])
            xs = []
            for r in range(nr):
                xs.append(x_row(r0 + r, k))
            for q in range(4 * nc):
                yp = builder.gep(ybase, [const(64 * c0 + 16 * q)])
                yv = y_ext(builder.load(builder.bitcast(yp, v16b.as_pointer()), align=1), v16w)
                for r in range(nr):
                    prod = builder.call(pmadd, [yv, xs[r]])
                    builder.store(builder.add(builder.load(accs[r][q]), prod), accs[r][q])
        for r in range(nr):
            for c in range(nc):
                eight = []
                for h in range(2):
                    a = builder.load(accs[r][4 * c + 2 * h])
                    b = builder.load(accs[r][4 * c + 2 * h + 1])
                    eight.append(
                        builder.add(
                            builder.shuffle_vector(a, b, evens),
                            builder.shuffle_vector(a, b, odds),
                        )
                    )
                v = builder.shuffle_vector(eight[0], eight[1], halves)
                finish(r0 + r, c0 + c, v)


def accumulate_sign_pairs(
    builder: Any,
    xrows: list,
    ycols: Any,
    ldy: Any,
    nk4: Any,
    rows: int,
    vecs: int,
    finish: Callable[[int, int, Any], None],
    rows_of: Callable[[int], bool] = lambda nr: True,
) -> None:
    """:func:`accumulate` for uint8 ``x`` by int8 ``y`` with no -128 in ``y`` (symmetric
    weights: what quantize_dynamic writes), on ``vpmaddubsw`` with no saturation, giving
    ``sum (x - 128) y`` per column (the caller adds ``128 sum y``).

    With x' = x - 128 in [-128, 127] and y in [-127, 127]: ``vpsignb`` makes y * sign(x')
    (never negating -128), and ``vpmaddubsw`` multiplies it by |x'| (at most 128, unsigned),
    so each pair is at most 2 * 128 * 127 = 32512 in magnitude: inside int16. ``vpmaddwd``
    by ones adds the pairs into int32 lanes, each a column's four k. As many multiplies as
    the widened product, so no faster where those bound it (two rows and more, measured:
    [2, 256] x [256, 1024] 10.3 against 9.8 us), but one row's widened product waits on
    widening y (every byte used once): [1, 512] x [512, 2048] 21.5 against 29.0 us.
    ``rows_of(n)`` says which blocks (by their row count) to emit."""
    from llvmlite import ir
    from numba.core import cgutils

    i1, i8, i16, i32, i64 = (ir.IntType(b) for b in (1, 8, 16, 32, 64))
    v32b, v16w, v8d = ir.VectorType(i8, 32), ir.VectorType(i16, 16), ir.VectorType(i32, 8)
    mod = builder.module
    psign = cgutils.get_or_insert_function(
        mod, ir.FunctionType(v32b, [v32b, v32b]), "llvm.x86.avx2.psign.b"
    )
    maddubs = cgutils.get_or_insert_function(
        mod, ir.FunctionType(v16w, [v32b, v32b]), "llvm.x86.avx2.pmadd.ub.sw"
    )
    pmadd = cgutils.get_or_insert_function(mod, ir.FunctionType(v8d, [v16w, v16w]), _PMADDWD)
    vabs = cgutils.get_or_insert_function(mod, ir.FunctionType(v32b, [v32b, i1]), "llvm.abs.v32i8")
    ones = ir.Constant(v16w, [1] * 16)
    flip = ir.Constant(v8d, [-0x7F7F7F80] * 8)  # 0x80808080: x - 128 in each byte
    splat8 = ir.Constant(v8d, [0] * 8)
    undef8 = ir.Constant(v8d, ir.Undefined)
    halves = ir.Constant(ir.VectorType(i32, 16), list(range(16)))
    zero = ir.Constant(v8d, None)

    def const(v):
        return ir.Constant(i64, v)

    for r0, nr, c0, nc in blocks(rows, vecs, per_vector=2):
        if not rows_of(nr):
            continue
        # accs[r][q]: row r0 + r, columns 16 c0 + 8 q .. + 7, one lane each
        accs = [
            [cgutils.alloca_once_value(builder, zero) for _ in range(2 * nc)] for _ in range(nr)
        ]
        with cgutils.for_range(builder, nk4) as lp:
            k = lp.index
            ybase = builder.gep(ycols, [builder.mul(k, ldy)])
            signs, mags = [], []
            for r in range(nr):
                xp = builder.gep(xrows[r0 + r], [builder.mul(k, const(4))])
                word = builder.load(builder.bitcast(xp, i32.as_pointer()), align=1)
                one = builder.insert_element(undef8, word, ir.Constant(i32, 0))
                xs = builder.xor(builder.shuffle_vector(one, undef8, splat8), flip)
                xs = builder.bitcast(xs, v32b)
                signs.append(xs)
                # |-128| is 128 as a byte read unsigned: abs without the poison flag
                mags.append(builder.call(vabs, [xs, ir.Constant(i1, 0)]))
            for q in range(2 * nc):
                yp = builder.gep(ybase, [const(64 * c0 + 32 * q)])
                yv = builder.load(builder.bitcast(yp, v32b.as_pointer()), align=1)
                for r in range(nr):
                    pairs = builder.call(maddubs, [mags[r], builder.call(psign, [yv, signs[r]])])
                    prod = builder.call(pmadd, [pairs, ones])
                    builder.store(builder.add(builder.load(accs[r][q]), prod), accs[r][q])
        for r in range(nr):
            for c in range(nc):
                lo = builder.load(accs[r][2 * c])
                hi = builder.load(accs[r][2 * c + 1])
                finish(r0 + r, c0 + c, builder.shuffle_vector(lo, hi, halves))
