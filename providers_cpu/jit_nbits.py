"""MatMulNBits decode rows on AVX2: 4-bit weights times int8 A with ``vpmaddubsw``, exactly.

At ``accuracy_level`` 4 A is rounded to int8 per block of K and each block's products
add as integers. The portable loop (``jit._nbits_int``) widens every nibble to int32
and multiplies with ``vpmulld``, one column a lane; it ran qwen2.5-0.5b's projections
at 1.4-1.7x onnxruntime's time on Zen 3. Here a column's 32 or 64 k are one vector: the
stored bytes (even k in the low nibbles, odd k in the high ones) split into nibbles, and
A is rounded into the matching order once per run. :func:`pack` lays the weight, its
scales and zero points out as one stream, four columns a record, read start to end.

Exactness: ``vpmaddubsw`` multiplies unsigned by signed bytes and adds pairs into int16
with saturation. The weight's zero point comes off first, in bytes: w - z is in [-15,
15]; ``vpsignb`` moves A's sign onto it (zero where a is zero) and the unsigned operand
is |a| <= 127 (``rint(a * 127 / amax)`` never reaches -128), so a pair is at most 2 *
127 * 15 = 3810 in magnitude, far inside int16; ``vpmaddwd`` by ones adds pairs into
int32 lanes. Without zero points the nibbles (0-15, unsigned) multiply A's signed bytes
directly and 8 * sum(a) comes off the int16 pairs. Each lane and the block's sum are exact
integers (below 2^24, exact in
float32 too), so the block's ``sum a (w - z)`` is what the portable loop computes; only
the float32 adding of the scaled blocks differs (eight lanes a column, added at the end).

The intrinsics and the driver stay in this one file: numba's disk cache checks only the
file that defines a compiled function. A's rounding takes its block scales from jit.py's
``int8_scales`` (the portable loops' too), so its cache name and matvec's carry
``jit.source_digest()``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from . import jit

_compiled: dict[str, Any] = {}
# The tiles ``_drive`` calls (one row, two rows), set in each compiled copy's globals by loop()
_T1 = _T2 = None
# The A rounding and the one-thread driver _matvec (and _drive_shared: _D) call, set the same way
_Q = _D = None
# The chunk counter's atomic add (_atomic_add), set the same way
_ADD = None
# A block's int8 scales (jit's ``int8_scales``), set in _quantize_a's compiled copy's globals
_SCALES = None


def usable(bits: int, block_size: int) -> bool:
    """Whether these loops run here for a weight: numba on, AVX2, 4 bits, blocks of 32 k."""
    if bits != 4 or block_size % 32 or not jit.ENABLED:
        return False
    from . import jit_int8

    return jit_int8.tiles() in ("avx2", "vnni")


#: Weight columns a tile holds sums for (and packs together).
COLS = 4


def pack(w: np.ndarray, scales: np.ndarray, zp: np.ndarray | None, subs: int) -> np.ndarray:
    """The weight, its scales and zero points in the order the tiles read them: one record
    for each group of ``COLS`` columns (N padded with zero columns) and each step of K,
    read once from start to end.

    Blocks of 32 k (``subs`` 1) go two at a time (K padded to an even count of blocks):
    a record is each column's 32 bytes (the two blocks, as stored), their float32 scales
    (two a column) and, when there are any, their zero points (two a column). Longer
    blocks go one at a time: each column's ``subs`` groups of 16 bytes (group by group,
    column by column), one scale a column, one zero point a column.

    ``w`` (N, KB * subs * 16) uint8 as MatMulNBits stores it, ``scales`` (N, KB) float32,
    ``zp`` (N, KB) uint8 or None. Returns (G, steps, record bytes) uint8."""
    n, row = w.shape
    kb = scales.shape[1]
    groups = -(-n // COLS)
    pad = groups * COLS - n
    per = 2 if subs == 1 else 1  # blocks a record
    kpad = -kb % per
    w = np.pad(w, ((0, pad), (0, 16 * kpad)))
    scales = np.pad(scales.astype(np.float32), ((0, pad), (0, kpad)))
    steps = (kb + kpad) // per
    if subs == 1:
        wg = w.reshape(groups, COLS, steps, 32).transpose(0, 2, 1, 3)
    else:
        wg = w.reshape(groups, COLS, steps, subs, 16).transpose(0, 2, 3, 1, 4)
    parts = [wg.reshape(groups, steps, -1)]
    sg = scales.reshape(groups, COLS, steps, per).transpose(0, 2, 1, 3)
    parts.append(np.ascontiguousarray(sg, "<f4").view(np.uint8).reshape(groups, steps, -1))
    if zp is not None:
        zp = np.pad(zp, ((0, pad), (0, kpad)), constant_values=8)
        zg = zp.reshape(groups, COLS, steps, per).transpose(0, 2, 1, 3)
        parts.append(zg.astype(np.uint8).reshape(groups, steps, -1))
    return np.ascontiguousarray(np.concatenate(parts, axis=2))


def _tile_intrinsic(rows: int, steps_loop) -> Any:
    """A tile, ``tile(p, aa, asg, ascl, m0, g, out)`` as a numba intrinsic (see
    :func:`_tile`), from what both layouts share: the arguments as LLVM values, the AVX2
    intrinsics, each row's offsets into A and its scales, the rows x ``COLS`` sums (eight
    float32 lanes each, in registers across the steps) and their store at the end.
    ``steps_loop(t)`` emits the loop over ``p``'s steps into ``t.acc`` (``t``: a namespace
    of the rest)."""
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    names = ("p", "aa", "asg", "ascl", "m0", "g", "out")
    arrays = ("p", "aa", "asg", "ascl", "out")
    cols = COLS

    def codegen(context, builder, signature, args):
        val = dict(zip(names, args))
        ty = dict(zip(names, signature.args))
        arr = {k: context.make_array(ty[k])(context, builder, val[k]) for k in arrays}
        i8, i16, i32, i64 = (ir.IntType(b) for b in (8, 16, 32, 64))
        f32 = ir.FloatType()
        v32b = ir.VectorType(i8, 32)
        v16w, v8d, v8f = ir.VectorType(i16, 16), ir.VectorType(i32, 8), ir.VectorType(f32, 8)
        mod = builder.module
        psign = cgutils.get_or_insert_function(
            mod, ir.FunctionType(v32b, [v32b, v32b]), "llvm.x86.avx2.psign.b"
        )
        maddubs = cgutils.get_or_insert_function(
            mod, ir.FunctionType(v16w, [v32b, v32b]), "llvm.x86.avx2.pmadd.ub.sw"
        )
        maddwd = cgutils.get_or_insert_function(
            mod, ir.FunctionType(v8d, [v16w, v16w]), "llvm.x86.avx2.pmadd.wd"
        )
        fma = cgutils.get_or_insert_function(mod, ir.FunctionType(v8f, [v8f] * 3), "llvm.fma.v8f32")

        def c64(v):
            return ir.Constant(i64, v)

        def arg(k):
            return context.cast(builder, val[k], ty[k], types.intp)

        m0, g = arg("m0"), arg("g")
        steps = builder.extract_value(arr["p"].shape, 1)
        rec = builder.extract_value(arr["p"].strides, 1)  # bytes: uint8
        lda = builder.extract_value(arr["aa"].strides, 0)
        lds = builder.udiv(builder.extract_value(arr["ascl"].strides, 0), c64(4))
        ldo = builder.udiv(builder.extract_value(arr["out"].strides, 0), c64(4))
        ncols = builder.extract_value(arr["out"].shape, 1)

        def load(k, off, vty, align=1):
            p = builder.bitcast(builder.gep(arr[k].data, [off]), vty.as_pointer())
            return builder.load(p, align=align)

        fzero = ir.Constant(v8f, [0.0] * 8)
        rowoff = [builder.mul(builder.add(m0, c64(r)), lda) for r in range(rows)]
        sclrow = [builder.mul(builder.add(m0, c64(r)), lds) for r in range(rows)]
        gbase = builder.mul(builder.mul(g, steps), rec)
        acc = [
            [cgutils.alloca_once_value(builder, fzero) for _ in range(cols)] for _ in range(rows)
        ]
        t = SimpleNamespace(
            builder=builder,
            types=(i8, i16, i32, i64, f32),
            vectors=(v32b, v16w, v8d, v8f),
            intrinsics=(psign, maddubs, maddwd, fma),
            c64=c64,
            load=load,
            ones=ir.Constant(v16w, [1] * 16),
            steps=steps,
            rec=rec,
            gbase=gbase,
            rowoff=rowoff,
            sclrow=sclrow,
            acc=acc,
        )
        steps_loop(t)
        _store_sums(builder, acc, rows, cols, g, m0, ldo, ncols, arr["out"].data)
        return context.get_dummy_value()

    def typer(typingctx, p, aa, asg, ascl, m0, g, out):
        return types.void(p, aa, asg, ascl, m0, g, out), codegen

    return intrinsic(typer)


def _tile_pairs(rows: int, has_zp: bool) -> Any:
    """:func:`_tile` for blocks of 32 k, two blocks a step (``pack``'s records with
    ``subs`` 1): each column's 32 bytes are one load, their low nibbles the two blocks'
    even k and the high ones their odd k; A is stored to match (``_quantize_a`` with
    ``pairs``: per 64 k, both blocks' evens then both blocks' odds). The even and odd
    products add as int16 (each at most 2 * 127 * 15, their sum 7620), one ``vpmaddwd``
    makes int32 lanes 0-3 the first block's and 4-7 the second's, and one multiply-add
    scales both blocks: 17 instructions for two blocks of a column where two single-block
    steps take 22 (no cross-lane insert either).

    Without zero points (8, the middle) the nibbles multiply A's signed bytes directly
    (unsigned by signed: at most 2 * 15 * 127 a pair, no sign moves, no byte subtract),
    and 8 * (each pair's sum of A), made once a row for all columns, comes off the int16
    pairs (|7620 + 4064| fits): 14 instructions, the same exact integers."""
    from llvmlite import ir
    from numba.core import cgutils

    cols = COLS
    wbytes = 32 * cols

    def steps_loop(t):
        builder, c64, load, ones, acc = t.builder, t.c64, t.load, t.ones, t.acc
        i8, i16, i32, i64, f32 = t.types
        v32b, v16w, v8d, v8f = t.vectors
        psign, maddubs, maddwd, fma = t.intrinsics
        rowoff, sclrow, rec = t.rowoff, t.sclrow, t.rec
        v2f, v2b = ir.VectorType(f32, 2), ir.VectorType(i8, 2)
        halves8 = ir.Constant(ir.VectorType(i32, 8), [0] * 4 + [1] * 4)
        halves32 = ir.Constant(ir.VectorType(i32, 32), [0] * 16 + [1] * 16)
        low4 = ir.Constant(v32b, [15] * 32)
        by4 = ir.Constant(v16w, [4] * 16)
        eights = ir.Constant(v32b, [8] * 32)
        with cgutils.for_range(builder, t.steps) as lk:
            u = lk.index
            base = builder.add(t.gbase, builder.mul(u, rec))
            aoff = builder.mul(u, c64(64))
            aoff2 = builder.add(aoff, c64(32))
            ev = [load("asg", builder.add(rowoff[r], aoff), v32b) for r in range(rows)]
            od = [load("asg", builder.add(rowoff[r], aoff2), v32b) for r in range(rows)]
            if has_zp:
                ev_mag = [load("aa", builder.add(rowoff[r], aoff), v32b) for r in range(rows)]
                od_mag = [load("aa", builder.add(rowoff[r], aoff2), v32b) for r in range(rows)]
            else:
                # the zero point 8's share, 8 * (a pair's sum), once a row for all columns
                mid = [
                    builder.add(
                        builder.call(maddubs, [eights, ev[r]]),
                        builder.call(maddubs, [eights, od[r]]),
                    )
                    for r in range(rows)
                ]
            avs = []
            for r in range(rows):
                two = load("ascl", builder.add(sclrow[r], builder.mul(u, c64(2))), v2f, align=4)
                avs.append(builder.shuffle_vector(two, two, halves8))
            for c in range(cols):
                wb = load("p", builder.add(base, c64(32 * c)), v32b)
                lo = builder.and_(wb, low4)
                hi = builder.and_(
                    builder.bitcast(builder.lshr(builder.bitcast(wb, v16w), by4), v32b), low4
                )
                two = load("p", builder.add(base, c64(wbytes + 8 * c)), v2f)
                sv = builder.shuffle_vector(two, two, halves8)
                if has_zp:
                    zz = load("p", builder.add(base, c64(wbytes + 8 * cols + 2 * c)), v2b)
                    zv = builder.shuffle_vector(zz, zz, halves32)
                    lo = builder.sub(lo, zv)
                    hi = builder.sub(hi, zv)
                for r in range(rows):
                    if has_zp:
                        p0 = builder.call(maddubs, [ev_mag[r], builder.call(psign, [lo, ev[r]])])
                        p1 = builder.call(maddubs, [od_mag[r], builder.call(psign, [hi, od[r]])])
                        pairs = builder.add(p0, p1)
                    else:
                        p0 = builder.call(maddubs, [lo, ev[r]])
                        p1 = builder.call(maddubs, [hi, od[r]])
                        pairs = builder.sub(builder.add(p0, p1), mid[r])
                    q = builder.call(maddwd, [pairs, ones])
                    f = builder.sitofp(q, v8f)
                    sc = builder.fmul(sv, avs[r])
                    builder.store(builder.call(fma, [f, sc, builder.load(acc[r][c])]), acc[r][c])

    return _tile_intrinsic(rows, steps_loop)


def _store_sums(builder, acc, rows, cols, g, m0, ldo, ncols, out):
    """out[m0 + r, cols g + c] = the sum of acc[r][c]'s eight lanes, for columns < ncols."""
    from llvmlite import ir

    i32, i64 = ir.IntType(32), ir.IntType(64)

    def lanes(idx):
        return ir.Constant(ir.VectorType(i32, 4), idx)

    for c in range(cols):
        col = builder.add(builder.mul(g, ir.Constant(i64, cols)), ir.Constant(i64, c))
        with builder.if_then(builder.icmp_signed("<", col, ncols)):
            for r in range(rows):
                v = builder.load(acc[r][c])
                s4 = builder.fadd(
                    builder.shuffle_vector(v, v, lanes([0, 1, 2, 3])),
                    builder.shuffle_vector(v, v, lanes([4, 5, 6, 7])),
                )
                s2 = builder.fadd(s4, builder.shuffle_vector(s4, s4, lanes([2, 3, 0, 1])))
                s1 = builder.fadd(
                    builder.extract_element(s2, ir.Constant(i32, 0)),
                    builder.extract_element(s2, ir.Constant(i32, 1)),
                )
                o = builder.add(builder.mul(builder.add(m0, ir.Constant(i64, r)), ldo), col)
                builder.store(s1, builder.gep(out, [o]))


def _tile(rows: int, has_zp: bool, subs: int) -> Any:
    """``tile(p, aa, asg, ascl, m0, g, out)``, a numba intrinsic: for the ``rows`` rows
    of A from ``m0`` and the ``COLS`` weight columns of group ``g`` (those inside
    ``out``),

        out[m0 + r, n] = sum over blocks kb of
            float32(sum_k a[m0 + r, k] (w[n, k] - z[n, kb])) * (scale[n, kb] * ascl[r, kb])

    ``p`` (G, KB, record) uint8 is :func:`pack`'s layout (k = 2j in a 16-byte group's
    byte j low nibble, 2j + 1 in its high one; z 8 when not ``has_zp``); ``aa`` and
    ``asg`` (M, KB * subs * 32) are |a| as uint8 and a as int8, each 32 k evens first,
    ``ascl`` (M, KB) A's block scales. The rows x COLS sums are eight float32 lanes each,
    in registers across the blocks, added at the end."""
    from llvmlite import ir
    from numba.core import cgutils

    cols = COLS
    wbytes = subs * 16 * cols

    def steps_loop(t):
        builder, c64, load, ones, acc = t.builder, t.c64, t.load, t.ones, t.acc
        i8, i16, i32, i64, f32 = t.types
        v32b, v16w, v8d, v8f = t.vectors
        psign, maddubs, maddwd, fma = t.intrinsics
        rowoff, sclrow, rec, kbn = t.rowoff, t.sclrow, t.rec, t.steps
        v16b = ir.VectorType(i8, 16)
        undef8f = ir.Constant(v8f, ir.Undefined)
        zero8 = ir.Constant(ir.VectorType(i32, 8), [0] * 8)

        def splat_f(x):
            return builder.shuffle_vector(
                builder.insert_element(undef8f, x, ir.Constant(i32, 0)), undef8f, zero8
            )

        undef32b = ir.Constant(v32b, ir.Undefined)
        zero32 = ir.Constant(ir.VectorType(i32, 32), [0] * 32)
        low4 = ir.Constant(v16b, [15] * 16)
        by4 = ir.Constant(v16b, [4] * 16)
        eights = ir.Constant(v32b, [8] * 32)
        concat = ir.Constant(ir.VectorType(i32, 32), list(range(32)))

        with cgutils.for_range(builder, kbn) as lk:
            kb = lk.index
            base = builder.add(t.gbase, builder.mul(kb, rec))
            if has_zp:
                zs = []
                for c in range(cols):
                    zb = load("p", builder.add(base, c64(wbytes + 4 * cols + c)), i8)
                    one = builder.insert_element(undef32b, zb, ir.Constant(i32, 0))
                    zs.append(builder.shuffle_vector(one, undef32b, zero32))
            else:
                zs = [eights] * cols
            isum = [[None] * cols for _ in range(rows)]
            for si in range(subs):  # unrolled: a block's groups of 32 k
                aoff = builder.mul(builder.add(builder.mul(kb, c64(subs)), c64(si)), c64(32))
                mags = [load("aa", builder.add(rowoff[r], aoff), v32b) for r in range(rows)]
                sgns = [load("asg", builder.add(rowoff[r], aoff), v32b) for r in range(rows)]
                for c in range(cols):
                    wb = load("p", builder.add(base, c64(si * 16 * cols + 16 * c)), v16b)
                    lo = builder.and_(wb, low4)
                    hi = builder.lshr(wb, by4)
                    wv = builder.sub(builder.shuffle_vector(lo, hi, concat), zs[c])
                    for r in range(rows):
                        pairs = builder.call(maddubs, [mags[r], builder.call(psign, [wv, sgns[r]])])
                        q = builder.call(maddwd, [pairs, ones])
                        isum[r][c] = q if isum[r][c] is None else builder.add(isum[r][c], q)
            scs = [
                splat_f(load("p", builder.add(base, c64(wbytes + 4 * c)), f32)) for c in range(cols)
            ]
            for r in range(rows):
                ar = splat_f(load("ascl", builder.add(sclrow[r], kb), f32, align=4))
                for c in range(cols):
                    f = builder.sitofp(isum[r][c], v8f)
                    sv = builder.fmul(scs[c], ar)
                    builder.store(builder.call(fma, [f, sv, builder.load(acc[r][c])]), acc[r][c])

    return _tile_intrinsic(rows, steps_loop)


def _quantize_a(a2, kb_n, bs, pairs):
    """(aa, asg, ascl): A (M, K) float32 rounded to int8 per block of ``bs`` k,
    ``rint(a * 127 / amax)`` (as ``jit._quantize_a`` and ``contrib.int8_blocks``), K padded
    with zeros to ``kb_n`` blocks (and to an even count with ``pairs``). ``asg`` (M, KB BS)
    the int8 values, each 32 k evens first (the low nibbles they meet), ``aa`` their
    magnitudes as uint8, ``ascl`` (M, KB) the block scales ``amax / 127``. With ``pairs``
    (blocks of 32), blocks 2u and 2u + 1 are stored as 2u's evens, 2u + 1's evens, 2u's
    odds, 2u + 1's odds (:func:`_tile_pairs`' 64-k steps). Padding multiplies nothing
    (``vpsignb`` by 0)."""
    m_rows, k = a2.shape
    kbp = kb_n + kb_n % 2 if pairs else kb_n
    aa = np.zeros((m_rows, kbp * bs), np.uint8)
    asg = np.zeros((m_rows, kbp * bs), np.int8)
    ascl = np.zeros((m_rows, kbp), np.float32)
    for m in range(m_rows):
        for kb in range(kb_n):
            base = kb * bs
            end = min(bs, k - base)
            scale, inv = _SCALES(a2[m], base, end)
            for j in range(end):
                q = np.int32(np.rint(a2[m, base + j] * inv))
                if pairs:
                    at = (kb // 2) * 64 + (j % 2) * 32 + (kb % 2) * 16 + j // 2
                else:
                    t = j % 32
                    at = base + (j - t) + (t % 2) * 16 + t // 2
                asg[m, at] = q
                aa[m, at] = abs(q)
            ascl[m, kb] = scale
    return aa, asg, ascl


def _matvec(a2, p, kb_n, bs, pairs, out):
    """out = A (M, K) float32 times the packed weight, on this thread: A rounded
    (:func:`_quantize_a`) and the tiles (:func:`_drive`) in one call, which saves a small
    node's second dispatch and its Python-side buffers (10-18 us of a 30-55 us node)."""
    aa, asg, ascl = _Q(a2, kb_n, bs, pairs)
    _D(p, aa, asg, ascl, 0, p.shape[0], out)


def _drive(p, aa, asg, ascl, g0, g1, out):
    """out[:, COLS g0 : COLS g1] (columns inside ``out``) through the tiles: rows of A in
    pairs, the last one alone when their count is odd."""
    m_rows = aa.shape[0]
    for m0 in range(0, m_rows - 1, 2):
        for g in range(g0, g1):
            _T2(p, aa, asg, ascl, m0, g, out)
    if m_rows % 2:
        for g in range(g0, g1):
            _T1(p, aa, asg, ascl, m_rows - 1, g, out)


def _atomic_add() -> Any:
    """``add(state, i, v)``: atomic fetch-and-add on an int64 array's element, returning
    the old value (v 0: an atomic read), a numba intrinsic for :func:`_drive_shared`."""
    from numba import types
    from numba.extending import intrinsic

    def codegen(context, builder, sig, args):
        arr = context.make_array(sig.args[0])(context, builder, args[0])
        i = context.cast(builder, args[1], sig.args[1], types.intp)
        v = context.cast(builder, args[2], sig.args[2], types.int64)
        return builder.atomic_rmw("add", builder.gep(arr.data, [i]), v, "seq_cst")

    def typer(typingctx, state, i, v):
        return types.int64(state, i, v), codegen

    return intrinsic(typer)


def _drive_shared(p, aa, asg, ascl, state, chunks, out, caller):
    """:func:`_drive` over ``chunks`` even ranges of column groups, each taken by whichever
    thread calling this with the same ``state`` asks first (``state[0]`` counts the chunks
    taken; ``state[1 + c]`` is nonzero once chunk c is written: 1 added by a helper, 2 by
    the caller, which the tests read). No Python runs between chunks, so a descheduled
    thread never holds a GIL the others need.

    The ``caller`` never waits for a helper: once every chunk is taken it writes again
    those a helper took and has not finished (a helper descheduled mid-chunk on a busy
    machine would otherwise hold the run up for a time slice, milliseconds). Both write
    the same bits (each group's sums are made whole by one tile call, whoever makes them),
    so the result never depends on the split; a helper that finishes late writes into
    ``out`` after the caller returned, which is why ``out`` must be the run's private
    buffer, never the node's output."""
    groups = p.shape[0]
    taking = True  # chunks from the counter; then (the caller) the unwritten ones
    scan = 0
    while True:
        c = _ADD(state, 0, 1) if taking else chunks
        if c >= chunks:
            if not caller:
                return
            taking = False
            while scan < chunks and _ADD(state, 1 + scan, 0) != 0:  # an atomic read
                scan += 1
            if scan == chunks:
                return
            c = scan
            scan += 1
        _D(p, aa, asg, ascl, groups * c // chunks, groups * (c + 1) // chunks, out)
        _ADD(state, 1 + c, 2 if caller else 1)


def loop(name: str, has_zp: bool = False, subs: int = 1) -> Any:
    """``"quantize_a"``, or ``"drive"`` / ``"drive_shared"`` / ``"matvec"`` (their tiles
    reading zero points when ``has_zp``, for blocks of ``subs`` groups of 32 k), compiled
    on first use."""
    import types as pytypes

    if not jit.ENABLED:  # also imports numba into jit.nb
        raise RuntimeError(f"jit_nbits.loop({name!r}): compiled loops are off here")
    key = name if name == "quantize_a" else f"{name}_{int(has_zp)}_{subs}"
    f = _compiled.get(key)
    if f is None:
        if name == "quantize_a":
            g = dict(globals())
            g["_SCALES"] = jit.helper("int8_scales")
            src = pytypes.FunctionType(_quantize_a.__code__, g, _quantize_a.__name__)
            # jit.py's helper inside: an edit there names another cache entry
            src.__qualname__ = f"{key}_{jit.source_digest()}"
        elif name == "matvec":
            g = dict(globals())
            g["_Q"], g["_D"] = loop("quantize_a"), loop("drive", has_zp, subs)
            src = pytypes.FunctionType(_matvec.__code__, g, _matvec.__name__)
            src.__qualname__ = f"{key}_{jit.source_digest()}"  # _Q holds jit.py's helper
        else:
            g = dict(globals())
            if subs == 1:
                g["_T1"], g["_T2"] = _tile_pairs(1, has_zp), _tile_pairs(2, has_zp)
            else:
                g["_T1"], g["_T2"] = _tile(1, has_zp, subs), _tile(2, has_zp, subs)
            g["_ADD"] = _atomic_add()
            if name == "drive_shared":  # a chunk is _drive's run over its column groups
                g["_D"] = loop("drive", has_zp, subs)
            body = _drive_shared if name == "drive_shared" else _drive
            # a copy reading its own tiles, under a name of its own for the disk cache
            src = pytypes.FunctionType(body.__code__, g, body.__name__)
            src.__qualname__ = key
        f = _compiled[key] = jit.nb.njit(cache=True, nogil=True, boundscheck=False)(src)
    return f
