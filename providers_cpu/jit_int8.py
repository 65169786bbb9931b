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
- za sum b + K za zb``, computed in int64 and cut to int32). That is the int32
accumulator's result, wrapping included.

Like ``jit.py``: numba optional (``jit.ENABLED``), loops compiled on first use with
the same options (cached on disk, GIL released). The products also need the
instruction: :func:`vnni` says whether numba targets this CPU and it has AVX-512
VNNI; without it the kernels keep the float BLAS path.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import jit

_compiled: dict[str, Any] = {}
_vnni: bool | None = None

BLOCK = 64  # bytes of K per vpdpbusd: buffers are padded to a multiple of it


def vnni() -> bool:
    """True when the u8 x s8 tiles can run: numba on, targeting this CPU, with AVX-512 VNNI."""
    global _vnni
    if not jit.ENABLED:
        return False
    if _vnni is None:
        _vnni = _host_has_vnni()
    return _vnni


def _host_has_vnni() -> bool:
    try:
        import llvmlite.binding as ll
        from numba.core import config
    except Exception:  # a broken numba install: no tiles
        return False
    if config.CPU_NAME or config.CPU_FEATURES:
        # numba told to compile for another CPU (a portable cache): the host's
        # features say nothing about the target's.
        return False
    features = ll.get_host_cpu_features()
    return all(features.get(f, False) for f in ("avx512f", "avx512bw", "avx512vnni"))


def loop(name: str) -> Any:
    """The compiled function ``name`` (defined below), compiling it on first use."""
    f = _compiled.get(name)
    if f is None:
        if not jit.ENABLED:  # also imports numba into jit.nb
            raise RuntimeError(f"jit_int8.loop({name!r}): compiled loops are off here")
        if name in _NEED_TILES:
            _make_tiles()
        f = _compiled[name] = jit.nb.njit(cache=True, nogil=True, boundscheck=False)(_SOURCES[name])
    return f


def _tile_intrinsic(rows: int, cols: int) -> Any:
    """``tile(a, m0, b, n0, nblk, t)``: t[r * cols + c] = sum over nblk * 64 bytes of
    a[m0 + r] (uint8) times b[n0 + c] (int8), rows x cols dot products sharing loads.

    ``a`` and ``b`` are 2-D arrays whose rows are contiguous; the loop keeps the
    rows * cols accumulators (16 lanes of int32 each) in registers and reduces
    each at the end.
    """
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    def codegen(context, builder, signature, args):
        a, m0, b, n0, nblk, t = args
        aty, m0ty, bty, n0ty, nty, tty = signature.args
        arr_a = context.make_array(aty)(context, builder, a)
        arr_b = context.make_array(bty)(context, builder, b)
        arr_t = context.make_array(tty)(context, builder, t)
        i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
        v16 = ir.VectorType(i32, 16)
        m0 = context.cast(builder, m0, m0ty, types.intp)
        n0 = context.cast(builder, n0, n0ty, types.intp)
        nblk = context.cast(builder, nblk, nty, types.intp)
        lda = builder.extract_value(arr_a.strides, 0)
        ldb = builder.extract_value(arr_b.strides, 0)
        abase = builder.bitcast(arr_a.data, i8.as_pointer())
        bbase = builder.bitcast(arr_b.data, i8.as_pointer())

        def row(base, first, i, ld):
            return builder.gep(base, [builder.mul(builder.add(first, ir.Constant(i64, i)), ld)])

        arows = [row(abase, m0, r, lda) for r in range(rows)]
        brows = [row(bbase, n0, c, ldb) for c in range(cols)]
        dp = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(v16, [v16, v16, v16]), "llvm.x86.avx512.vpdpbusd.512"
        )
        red = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(i32, [v16]), "llvm.vector.reduce.add.v16i32"
        )
        zero = ir.Constant(v16, None)
        acc = [[cgutils.alloca_once_value(builder, zero) for _ in range(cols)] for _ in range(rows)]
        with cgutils.for_range(builder, nblk) as lp:
            off = builder.mul(lp.index, ir.Constant(i64, BLOCK))

            def load(p):
                return builder.load(
                    builder.bitcast(builder.gep(p, [off]), v16.as_pointer()), align=1
                )

            av = [load(p) for p in arows]
            bv = [load(p) for p in brows]
            for r in range(rows):
                for c in range(cols):
                    cur = builder.load(acc[r][c])
                    builder.store(builder.call(dp, [cur, av[r], bv[c]]), acc[r][c])
        out = builder.bitcast(arr_t.data, i32.as_pointer())
        for r in range(rows):
            for c in range(cols):
                s = builder.call(red, [builder.load(acc[r][c])])
                builder.store(s, builder.gep(out, [ir.Constant(i64, r * cols + c)]))
        return context.get_dummy_value()

    def typer(typingctx, a, m0, b, n0, nblk, t):
        return types.void(a, m0, b, n0, nblk, t), codegen

    typer.__name__ = f"vnni_tile_{rows}x{cols}"
    return intrinsic(typer)


def _make_tiles() -> None:
    # Module globals, where the compiled drivers look their callees up.
    g = globals()
    if "_tile44" not in g:
        g["_tile14"] = _tile_intrinsic(1, 4)
        g["_tile41"] = _tile_intrinsic(4, 1)
        g["_tile11"] = _tile_intrinsic(1, 1)
        g["_tile44"] = _tile_intrinsic(4, 4)


def _u8s8_gemm(a, b, k, za, zb, sa, sb, mult, bias, out_i, out_f, m0, m1, n0, n1):
    """sum_k (a[m, k] - za[m]) * (b[n, k] - zb[n]) for rows m0..m1, columns n0..n1.

    ``a`` (M, Kp) uint8 and ``b`` (N, Kp) int8 with Kp a multiple of 64 and ``b`` zero
    past ``k`` (so whatever ``a`` holds there adds nothing); ``sa[m]`` and ``sb[n]`` the
    sums of a's and b's first ``k`` values. The int32 result (wrapping) goes to
    ``out_i[m, n]``; when ``out_f`` is not empty, ``float32(it) * mult[n]`` (``+ bias[n]``
    when ``bias`` is not empty) goes to ``out_f[m, n]`` instead, the float32 operations
    of Cast, Mul and Add. Tiles of 4 x 4 share loads; edges take 1-wide tiles.
    """
    nblk = a.shape[1] // 64
    t = np.empty(16, np.int32)
    to_float = out_f.shape[0] > 0
    add_bias = bias.shape[0] > 0
    n = n0
    while n < n1:
        cw = 4 if n + 4 <= n1 else 1
        m = m0
        while m < m1:
            rh = 4 if m + 4 <= m1 else 1
            if rh == 4 and cw == 4:
                _tile44(a, m, b, n, nblk, t)  # noqa: F821 (made by _make_tiles)
            elif rh == 4:
                _tile41(a, m, b, n, nblk, t)  # noqa: F821
            elif cw == 4:
                _tile14(a, m, b, n, nblk, t)  # noqa: F821
            else:
                _tile11(a, m, b, n, nblk, t)  # noqa: F821
            for r in range(rh):
                mm = m + r
                zam = np.int64(za[mm])
                sam = np.int64(sa[mm])
                for c in range(cw):
                    nn = n + c
                    zbn = np.int64(zb[nn])
                    v = np.int64(t[r * cw + c]) - zbn * sam - zam * np.int64(sb[nn]) + k * zam * zbn
                    acc = np.int32(v)
                    if to_float:
                        y = np.float32(acc) * mult[nn]
                        if add_bias:
                            y = y + bias[nn]
                        out_f[mm, nn] = y
                    else:
                        out_i[mm, nn] = acc
            m += rh
        n += cw


def _row_sums(a, k, out, m0, m1):
    """out[m] = the sum of a[m, :k] (uint8) for rows m0..m1."""
    for m in range(m0, m1):
        s = np.int32(0)
        r = a[m]
        for j in range(k):
            s += np.int32(r[j])
        out[m] = s


def _pack_rows(a, flip, out, sums):
    """Rows of ``a`` (M, K) into ``out`` (M, Kp) as uint8 (int8 ``a`` with its sign bit flipped,
    ``flip`` = 128: a + 128), and their sums into ``sums``."""
    m_rows, k = a.shape
    for m in range(m_rows):
        s = np.int32(0)
        src = a[m]
        dst = out[m]
        for j in range(k):
            v = np.uint8(np.int32(src[j]) + flip)
            dst[j] = v
            s += np.int32(v)
        sums[m] = s


def _im2col(x, pad, kh, kw, sh, sw, dh, dw, ph, pw, ow, p0, p1, cols, sums):
    """Patches of ``x`` (H, W, C) uint8 for output positions p0..p1 (row-major over the
    output's OH x OW) into ``cols`` (P, Kp): row p holds the window's pixels tap by tap
    (kh, kw), each tap's C channels contiguous; taps outside the image hold ``pad`` (the
    zero point, which the product takes off again). ``sums[p]`` gets each row's sum."""
    h, w, c = x.shape
    padsum = np.int32(pad) * np.int32(c)
    for p in range(p0, p1):
        oy = p // ow
        ox = p - oy * ow
        dst = cols[p]
        s = np.int32(0)
        q = 0
        for i in range(kh):
            iy = oy * sh - ph + i * dh
            for j in range(kw):
                ix = ox * sw - pw + j * dw
                if 0 <= iy < h and 0 <= ix < w:
                    src = x[iy, ix]
                    for ch in range(c):
                        v = src[ch]
                        dst[q + ch] = v
                        s += np.int32(v)
                else:
                    for ch in range(c):
                        dst[q + ch] = pad
                    s += padsum
                q += c
        sums[p] = s


def _to_nhwc(x, flip, out):
    """``x`` (C, H, W) 8-bit into ``out`` (H, W, C) uint8, plus ``flip`` (128 for int8)."""
    c, h, w = x.shape
    for y in range(h):
        for ch in range(c):
            src = x[ch, y]
            dst = out[y]
            for i in range(w):
                dst[i, ch] = np.uint8(np.int32(src[i]) + flip)


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


_SOURCES = {
    "u8s8_gemm": _u8s8_gemm,
    "row_sums": _row_sums,
    "pack_rows": _pack_rows,
    "im2col": _im2col,
    "to_nhwc": _to_nhwc,
    "dq_uint8": _dq_uint8,
}
_NEED_TILES = frozenset({"u8s8_gemm"})
