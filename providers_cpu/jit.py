"""Optional compiled loops for the CPU provider's kernels, through numba when installed.

A few kernels (depthwise convolution, pooling windows, MatMulNBits on packed
weights) are loops that
NumPy can only express as one full pass over memory per term; numba compiles
them into one cache-resident loop each. Whether they are used is decided once:
numba importable and ``ONNXEP_CPU_JIT`` not ``0``. Without numba every
kernel keeps its pure-NumPy path, and results agree within float rounding
(the compiled loops add the same terms, in a fixed order per output). The
choice is reported by ``onnxep providers`` (:func:`jit_status`).

The loops are compiled on first use (about a second each, cached on disk
where numba's cache directory is writable) and release the GIL, so the
provider's thread pool can run several at once.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

nb: Any = None
_why_not: str | None = None
if os.environ.get("ONNXEP_CPU_JIT", "1").strip() == "0":
    _why_not = "off (ONNXEP_CPU_JIT=0)"
elif importlib.util.find_spec("numba") is None:
    _why_not = "numba not installed; pure NumPy loops"


def __getattr__(name: str) -> Any:
    # ``ENABLED`` imports numba on first read (a quarter of a second), so a
    # process that never runs one of these kernels never pays for it.
    if name != "ENABLED":
        raise AttributeError(name)
    global nb, _why_not
    enabled = _why_not is None
    if enabled:
        try:
            import numba as nb
        except Exception as exc:  # a broken numba install is a reason, not a crash
            _why_not = f"numba not importable ({type(exc).__name__}); pure NumPy loops"
            enabled = False
    globals()["ENABLED"] = enabled
    return enabled


def wanted() -> bool:
    """Whether numba is installed and not switched off, without importing it (passes that
    only pay off with a compiled kernel ask this at session creation)."""
    return _why_not is None


def jit_status() -> str:
    """One line for ``onnxep providers``: which loops the CPU kernels run (imports nothing)."""
    if _why_not is not None:
        return f"compiled loops: {_why_not}"
    return (
        f"compiled loops: numba {metadata.version('numba')} (depthwise Conv, Winograd Conv "
        "tiles, fused Conv activations, pooling windows, MatMulNBits on packed weights, "
        "tree-ensemble runs, few-column Conv products, LSTM/GRU/RNN/DynamicQuantizeLSTM "
        "sequences, nearest-neighbour Resize, 8-bit products on AVX-512 VNNI or AVX2 tiles, "
        "row norms and decode-step attention, convolution and rotary; compiled on first use)"
    )


def lazy(fn: Callable, *, helpers: tuple[str, ...] = (), **options: Any) -> Callable[[], Any]:
    """A getter of ``fn`` compiled by numba: compiled on the getter's first call (cached
    on disk, without the GIL, no bounds checks, plus ``options`` such as ``fastmath``),
    the same function after. ``helpers`` names functions of ``fn``'s module that it calls:
    numba looks a callee up in the module's globals when it compiles the caller, so each is
    compiled there first (with the same options). Raises RuntimeError where the compiled
    loops are off: callers ask ``ENABLED`` before they take this path."""

    @functools.cache
    def get() -> Any:
        enabled = globals().get("ENABLED")
        if not (__getattr__("ENABLED") if enabled is None else enabled):  # imports numba
            raise RuntimeError(f"{fn.__module__}.{fn.__name__}: compiled loops are off here")
        opts = dict(cache=True, nogil=True, boundscheck=False) | options
        space = fn.__globals__
        for name in helpers:
            if not hasattr(space[name], "py_func"):  # not a numba dispatcher yet
                space[name] = nb.njit(**opts)(space[name])
        return nb.njit(**opts)(fn)

    return get


_compiled: dict[str, Any] = {}
_vector_bytes: int | None = None


def vector_bytes() -> int:
    """Bytes in one of the target's float vector registers: 64 with AVX-512F, else 32.

    The depthwise tiles hold one vector of channels per output position in a register;
    at 64 bytes on an AVX2 CPU each is two registers and the tile's eight sums spill
    (a 128-channel 28x28 3x3 conv took 1.5x the flat loop's time on Zen 3)."""
    global _vector_bytes
    if _vector_bytes is None:
        _vector_bytes = 32
        try:
            import llvmlite.binding as ll
            from numba.core import config

            # numba compiling for another CPU (a portable cache): keep the narrow vectors
            if not (config.CPU_NAME or config.CPU_FEATURES):
                if ll.get_host_cpu_features().get("avx512f", False):
                    _vector_bytes = 64
        except Exception:  # a broken numba install: the loops will not run anyway
            pass
    return _vector_bytes


def loop(name: str) -> Any:
    """The compiled function ``name`` (defined below), compiling it on first use."""
    f = _compiled.get(name)
    if f is None:
        if name in ("depthwise_2d_cl", "depthwise_2d"):
            _make_dw_tiles()
            globals()["_VB"] = vector_bytes()
        _compile_helpers()
        f = _compiled[name] = nb.njit(cache=True, nogil=True, boundscheck=False)(_SOURCES[name])
    return f


def helper(name: str) -> Any:
    """The compiled helper ``name`` (``int8_scales``, ``exp_reduced``), for a loop in
    another module that calls it: set it in the globals the loop is compiled with, and
    carry :func:`source_digest` in the loop's cache name."""
    _compile_helpers()
    return globals()["_" + name]


def _compile_helpers() -> None:
    for name, src in _HELPERS.items():
        # A loop calls a helper through this module's globals: compiled, before the loop.
        if globals()[name] is src:
            # IEEE division (x / 0 is inf, as NumPy's): Python's error model tests
            # every divisor, which keeps LLVM from vectorising the loop
            globals()[name] = nb.njit(
                cache=True,
                nogil=True,
                boundscheck=False,
                error_model="numpy",
                **_HELPER_OPTIONS.get(name, {}),
            )(src)


def source_digest() -> str:
    """A digest of this file, for the cache names of compiled loops elsewhere that call its
    helpers: numba's disk cache checks only the file that defines a loop, so an edited
    helper would otherwise come back inside a stale one."""
    global _digest
    if _digest is None:
        _digest = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
    return _digest


_digest: str | None = None


def _depthwise_rows(planes, term_plane, term_off, w, mult, r0, r1, out):
    """out[r] = sum_t w[r, t] * planes[term_plane[t], r // mult, term_off[t]:][:ln], rows r0..r1.

    Three terms per pass over the output row (left to right, the same order
    for every row), so the row is read and written a third as often.
    """
    ln = out.shape[1]
    nt = term_off.shape[0]
    for r in range(r0, r1):
        ri = r // mult
        o = out[r]
        p0 = planes[term_plane[0], ri, term_off[0] : term_off[0] + ln]
        w0 = w[r, 0]
        for x in range(ln):
            o[x] = w0 * p0[x]
        t = 1
        while t + 3 <= nt:
            pa = planes[term_plane[t], ri, term_off[t] : term_off[t] + ln]
            pb = planes[term_plane[t + 1], ri, term_off[t + 1] : term_off[t + 1] + ln]
            pc = planes[term_plane[t + 2], ri, term_off[t + 2] : term_off[t + 2] + ln]
            wa = w[r, t]
            wb = w[r, t + 1]
            wc = w[r, t + 2]
            for x in range(ln):
                o[x] = o[x] + wa * pa[x] + wb * pb[x] + wc * pc[x]
            t += 3
        while t < nt:
            p = planes[term_plane[t], ri, term_off[t] : term_off[t] + ln]
            wv = w[r, t]
            for x in range(ln):
                o[x] += wv * p[x]
            t += 1


_SOURCES = {"depthwise_rows": _depthwise_rows}
#: The first float32 of a 64-bit pair is its low half (the depthwise fill's stride-2 reads).
_LITTLE = sys.byteorder == "little"
#: Extra ``nb.njit`` options of a helper (by name).
_HELPER_OPTIONS: dict[str, dict] = {}


def _conv_act(row, code, prm):
    """A convolution's output values (one channel's, flat), in place through the fused
    activation (``conv_epilogue``'s codes).

    The float operations of the unfused CPU nodes, in their order, on the output's own
    type (``prm`` holds every constant in it, so nothing widens): 1 Relu (np.maximum's
    ties and NaN), 2 Clip, 3 HardSigmoid, 4 HardSwish, 5 LeakyRelu, 6 ``v * clip(v + a,
    lo, hi) / d`` (an exporter's HardSwish), 7 ``x * (erf(x / d) + a) * h`` (GELU, the CPU
    Erf's float32 approximation), 8 Sigmoid and 9 SiLU (float32 only: the CPU Sigmoid's
    ``_logistic_value``); ``prm`` = (p0, p1, p2, p3, 0, 1, 1/6, 0.5, erf's seven P and
    five Q coefficients, -4, 4).
    One loop per code, over a whole channel: a call per value cost 10 ns each, one
    per output row of a 7x7 map 50 ns a row.
    """
    n = row.shape[0]
    zero = prm[4]
    one = prm[5]
    # Relu, Clip and LeakyRelu store every value times ``one`` (prm[5], 1.0 at run time):
    # a store of the value just loaded, where the activation keeps it, LLVM turns into a
    # masked store (AVX2 vmaskmovps, microcoded on Zen 3: 16K values 8.2 us against 1.6).
    # x * 1 is x, -0 and NaN included.
    if code == 1:
        for i in range(n):
            v = row[i]
            g = v if (v > zero) | (v != v) else zero
            row[i] = g * one
    elif code == 2:
        lo = prm[0]
        hi = prm[1]
        for i in range(n):
            v = row[i]
            if v < lo:
                v = lo
            if v > hi:
                v = hi
            row[i] = v * one
    elif code == 3:
        al = prm[0]
        be = prm[1]
        for i in range(n):
            v = row[i] * al
            v = v + be
            if v < zero:
                v = zero
            if v > one:
                v = one
            row[i] = v
    elif code == 4:
        sixth = prm[6]
        half = prm[7]
        for i in range(n):
            v = row[i]
            t = v * sixth
            t = t + half
            if t < zero:
                t = zero
            if t > one:
                t = one
            row[i] = t * v
    elif code == 5:
        al = prm[0]
        for i in range(n):
            v = row[i]
            row[i] = v * (al if v < zero else one)
    elif code == 7:
        # x * (erf(x / d) + a) * h, erf the CPU's float32 rational approximation
        # (op_erf.erf32: clamp to +-4, P(x^2) * x / Q(x^2) by Horner, a rounding per
        # step). The constants are locals: read from ``prm`` inside the loop, which may
        # alias ``row``, they kept LLVM from vectorising it (3x slower).
        d = prm[0]
        ad = prm[1]
        hf = prm[2]
        c0, c1, c2, c3, c4, c5, c6 = prm[8], prm[9], prm[10], prm[11], prm[12], prm[13], prm[14]
        e0, e1, e2, e3, e4 = prm[15], prm[16], prm[17], prm[18], prm[19]
        lo = prm[20]
        hi = prm[21]
        for i in range(n):
            v = row[i]
            t = v / d
            if t < lo:
                t = lo
            if t > hi:
                t = hi
            x2 = t * t
            p = c0 * x2
            p = p + c1
            p = p * x2
            p = p + c2
            p = p * x2
            p = p + c3
            p = p * x2
            p = p + c4
            p = p * x2
            p = p + c5
            p = p * x2
            p = p + c6
            p = p * t
            q = e0 * x2
            q = q + e1
            q = q * x2
            q = q + e2
            q = q * x2
            q = q + e3
            q = q * x2
            q = q + e4
            e = p / q
            e = e + ad
            e = v * e
            row[i] = e * hf
    elif code == 6:
        sh = prm[0]
        lo = prm[1]
        hi = prm[2]
        d = prm[3]
        for i in range(n):
            v = row[i]
            t = v + sh
            if t < lo:
                t = lo
            if t > hi:
                t = hi
            t = v * t
            row[i] = t / d
    elif code == 8 or code == 9:
        # Sigmoid, SiLU: the CPU Sigmoid / onnxep::SiLU kernels' float32 loop (``_logistic``)
        _logistic_inplace(row, one, code == 9)


def _depthwise_2d(x, w, bias, has_bias, mult, geo, oh, ow, code, prm, r0, r1, out):
    """2-D depthwise convolution of output rows r0..r1 (image * channels), bias and activation.

    ``x`` (N*C, H, W), ``out`` (N*C*mult, OH * OW), ``w`` (C*mult, KH*KW), ``bias``
    (C*mult,); ``geo`` = (KH, KW, SH, SW, DH, DW, pad top, pad left). Per input plane
    the zero-padded plane is split into its stride phases in a small buffer (kernel
    offset ``t`` reads padded index ``o * s + t * d``: phase ``(t * d) % s`` at ``o + (t *
    d) // s``), so every term is a unit-stride run of one flat phase plane; the sums
    run over blocks of output rows that stay in L1 (wrapped columns computed and
    dropped, as ``depthwise_rows`` does) in register tiles (``_dw_flat8``), and the
    activation goes on per output row. Each output is the bias, then one fused
    multiply-add a term in kernel order: ``_depthwise_2d_cl``'s operations, so the two
    loops give the same bits (the NumPy path's, multiply then add, differ in the last
    places).
    """
    kh, kw, sh, sw, dh, dw, pt, pl = geo
    h, wd = x.shape[1], x.shape[2]
    chans = w.shape[0]
    nt = kh * kw
    pr = ((oh - 1) * sh + (kh - 1) * dh) // sh + 1
    pc = ((ow - 1) * sw + (kw - 1) * dw) // sw + 1
    plane = pr * pc
    lanes = _VB // x.itemsize  # noqa: F821 (set before compiling: vector_bytes())
    tile = 8 * lanes
    # slack past each phase plane: the last tile's vectors run past the block's end
    slack = tile + lanes
    buf = np.zeros((sh * sw, plane + slack), x.dtype)
    bf = buf.reshape(-1)
    xf = x.reshape(-1)
    toff = np.empty(nt, np.int64)
    for i in range(kh):
        for j in range(kw):
            t = i * kw + j
            tph = ((i * dh) % sh) * sw + (j * dw) % sw
            toff[t] = tph * (plane + slack) + ((i * dh) // sh) * pc + (j * dw) // sw
    # Rows of output per block: about 2048 values of the flat accumulator.
    per = max(1, 2048 // pc)
    acc = np.empty(per * pc + tile, x.dtype)
    # Column stride 2 on float32: the row's values read as 64-bit pairs, the phase's one
    # the low or high half by the source index's parity, moved as bits (NaN payloads
    # kept), as conv_direct's fill. LLVM made the stride-2 read a gather (slow on Zen 4:
    # 32 x 112 x 112 stride 2 took 4x onnxruntime's time); even widths only, so the flat
    # input has an even length and every pair is inside it.
    paired = sw == 2 and x.itemsize == 4 and wd % 2 == 0 and _LITTLE
    pairs = xf.view(np.uint64) if paired else xf[:0].view(np.uint64)
    bu = bf.view(np.uint32) if paired else bf[:0].view(np.uint32)
    loaded = -1
    for r in range(r0, r1):
        ri = r // mult
        if ri != loaded:
            # Interior of every phase plane; the zero border never changes. Flat
            # unsigned indices: a view per row cost more than its copy on small maps.
            xo = ri * h * wd
            for a in range(sh):
                for b in range(sw):
                    # the columns v with 0 <= v * sw + b - pl < W
                    v0 = (pl - b + sw - 1) // sw if pl > b else 0
                    nv = min(pc, (wd - 1 + pl - b) // sw + 1) - v0
                    if nv <= 0:
                        continue
                    pbase = (a * sw + b) * (plane + slack) + v0
                    for u in range(pr):
                        iy = u * sh + a - pt
                        if iy < 0 or iy >= h:
                            continue
                        so = xo + iy * wd + v0 * sw + b - pl
                        do = pbase + u * pc
                        if sw == 1:
                            for j in range(nv):
                                bf[np.uint64(do + j)] = xf[np.uint64(so + j)]
                        elif paired:
                            p0 = np.uint64(so >> 1)
                            half = np.uint64(32 * (so & 1))
                            for j in range(nv):
                                bu[np.uint64(do + j)] = np.uint32(pairs[p0 + np.uint64(j)] >> half)
                        else:
                            for j in range(nv):
                                bf[np.uint64(do + j)] = xf[np.uint64(so + j * sw)]
            loaded = ri
        ch = r % chans
        wr = w[ch]
        # -0 is the sum's identity (-0 + -0 is -0): without a bias, the first product
        # comes out as it is
        bv = bias[ch] if has_bias else -0.0
        orow = out[r]
        for y0 in range(0, oh, per):
            y1 = min(oh, y0 + per)
            ln = (y1 - 1 - y0) * pc + ow
            start = y0 * pc
            # Whole tiles of eight vectors: the sums run past ``ln`` into the buffers'
            # slack (values computed and dropped). A one-vector tail waited on each term's
            # latency (49 terms of a 7x7 kernel: as long as a whole tile each).
            for q in range(0, ln, tile):
                _dw_flat8(bf, start + q, toff, wr, bv, acc, q)  # noqa: F821
            for yy in range(y0, y1):
                src_row = acc[(yy - y0) * pc : (yy - y0) * pc + ow]
                dst = orow[yy * ow : (yy + 1) * ow]
                for q in range(ow):
                    dst[q] = src_row[q]
        if code != 0:
            _conv_act(orow, code, prm)


def _conv_epilogue(y, bias, has_bias, code, prm, r0, r1):
    """Bias and activation in place on rows r0..r1 of ``y`` (rows, positions); row r's
    bias is ``bias[r % len(bias)]``. The same per-value operations as ``_depthwise_2d``."""
    nb_ = bias.shape[0]
    n = y.shape[1]
    for r in range(r0, r1):
        row = y[r]
        if has_bias:
            bv = bias[r % nb_]
            for q in range(n):
                row[q] = row[q] + bv
        if code != 0:
            _conv_act(row, code, prm)


def _dw_tile(npos: int) -> Any:
    """``tile(xt, pos, i0, toff, wt, ot)``, a numba intrinsic: for the ``npos`` output
    positions ``p = i0 ..`` of a block of ``L`` channels (one vector register:
    ``vector_bytes()``, 16 or 8 float32), ``ot[p L : p L + L] = b + sum over t of wt[t L :
    t L + L] * xt[pos[p] + toff[t] : + L]`` where ``b`` is the vector after the weights
    (``wt[nt L :]``, the block's bias or zeros): from ``b``, one fused multiply-add a term
    in kernel order. The ``npos`` sums are vectors held in registers across the terms
    (independent chains, so a multiply-add's latency does not serialise them); a plain
    numba loop keeps its accumulator in memory (numba runs no SLP vectoriser), half the
    speed here.
    """
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    def codegen(context, builder, signature, args):
        names = ("xt", "pos", "i0", "toff", "wt", "ot")
        val = dict(zip(names, args))
        ty = dict(zip(names, signature.args))
        arr = {k: context.make_array(ty[k])(context, builder, val[k]) for k in names if k != "i0"}
        ety = context.get_data_type(ty["xt"].dtype)
        esize = context.get_abi_sizeof(ety)
        lanes = vector_bytes() // esize
        vty = ir.VectorType(ety, lanes)
        i64 = ir.IntType(64)
        width = ir.Constant(i64, lanes)
        align = esize
        fma = _vector_fma(builder, vty, lanes, esize)

        def vptr(k, idx):
            return builder.bitcast(builder.gep(arr[k].data, [idx]), vty.as_pointer())

        def vload(k, idx):
            return builder.load(vptr(k, idx), align=align)

        i0 = context.cast(builder, val["i0"], ty["i0"], types.intp)
        nt = builder.extract_value(arr["toff"].shape, 0)
        base = [
            builder.load(builder.gep(arr["pos"].data, [builder.add(i0, ir.Constant(i64, p))]))
            for p in range(npos)
        ]
        bias = vload("wt", builder.mul(nt, width))
        acc = [cgutils.alloca_once_value(builder, bias) for _ in base]
        with cgutils.for_range(builder, nt) as lp:
            t = lp.index
            off = builder.load(builder.gep(arr["toff"].data, [t]))
            wv = vload("wt", builder.mul(t, width))
            for b, a in zip(base, acc):
                xv = vload("xt", builder.add(b, off))
                builder.store(builder.call(fma, [wv, xv, builder.load(a)]), a)
        for p, a in enumerate(acc):
            at = builder.mul(builder.add(i0, ir.Constant(i64, p)), width)
            builder.store(builder.load(a), vptr("ot", at), align=align)
        return context.get_dummy_value()

    def typer(typingctx, xt, pos, i0, toff, wt, ot):
        return types.void(xt, pos, i0, toff, wt, ot), codegen

    return intrinsic(typer)


def _vector_fma(builder, vty, lanes: int, esize: int):
    """``llvm.fma`` on ``vty``: one rounding a term, whatever the target (no fast-math
    flags needed, and the same bits on AVX2 and AVX-512)."""
    from llvmlite import ir
    from numba.core import cgutils

    name = f"llvm.fma.v{lanes}{'f32' if esize == 4 else 'f64'}"
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(vty, [vty] * 3), name)


def _dw_flat(nvec: int) -> Any:
    """``flat(buf, off0, toff, wr, bias, acc, aoff)``, a numba intrinsic: for the ``nvec
    L`` flat positions ``q`` from ``off0`` (``L`` lanes of a vector register), ``acc[aoff +
    q] = bias + sum over t of wr[t] * buf[off0 + toff[t] + q]``, from the bias one fused
    multiply-add a term in kernel order: ``_dw_tile``'s sums, with the positions in the
    vector instead of the channels (one input plane's flat sums, ``_depthwise_2d``). The
    ``nvec`` sums stay in registers across the terms; the loop this replaces read and
    wrote its accumulator once every three terms."""
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    def codegen(context, builder, signature, args):
        names = ("buf", "off0", "toff", "wr", "bias", "acc", "aoff")
        val = dict(zip(names, args))
        ty = dict(zip(names, signature.args))
        arr = {
            k: context.make_array(ty[k])(context, builder, val[k])
            for k in ("buf", "toff", "wr", "acc")
        }
        ety = context.get_data_type(ty["buf"].dtype)
        esize = context.get_abi_sizeof(ety)
        lanes = vector_bytes() // esize
        vty = ir.VectorType(ety, lanes)
        i32, i64 = ir.IntType(32), ir.IntType(64)
        fma = _vector_fma(builder, vty, lanes, esize)
        off0 = context.cast(builder, val["off0"], ty["off0"], types.intp)
        aoff = context.cast(builder, val["aoff"], ty["aoff"], types.intp)
        undef = ir.Constant(vty, ir.Undefined)
        splat = ir.Constant(ir.VectorType(i32, lanes), [0] * lanes)

        def bcast(v):
            return builder.shuffle_vector(
                builder.insert_element(undef, v, ir.Constant(i32, 0)), undef, splat
            )

        def vptr(k, idx):
            return builder.bitcast(builder.gep(arr[k].data, [idx]), vty.as_pointer())

        bv = bcast(context.cast(builder, val["bias"], ty["bias"], ty["buf"].dtype))
        acc = [cgutils.alloca_once_value(builder, bv) for _ in range(nvec)]
        nt = builder.extract_value(arr["toff"].shape, 0)
        with cgutils.for_range(builder, nt) as lp:
            t = lp.index
            o = builder.add(off0, builder.load(builder.gep(arr["toff"].data, [t])))
            wv = bcast(builder.load(builder.gep(arr["wr"].data, [t])))
            for r, a in enumerate(acc):
                xv = builder.load(
                    vptr("buf", builder.add(o, ir.Constant(i64, r * lanes))), align=esize
                )
                builder.store(builder.call(fma, [wv, xv, builder.load(a)]), a)
        for r, a in enumerate(acc):
            at = builder.add(aoff, ir.Constant(i64, r * lanes))
            builder.store(builder.load(a), vptr("acc", at), align=esize)
        return context.get_dummy_value()

    def typer(typingctx, buf, off0, toff, wr, bias, acc, aoff):
        return types.void(buf, off0, toff, wr, bias, acc, aoff), codegen

    return intrinsic(typer)


def _dw_transpose(builder, rows):
    """The square matrix whose rows are the vectors ``rows``, transposed: log2(L) rounds of
    block swaps (round ``d`` swaps the off-diagonal d x d blocks of every 2d x 2d block),
    each one two-vector shuffle a row."""
    from llvmlite import ir

    n = len(rows)
    mty = ir.VectorType(ir.IntType(32), n)
    d = n // 2
    while d >= 1:
        lo = ir.Constant(mty, [k if k & d == 0 else n + k - d for k in range(n)])
        hi = ir.Constant(mty, [k + d if k & d == 0 else n + k for k in range(n)])
        new = list(rows)
        for i in range(n):
            if not i & d:
                new[i] = builder.shuffle_vector(rows[i], rows[i + d], lo)
                new[i + d] = builder.shuffle_vector(rows[i], rows[i + d], hi)
        rows = new
        d //= 2
    return rows


def _dw_move(gather: bool) -> Any:
    """A square block moved between channel-major and channels-last layouts, transposed
    in registers (a numba intrinsic; ``L`` lanes of a vector register, as ``_dw_tile``),
    for ``rows`` channels and ``count`` positions (both at most ``L``; masked loads and
    stores touch nothing past them):

    - ``gather``: ``move(x, s0, stride, p0, count, rows, xt, doff)`` reads, for channel
      ``c``, the values ``x[s0 + c * stride + p0 ..]`` (flat), and writes position ``k``'s
      channels to ``xt[doff[p0 + k] ..]`` (every ``k < L``: ``doff`` sends the positions
      past ``count`` to a spare vector; lanes past ``rows`` are zeros);
    - else: ``move(ot, p0, count, rows, out, d0, stride)`` reads position ``p0 + k``'s
      channels from ``ot[(p0 + k) L ..]`` (every ``k < L``) and writes channel ``c``'s
      positions to ``out[d0 + c * stride + p0 ..]`` (flat).

    Copies only, no arithmetic: a strided scalar copy of a 512-channel 7x7 map took twice
    the convolution's own sums.
    """
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    if gather:
        names = ("src", "s0", "stride", "p0", "count", "rows", "dst", "doff")
    else:
        names = ("src", "p0", "count", "rows", "dst", "d0", "stride")

    def codegen(context, builder, signature, args):
        val = dict(zip(names, args))
        ty = dict(zip(names, signature.args))
        arrays = ("src", "dst", "doff") if gather else ("src", "dst")
        arr = {k: context.make_array(ty[k])(context, builder, val[k]) for k in arrays}
        ety = context.get_data_type(ty["src"].dtype)
        esize = context.get_abi_sizeof(ety)
        lanes = vector_bytes() // esize
        vty = ir.VectorType(ety, lanes)
        align = esize
        i32, i64 = ir.IntType(32), ir.IntType(64)
        mty = ir.VectorType(ir.IntType(1), lanes)
        suffix = f"v{lanes}{'f32' if esize == 4 else 'f64'}.p0"
        mload = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(vty, [vty.as_pointer(), i32, mty, vty]),
            f"llvm.masked.load.{suffix}",
        )
        mstore = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(ir.VoidType(), [vty, vty.as_pointer(), i32, mty]),
            f"llvm.masked.store.{suffix}",
        )

        def idx(k):
            return context.cast(builder, val[k], ty[k], types.intp)

        def vptr(k, at):
            return builder.bitcast(builder.gep(arr[k].data, [at]), vty.as_pointer())

        p0, stride, rows = idx("p0"), idx("stride"), idx("rows")
        # lanes k < count, the same for every channel's run
        lane_ids = ir.Constant(ir.VectorType(i64, lanes), list(range(lanes)))
        und = ir.Constant(ir.VectorType(i64, lanes), ir.Undefined)
        one = builder.insert_element(und, idx("count"), ir.Constant(i32, 0))
        cnt = builder.shuffle_vector(one, und, ir.Constant(ir.VectorType(i32, lanes), [0] * lanes))
        in_count = builder.icmp_signed("<", lane_ids, cnt)
        none = ir.Constant(mty, [0] * lanes)

        def row_mask(c):
            # every lane of channel c's run, or none past ``rows``
            live = builder.icmp_signed("<", ir.Constant(i64, c), rows)
            return builder.select(live, in_count, none)

        zero = ir.Constant(vty, None)
        align32 = ir.Constant(i32, align)
        lanes_c = ir.Constant(i64, lanes)
        # A whole block (every lane of every row) takes plain loads and stores: AMD's Zen
        # microcodes masked stores (a 128-channel 28x28 conv spent most of its time in
        # them); only the last block of channels or positions is masked.
        full = builder.and_(
            builder.icmp_signed("==", idx("count"), lanes_c),
            builder.icmp_signed("==", rows, lanes_c),
        )
        if gather:
            s0 = idx("s0")
            src_at = [
                builder.add(builder.add(s0, builder.mul(ir.Constant(i64, c), stride)), p0)
                for c in range(lanes)
            ]
            with builder.if_else(full) as (whole, part):
                with whole:
                    plain = [builder.load(vptr("src", at), align=align) for at in src_at]
                    b_whole = builder.block
                with part:
                    masked = [
                        builder.call(mload, [vptr("src", at), align32, row_mask(c), zero])
                        for c, at in enumerate(src_at)
                    ]
                    b_part = builder.block
            vals = []
            for a, b in zip(plain, masked):
                phi = builder.phi(vty)
                phi.add_incoming(a, b_whole)
                phi.add_incoming(b, b_part)
                vals.append(phi)
            for k, v in enumerate(_dw_transpose(builder, vals)):
                pk = builder.add(p0, ir.Constant(i64, k))
                at = builder.load(builder.gep(arr["doff"].data, [pk]))
                builder.store(v, vptr("dst", at), align=align)
        else:
            d0 = idx("d0")
            width = ir.Constant(i64, lanes)
            vals = [
                builder.load(
                    vptr("src", builder.mul(builder.add(p0, ir.Constant(i64, k)), width)),
                    align=align,
                )
                for k in range(lanes)
            ]
            rows_t = _dw_transpose(builder, vals)
            dst_at = [
                builder.add(builder.add(d0, builder.mul(ir.Constant(i64, c), stride)), p0)
                for c in range(lanes)
            ]
            with builder.if_else(full) as (whole, part):
                with whole:
                    for v, at in zip(rows_t, dst_at):
                        builder.store(v, vptr("dst", at), align=align)
                with part:
                    for c, (v, at) in enumerate(zip(rows_t, dst_at)):
                        builder.call(mstore, [v, vptr("dst", at), align32, row_mask(c)])
        return context.get_dummy_value()

    if gather:

        def typer(typingctx, src, s0, stride, p0, count, rows, dst, doff):
            return types.void(src, s0, stride, p0, count, rows, dst, doff), codegen
    else:

        def typer(typingctx, src, p0, count, rows, dst, d0, stride):
            return types.void(src, p0, count, rows, dst, d0, stride), codegen

    return intrinsic(typer)


def _make_dw_tiles() -> None:
    # Module globals, where the compiled loop looks its intrinsics up.
    g = globals()
    if "_dw_tile8" not in g:
        g["_dw_tile8"] = _dw_tile(8)
        g["_dw_flat8"] = _dw_flat(8)
        g["_dw_gather"] = _dw_move(True)
        g["_dw_scatter"] = _dw_move(False)


def _depthwise_2d_cl(x, wt, bias, has_bias, geo, oh, ow, lanes, code, prm, r0, r1, out):
    """``_depthwise_2d`` (channel multiplier 1) with channels in the vector: rows r0..r1.

    On small maps the flat-plane sums run short loops (a 7x7 map's 73 values) per kernel
    offset and channel. Here a block of ``lanes`` channels (one vector register) is moved
    channels-last (``_dw_gather``) into a zero-bordered buffer split by column stride
    phase (column ``v`` of phase ``b`` is padded column ``v * sw + b``): every kernel
    offset of an output position is then one vector at a fixed distance, and
    ``_dw_tile8`` sums eight positions' terms in registers; ``_dw_scatter`` moves the
    sums back channel-major. ``wt`` is the weights transposed, (KH*KW, C). Each output
    is the bias, then one fused multiply-add a term in kernel order, then the activation:
    the bits of ``_depthwise_2d``.
    """
    kh, kw, sh, sw, dh, dw, pt, pl = geo
    h, wd = x.shape[1], x.shape[2]
    chans = wt.shape[1]
    nt = kh * kw
    hp = (oh - 1) * sh + (kh - 1) * dh + 1
    pc = ow + ((kw - 1) * dw) // sw  # columns of a phase plane
    npos = oh * ow
    hw = h * wd
    # Whole tiles and moves: positions rounded up (the extra ones computed, never stored)
    ntile = (npos + 7) // 8 * 8
    nmove = (npos + lanes - 1) // lanes * lanes
    spare = sw * hp * pc * lanes
    xt = np.zeros(spare + lanes, x.dtype)
    wb = np.zeros((nt + 1) * lanes, x.dtype)  # the terms' weights, then the bias
    if not has_bias:
        wb[nt * lanes :] = -wb[nt * lanes :]  # -0: the sum's identity, as _depthwise_2d
    ot = np.empty(max(ntile, nmove) * lanes, x.dtype)
    toff = np.empty(nt, np.int64)
    for t in range(nt):
        j = (t % kw) * dw
        toff[t] = (((j % sw) * hp + (t // kw) * dh) * pc + j // sw) * lanes
    pos = np.zeros(ntile, np.int64)
    for oy in range(oh):
        for ox in range(ow):
            pos[oy * ow + ox] = (oy * sh * pc + ox) * lanes
    # Where each input position's channels go in ``xt``; positions no output reads, and
    # those past the map in the last move, go to the spare vector past the planes.
    doff = np.full((hw + lanes - 1) // lanes * lanes, spare, np.int64)
    for iy in range(h):
        py = iy + pt
        if py >= hp:
            break
        for ix in range(wd):
            px = ix + pl
            if px // sw < pc:
                doff[iy * wd + ix] = (((px % sw) * hp + py) * pc + px // sw) * lanes
    # Per output row, the kernel offsets whose input row is inside the map: a tile within
    # one output row sums those only (a 5x5 kernel over a 2-row map reads the zero border
    # in 60% of its terms). Skipped terms add a product with zero (the sum itself, but
    # for the sign of a zero sum and a NaN from an infinite weight).
    rterms = np.zeros((oh, nt), np.int64)
    rcount = np.zeros(oh, np.int64)
    # only where every tile lies in one output row (rows of whole tiles): elsewhere the
    # per-row copies of the weights cost more than the skipped terms save
    skips = False
    rows_of_tiles = ow % 8 == 0
    for oy in range(oh):
        cnt = 0
        for t in range(nt):
            iy = oy * sh + (t // kw) * dh - pt
            if iy >= 0 and iy < h:
                rterms[oy, cnt] = t
                cnt += 1
        rcount[oy] = cnt
        skips = skips or (cnt < nt and rows_of_tiles)
    rtoff = np.zeros((oh, nt), np.int64)
    rwb = np.zeros((oh if skips else 0, (nt + 1) * lanes), x.dtype)
    for oy in range(oh):
        for j in range(rcount[oy]):
            rtoff[oy, j] = toff[rterms[oy, j]]
    xf = x.reshape(-1)
    of = out.reshape(-1)
    r = r0
    while r < r1:
        ch0 = r % chans
        cb = min(lanes, r1 - r, chans - ch0)
        # The zero border is never written; lanes past ``cb`` are zeros.
        for p in range(0, hw, lanes):
            _dw_gather(xf, r * hw, hw, p, min(lanes, hw - p), cb, xt, doff)  # noqa: F821
        for t in range(nt):
            src = wt[t, ch0 : ch0 + cb]
            dst = wb[t * lanes : t * lanes + cb]
            for c in range(cb):
                dst[c] = src[c]
        if has_bias:
            for c in range(cb):
                wb[nt * lanes + c] = bias[ch0 + c]
        if skips:
            for oy in range(oh):
                n_ = rcount[oy]
                if n_ == nt:
                    continue
                row = rwb[oy]
                for j in range(n_):
                    t = rterms[oy, j]
                    for c in range(lanes):
                        row[j * lanes + c] = wb[t * lanes + c]
                for c in range(lanes):
                    row[n_ * lanes + c] = wb[nt * lanes + c]
        for i in range(0, npos, 8):
            oy = i // ow
            if skips and rcount[oy] < nt:
                _dw_tile8(xt, pos, i, rtoff[oy, : rcount[oy]], rwb[oy], ot)  # noqa: F821
            else:
                _dw_tile8(xt, pos, i, toff, wb, ot)  # noqa: F821 (made by _make_dw_tiles)
        for p in range(0, npos, lanes):
            _dw_scatter(ot, p, min(lanes, npos - p), cb, of, r * npos, npos)  # noqa: F821
        if code != 0:
            # one call for the block's rows (contiguous): the activation is per value
            _conv_act(of[r * npos : (r + cb) * npos], code, prm)
        r += cb


def _max_pool_2d(x, geo, low, r0, r1, out):
    """2-D MaxPool of planes r0..r1: ``x`` (planes, H, W), ``out`` (planes, OH, OW).

    ``geo`` = (KH, KW, SH, SW, DH, DW, pad top, pad left). Per output row the window's
    input rows (those inside the plane) reduce into one padded row buffer, whose
    padding holds ``low`` (what a padded input would), then each output takes the
    maximum of its KW columns there; a NaN wins, as with np.maximum, and a window
    wholly in the padding gives ``low``. Nothing is padded or copied per call.
    """
    kh, kw, sh, sw, dh, dw, pt, pl = geo
    h, wd = x.shape[1], x.shape[2]
    oh, ow = out.shape[1], out.shape[2]
    span = (ow - 1) * sw + (kw - 1) * dw + 1
    tmp = np.empty(max(span, pl + wd), x.dtype)
    for i in range(tmp.shape[0]):
        tmp[i] = low
    inner = tmp[pl : pl + wd]
    nt = tmp.shape[0]
    ph = np.empty((sw, (nt + sw - 1) // sw), x.dtype)  # the row's phases, for sw > 1
    for r in range(r0, r1):
        plane = x[r]
        for oy in range(oh):
            first = True
            for i in range(kh):
                iy = oy * sh - pt + i * dh
                if iy < 0 or iy >= h:
                    continue
                src = plane[iy]
                if first:
                    for q in range(wd):
                        inner[q] = src[q]
                    first = False
                else:
                    # Two selects, each stored: a single ``v if v > m or v != v else m`` into
                    # the array it reads became a conditional store, which LLVM leaves
                    # scalar on AVX2 (16K values: 13 us against 3). The same values: NaN wins.
                    for q in range(wd):
                        v = src[q]
                        m = inner[q]
                        g = v if v > m else m
                        inner[q] = g if v == v else v
            if first:  # no input row in this window
                for q in range(wd):
                    inner[q] = low
            dst = out[r, oy]
            if sw == 1:
                # one column term at a time over the whole row (vectorised)
                for ox in range(ow):
                    dst[ox] = tmp[ox]
                for j in range(1, kw):
                    sj = tmp[j * dw : j * dw + ow]
                    for ox in range(ow):
                        v = sj[ox]
                        m = dst[ox]
                        g = v if v > m else m
                        dst[ox] = g if v == v else v
            else:
                # Split the row into its sw phases, each contiguous (ph[p][q] = tmp[q*sw + p]):
                # every window column is then a contiguous run of one phase, and the maxima
                # run as vector loops. Taking the windows one by one at stride sw was
                # scalar: [128, 30, 80] 3x3 stride 2 took 145 us, now 84 (onnxruntime 48).
                for p in range(sw):
                    prow = ph[p]
                    for q in range((nt - p + sw - 1) // sw):
                        prow[q] = tmp[q * sw + p]
                p0 = ph[0]
                for ox in range(ow):
                    dst[ox] = p0[ox]
                for j in range(1, kw):
                    t = j * dw
                    sj = ph[t % sw, t // sw : t // sw + ow]
                    for ox in range(ow):
                        v = sj[ox]
                        m = dst[ox]
                        g = v if v > m else m
                        dst[ox] = g if v == v else v


def _nearest_2d(x, ih, iw, doubled, r0, r1, out):
    """Nearest-neighbour resize of planes r0..r1 over their last two axes: ``out[p, i, j] =
    x[p, ih[i], iw[j]]``, ``x`` (planes, H, W), ``out`` (planes, OH, OW). An output row whose
    source row is the previous one's (every row of an integer upscale but the first of
    its run) is a copy of that row, not a second gather. ``doubled``: ``iw[j]`` is ``j //
    2`` over the whole row (a 2x upscale of W), written as two stores of each source value,
    which LLVM vectorises with shuffles; a gather of ``iw`` stays scalar on AVX2 (96 x 40 x
    40 -> 80 x 80: 183 us against 102)."""
    oh, ow = out.shape[1], out.shape[2]
    w = x.shape[2]
    for p in range(r0, r1):
        plane = x[p]
        dplane = out[p]
        for i in range(oh):
            dst = dplane[i]
            if i > 0 and ih[i] == ih[i - 1]:
                prev = dplane[i - 1]
                for j in range(ow):
                    dst[j] = prev[j]
            elif doubled:
                src = plane[ih[i]]
                for q in range(w):
                    v = src[q]
                    dst[2 * q] = v
                    dst[2 * q + 1] = v
            else:
                src = plane[ih[i]]
                for j in range(ow):
                    dst[j] = src[iw[j]]


def _depth_to_space_2d(cols, bias, has_bias, kh, kw, r0, r1, out):
    """ConvTranspose with kernel == stride: planes r0..r1 (image * channel) of ``out`` (P,
    H * KH, W * KW) from ``cols`` (P, KH * KW, H, W), ``out[p, i KH + a, j KW + b] = cols[p,
    a KW + b, i, j]`` (+ ``bias[p % M]``, M = bias.shape[0], when ``has_bias``: the same sum
    as adding it after). Each output row is written once, left to right; a 2-wide kernel
    as two stores a source value, which LLVM vectorises with shuffles (NumPy's four strided
    copies moved a value at a time: 24 x 16 x 24 in 52 us)."""
    h, w = cols.shape[2], cols.shape[3]
    m = bias.shape[0]
    for p in range(r0, r1):
        src = cols[p]
        dst = out[p]
        bv = bias[p % m] if has_bias else bias[0]
        for i in range(h):
            for a in range(kh):
                orow = dst[i * kh + a]
                if kw == 2:
                    s0 = src[a * 2, i]
                    s1 = src[a * 2 + 1, i]
                    if has_bias:
                        for j in range(w):
                            orow[2 * j] = s0[j] + bv
                            orow[2 * j + 1] = s1[j] + bv
                    else:
                        for j in range(w):
                            orow[2 * j] = s0[j]
                            orow[2 * j + 1] = s1[j]
                else:
                    for b in range(kw):
                        sb = src[a * kw + b, i]
                        for j in range(w):
                            v = sb[j]
                            orow[j * kw + b] = v + bv if has_bias else v


_HELPERS = {"_conv_act": _conv_act}
_SOURCES.update(nearest_2d=_nearest_2d, depth_to_space_2d=_depth_to_space_2d)
_SOURCES.update(depthwise_2d=_depthwise_2d, conv_epilogue=_conv_epilogue, max_pool_2d=_max_pool_2d)
_SOURCES.update(depthwise_2d_cl=_depthwise_2d_cl)


def _int8_scales(row, lo, n):
    """(amax / 127, 127 / amax) over one block of A, ``row[lo:lo + n]`` (float32): the size
    of its int8 steps and the factor that rounds it to them (127 for a block of zeros), as
    ``contrib.int8_blocks``. Inlined (``_HELPER_OPTIONS``) with the caller's error model."""
    amax = np.float32(0.0)
    for j in range(n):
        v = abs(row[lo + j])
        if v > amax:
            amax = v
    inv = np.float32(127.0) / (amax if amax != 0 else np.float32(1.0))
    return amax / np.float32(127.0), inv


def _quantize_a(blocks, aq, asc, asum):
    """A (M, KB, BS) float32 rounded to int8 per block: ``rint(a * 127 / amax)``.

    ``aq`` (M, KB, 2, BS / 2) takes the even and the odd positions of each block apart
    (the low and high nibbles of the 4-bit weight bytes they meet); for 8-bit weights
    it is (M, KB, 1, BS). ``asc`` gets each block's scale ``amax / 127``, ``asum`` the
    sum of its integers.
    """
    m_rows, kb_n, bs = blocks.shape
    parts = aq.shape[2]
    for m in range(m_rows):
        for kb in range(kb_n):
            blk = blocks[m, kb]
            scale, inv = _int8_scales(blk, 0, bs)
            tot = 0
            for j in range(bs):
                q = np.int32(np.rint(blk[j] * inv))
                aq[m, kb, j % parts, j // parts] = q
                tot += q
            asc[m, kb] = scale
            asum[m, kb] = tot


def _nbits_int(aq, asc, asum, packed, scales, zp, n0, n1, out):
    """MatMulNBits on packed weights, int8 A (``_quantize_a``): out (M, N), columns n0..n1.

    ``packed`` (KB, bytes, N) uint8 holds the weight transposed, so the innermost
    loop runs over contiguous output columns: 4-bit weights two a byte (low
    nibble first) when ``aq`` has two parts, 8-bit ones otherwise; ``scales`` and
    ``zp`` (KB, N), the zero points whole numbers. Each block's products add as
    integers (exact); then the zero point's share ``zp * sum(a)`` comes off, both
    block scales multiply, and the blocks add in order.
    """
    m_rows, kb_n, parts, h = aq.shape
    w = n1 - n0
    si = np.empty(w, np.int32)
    acc = np.empty(w, np.float32)
    for m in range(m_rows):
        acc[:] = 0
        for kb in range(kb_n):
            si[:] = 0
            for j in range(h):
                row = packed[kb, j, n0:n1]
                if parts == 2:
                    lo = np.int32(aq[m, kb, 0, j])
                    hi = np.int32(aq[m, kb, 1, j])
                    for x in range(w):
                        byte = np.int32(row[x])
                        si[x] += lo * (byte & 15) + hi * (byte >> 4)
                else:
                    a = np.int32(aq[m, kb, 0, j])
                    for x in range(w):
                        si[x] += a * np.int32(row[x])
            sa = asum[m, kb]
            ca = asc[m, kb]
            zr = zp[kb, n0:n1]
            sr = scales[kb, n0:n1]
            for x in range(w):
                acc[x] += (np.float32(si[x]) - zr[x] * sa) * (ca * sr[x])
        out[m, n0:n1] = acc


def _nbits_float(af, packed, scales, zp, n0, n1, out):
    """MatMulNBits on packed weights (``_nbits_int``'s layout), float32 A in ``aq``'s layout.

    Per block: sum(a * q) - zp * sum(a), times the block's scale; blocks add in order.
    """
    m_rows, kb_n, parts, h = af.shape
    w = n1 - n0
    sf = np.empty(w, np.float32)
    acc = np.empty(w, np.float32)
    for m in range(m_rows):
        acc[:] = 0
        for kb in range(kb_n):
            sf[:] = 0
            t = np.float32(0.0)
            for j in range(h):
                row = packed[kb, j, n0:n1]
                if parts == 2:
                    lo = af[m, kb, 0, j]
                    hi = af[m, kb, 1, j]
                    t += lo + hi
                    for x in range(w):
                        byte = row[x]
                        sf[x] += lo * np.float32(byte & 15) + hi * np.float32(byte >> 4)
                else:
                    a = af[m, kb, 0, j]
                    t += a
                    for x in range(w):
                        sf[x] += a * np.float32(row[x])
            zr = zp[kb, n0:n1]
            sr = scales[kb, n0:n1]
            for x in range(w):
                acc[x] += (sf[x] - zr[x] * t) * sr[x]
        out[m, n0:n1] = acc


def _int8_round(blocks, out):
    """``contrib.int8_blocks`` in one loop: each block of A rounded to int8 steps, as floats."""
    m_rows, kb_n, bs = blocks.shape
    for m in range(m_rows):
        for kb in range(kb_n):
            blk = blocks[m, kb]
            scale, inv = _int8_scales(blk, 0, bs)
            o = out[m, kb]
            for j in range(bs):
                o[j] = np.rint(blk[j] * inv) * scale


_HELPERS["_int8_scales"] = _int8_scales
_HELPER_OPTIONS["_int8_scales"] = {"inline": "always"}


def _window_axis(x, k, s, d, total, out):
    """One axis of a separable pooling window: out[a, o, b] = x[a, o*s, b] (+|max) ... (k terms).

    ``x`` (A, L, B) and ``out`` (A, nout, B); ``total`` 1 sums, 0 takes the maximum.
    Terms combine in window order, as ``nn_cpu.window_reduce`` combines them.
    """
    n_a, _, n_b = x.shape
    nout = out.shape[1]
    for a in range(n_a):
        for o in range(nout):
            i0 = o * s
            for b in range(n_b):
                out[a, o, b] = x[a, i0, b]
            for t in range(1, k):
                i = i0 + t * d
                if total:
                    for b in range(n_b):
                        out[a, o, b] = out[a, o, b] + x[a, i, b]
                else:
                    for b in range(n_b):
                        v = x[a, i, b]
                        # NaN wins, as np.maximum lets it
                        if v > out[a, o, b] or v != v:
                            out[a, o, b] = v


def _winograd_in(xp, th, tw, r0, r1, v):
    """Winograd F(2x2, 3x3) input tiles: ``v[k, r, i * tw + j] = (B^T d B)[k // 4, k % 4]``.

    ``xp`` (rows, 2 * th + 2, >= 2 * tw + 2) holds the zero-padded planes (image,
    channel), ``d`` the 4x4 tile at (2i, 2j); rows r0..r1. Each tile row is
    transformed along y on whole contiguous rows first (r0 = d0 - d2, r1 = d1 + d2,
    r2 = d2 - d1, r3 = d1 - d3), then along x at stride 2, the same formula.
    """
    wp = xp.shape[2]
    t = np.empty((4, wp), xp.dtype)
    for r in range(r0, r1):
        for i in range(th):
            d0 = xp[r, 2 * i]
            d1 = xp[r, 2 * i + 1]
            d2 = xp[r, 2 * i + 2]
            d3 = xp[r, 2 * i + 3]
            for x in range(wp):
                t[0, x] = d0[x] - d2[x]
                t[1, x] = d1[x] + d2[x]
                t[2, x] = d2[x] - d1[x]
                t[3, x] = d1[x] - d3[x]
            base = i * tw
            for a in range(4):
                ta = t[a]
                o0 = v[4 * a, r]
                o1 = v[4 * a + 1, r]
                o2 = v[4 * a + 2, r]
                o3 = v[4 * a + 3, r]
                for j in range(tw):
                    x = 2 * j
                    o0[base + j] = ta[x] - ta[x + 2]
                    o1[base + j] = ta[x + 1] + ta[x + 2]
                    o2[base + j] = ta[x + 2] - ta[x + 1]
                    o3[base + j] = ta[x + 1] - ta[x + 3]


def _winograd_out(m, bias, tw, r0, r1, y):
    """Winograd F(2x2, 3x3) outputs from the 16 products ``m`` (16, rows, th * tw): ``y``.

    ``y`` (rows, oh, ow) gets A^T m A plus ``bias[r % len(bias)]`` for rows r0..r1
    (row = image * channels + channel); A^T = [[1, 1, 1, 0], [0, 1, -1, -1]], along
    y first. A tile's second row or column past an odd output edge is not written.
    """
    oh, ow = y.shape[1], y.shape[2]
    nb = bias.shape[0]
    th = (oh + 1) // 2
    full = ow // 2
    for r in range(r0, r1):
        b = bias[r % nb]
        for i in range(th):
            ya = y[r, 2 * i]
            two = 2 * i + 1 < oh
            yb = y[r, 2 * i + 1] if two else ya
            base = i * tw
            for j in range(tw):
                q = base + j
                s00 = m[0, r, q] + m[4, r, q] + m[8, r, q]
                s01 = m[1, r, q] + m[5, r, q] + m[9, r, q]
                s02 = m[2, r, q] + m[6, r, q] + m[10, r, q]
                s03 = m[3, r, q] + m[7, r, q] + m[11, r, q]
                s10 = m[4, r, q] - m[8, r, q] - m[12, r, q]
                s11 = m[5, r, q] - m[9, r, q] - m[13, r, q]
                s12 = m[6, r, q] - m[10, r, q] - m[14, r, q]
                s13 = m[7, r, q] - m[11, r, q] - m[15, r, q]
                x = 2 * j
                if j < full:
                    ya[x] = s00 + s01 + s02 + b
                    ya[x + 1] = s01 - s02 - s03 + b
                    if two:
                        yb[x] = s10 + s11 + s12 + b
                        yb[x + 1] = s11 - s12 - s13 + b
                else:  # the last tile of an odd width: its first column only
                    ya[x] = s00 + s01 + s02 + b
                    if two:
                        yb[x] = s10 + s11 + s12 + b


def _uint8_round_trip(h, out):
    """Each ``h[d]`` (float32, [D, rows, cols]) through uint8 and back, with dynamic
    quantisation's range rule, into ``out``: the float32 operations of
    op_dynamic_quantize_lstm's NumPy path one element at a time (the same bits). False,
    with ``out`` unspecified, if ``h`` holds a value that is not finite (the NumPy path
    then runs, with NumPy's NaN rules)."""
    zero = np.float32(0.0)
    top = np.float32(255.0)
    for d in range(h.shape[0]):
        hd = h[d]
        lo = zero
        hi = zero
        for i in range(hd.shape[0]):
            for j in range(hd.shape[1]):
                v = hd[i, j]
                if v - v != zero:
                    return False
                if v < lo:
                    lo = v
                if v > hi:
                    hi = v
        scale = np.float32(1.0) if hi == lo else np.float32((hi - lo) / top)
        zp = zero - lo / scale
        zp = np.float32(np.rint(min(max(zp, zero), top)))
        qlo = -zp
        qhi = top - zp
        od = out[d]
        for i in range(hd.shape[0]):
            for j in range(hd.shape[1]):
                q = np.float32(np.rint(hd[i, j] / scale))
                if q < qlo:
                    q = qlo
                if q > qhi:
                    q = qhi
                od[i, j] = (q + zero) * scale
    return True


def _tree_leaves(x, n_cols, roots, feat, thr, kids, depth, nan_slot, nan_fix, out):
    """out[r * trees + t]: the node tree t reaches for row r of the flat input ``x``.

    tree_eval's level-by-level traversal, compiled: each step goes to
    ``kids[2 * node + (x[feature] > threshold)]`` (a leaf points to itself), or by
    ``nan_slot[node]`` for a NaN when ``nan_fix``. The walks advance a block at a time,
    one level for all of the block, so their independent table reads overlap (a walk
    taken alone to its leaf waits on each read: twice as slow on depth-10 forests).
    """
    n_trees = roots.shape[0]
    total = out.shape[0]
    block = 256
    for b0 in range(0, total, block):
        b1 = min(total, b0 + block)
        for i in range(b0, b1):
            out[i] = roots[i % n_trees]
        for _ in range(depth):
            for i in range(b0, b1):
                nd = out[i]
                v = x[(i // n_trees) * n_cols + feat[nd]]
                c = v > thr[nd]
                if nan_fix and v != v:
                    c = nan_slot[nd]
                out[i] = kids[2 * nd + (1 if c else 0)]


def _tree_leaf_sums(leaves, n_trees, w_target, w_value, s, has):
    """s[r, w_target[l]] += w_value[l] for the leaf l each tree reached on row r (one weight
    a leaf), and ``has`` where a weight was added; trees in order, as bincount adds them."""
    for i in range(leaves.shape[0]):
        leaf = leaves[i]
        r = i // n_trees
        t = w_target[leaf]
        s[r, t] += w_value[leaf]
        has[r, t] = True


_SOURCES.update(
    tree_leaves=_tree_leaves,
    tree_leaf_sums=_tree_leaf_sums,
    uint8_round_trip=_uint8_round_trip,
    window_axis=_window_axis,
    int8_round=_int8_round,
    quantize_a=_quantize_a,
    nbits_int=_nbits_int,
    nbits_float=_nbits_float,
    winograd_in=_winograd_in,
    winograd_out=_winograd_out,
)


# --- Logistic without exp (issue 23): float32 sigmoid for Sigmoid, onnxep::SiLU, QuickGelu,
# Swish and FusedConv's Sigmoid/SiLU epilogues (``_conv_act`` codes 8 and 9). Kept in one block.

# exp(r) = 1 + r + r**2 * q(r) on |r| <= ln(2)/2, q of degree 4 fitted for the least
# largest relative error (3e-9; 7e-8 evaluated in float32)
_LG_Q0 = np.float32(0.49999994)
_LG_Q1 = np.float32(0.16666521)
_LG_Q2 = np.float32(0.04166839)
_LG_Q3 = np.float32(0.00836871)
_LG_Q4 = np.float32(0.0013814613)
_LG_LOG2E = np.float32(1.4426950408889634)
# ln 2 in two parts: k * _LG_LN2_HI is exact for |k| <= 128 (9 bits times 8 bits)
_LG_LN2_HI = np.float32(0.693359375)
_LG_LN2_LO = np.float32(-2.12194440e-4)
# 1.5 * 2**23: adding and subtracting it rounds a float32 below 2**22 to an integer
_LG_ROUND = np.float32(12582912.0)
# Below this x, exp(-x) overflows float32 and 1 / (1 + exp(-x)) is 0 (exp(88.72283) is the
# largest finite float32 exponential)
_LG_LOW = np.float32(-88.72283)
_LG_KMIN = np.float32(-128.0)
_LG_ZERO = np.float32(0.0)
_LG_ONE = np.float32(1.0)
_LG_TINY = np.float32(2.0**-64)
# exponent bias + 64: 2**(k + 64) is a normal float32 for every k in [-128, 0]
_LG_BIAS = np.int32(127 + 64)
_LG_SHIFT = np.int32(23)


def _exp_reduced(t):
    """exp(t) for float32 t in [-88.72283, 0] (NaN stays NaN) without a libm call, 2e-7
    relative: t = k ln 2 + r (k an integer, |r| <= ln(2)/2, ln 2 in two parts), exp(r) a
    degree-6 polynomial, 2**k from exponent bits as 2**(k + 64) * 2**-64 because k
    reaches -128, below float32's normal range. Callers clamp t (``_logistic_value``,
    softmax_loops' ``exp_nonpositive``). Compiled with contraction only
    (``_HELPER_OPTIONS``) and not inlined at numba's level: the multiply-adds are the same
    FMAs in every loop LLVM inlines it into, whatever that loop's own fast-math flags."""
    kf = t * _LG_LOG2E + _LG_ROUND
    kf = kf - _LG_ROUND
    r = t - kf * _LG_LN2_HI
    r = r - kf * _LG_LN2_LO
    q = _LG_Q4 * r + _LG_Q3
    q = q * r + _LG_Q2
    q = q * r + _LG_Q1
    q = q * r + _LG_Q0
    p = q * (r * r) + r
    p = p + _LG_ONE
    # NaN: any finite k (p is NaN already); a float-to-int conversion of NaN is undefined
    if not (kf >= _LG_KMIN):
        kf = _LG_ZERO
    scale = np.int32((np.int32(kf) + _LG_BIAS) << _LG_SHIFT).view(np.float32)
    return (p * scale) * _LG_TINY


def _logistic_value(w):
    """sigmoid(w) on float32, without a libm ``exp`` call.

    u = exp(-|w|) in (0, 1] (``_exp_reduced``), then one division: 1 / (1 + u) for w >= 0,
    u / (1 + u) below, so small results keep their relative accuracy (no 1 - s is formed).
    Plain float32 operations and no table, so LLVM vectorises the loops it is inlined
    into; compiled with contraction only (``_HELPER_OPTIONS``): the
    multiply-adds become the same FMAs wherever it is inlined, so a fused Conv's
    activation has the Sigmoid node's bits. As 1 / (1 + exp(-w)): NaN stays NaN, +inf
    and large w give 1, -inf and w below -88.72283 (where float32 exp(-w) overflows)
    give 0, and from there to -87.3 the results are subnormal, as there.
    """
    t = -abs(w)
    if t < _LG_LOW:
        t = _LG_LOW
    u = _exp_reduced(t)
    num = _LG_ONE if w >= _LG_ZERO else u
    s = num / (_LG_ONE + u)
    if w < _LG_LOW:
        s = _LG_ZERO
    return s


def _logistic(x, out, alpha, mul):
    """out[i] = (x[i] if mul else 1) * sigmoid(alpha * x[i]), float32, ``out`` not ``x``:
    LLVM's overlap test would send the loop to its scalar version (``_logistic_inplace``)."""
    for i in range(x.shape[0]):
        v = x[i]
        s = _logistic_value(alpha * v)
        out[i] = v * s if mul else s


def _logistic_inplace(y, alpha, mul):
    """``_logistic(y, y, alpha, mul)``, vectorised (one array: no overlap test)."""
    for i in range(y.shape[0]):
        v = y[i]
        s = _logistic_value(alpha * v)
        y[i] = v * s if mul else s


def _logistic_span(x, out, alpha, mul, r0, r1):
    """Flat positions r0..r1 of ``x`` through ``_logistic`` into ``out`` (which may be ``x``)."""
    if x.ctypes.data == out.ctypes.data:
        _logistic_inplace(out[r0:r1], alpha, mul)
    else:
        _logistic(x[r0:r1], out[r0:r1], alpha, mul)


def _swiglu_rows(g, u, out):
    """out[r, i] = (g[r, i] * sigmoid(g[r, i])) * u[r, i] (2-D): the CPU SiLU's value
    (``_logistic``'s, rounded to float32) times up, rounded again, as the SiLU and Mul
    nodes it stands for."""
    for r in range(g.shape[0]):
        gr = g[r]
        ur = u[r]
        o = out[r]
        for i in range(gr.shape[0]):
            v = gr[i]
            a = v * _logistic_value(v)
            o[i] = a * ur[i]


def _swiglu_packed(gu, out):
    """``_swiglu_rows`` of the halves of each row of ``gu`` (R, 2n): gate then up. One
    contiguous array, not two strided halves, so numba knows the rows' inner stride and
    LLVM vectorises the loop (on the halves as views it ran 2.6x slower on 8 rows)."""
    n = out.shape[1]
    for r in range(gu.shape[0]):
        row = gu[r]
        o = out[r]
        for i in range(n):
            v = row[i]
            a = v * _logistic_value(v)
            o[i] = a * row[n + i]


def _sigmoid_flat(x, out):
    """``_logistic(x, out, 1, False)``: the Sigmoid node's call, two arguments for numba's
    dispatch to type instead of ``_logistic_span``'s six (about 1 us of a 4-value node)."""
    _logistic(x, out, _LG_ONE, False)


_HELPERS.update(
    _exp_reduced=_exp_reduced,
    _logistic_value=_logistic_value,
    _logistic=_logistic,
    _logistic_inplace=_logistic_inplace,
)
_HELPER_OPTIONS["_logistic_value"] = {"fastmath": {"contract"}}
_HELPER_OPTIONS["_exp_reduced"] = {"fastmath": {"contract"}}
_SOURCES["logistic_span"] = _logistic_span
_SOURCES["swiglu_rows"] = _swiglu_rows
_SOURCES["swiglu_packed"] = _swiglu_packed
_SOURCES["sigmoid_flat"] = _sigmoid_flat
