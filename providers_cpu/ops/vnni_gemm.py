"""8-bit products on the compiled tiles (``providers_cpu/jit_int8.py``): AVX-512 VNNI's
``vpdpbusd``, or on AVX2 the same layouts multiplied exactly by ``vpmaddwd`` on operands
widened to 16 bits (``providers_cpu/jit_int8_avx2.py``).

A tile broadcasts four bytes of one operand's row (``x``) against 16 columns' next four
bytes of the other (``y``, laid out four k at a time), so each int32 lane of the result
is one output element and nothing is reduced across lanes. ``vpdpbusd`` takes uint8
times int8; other signs are moved there exactly: an int8 operand plus 128 is a uint8
one, a uint8 operand minus 128 an int8 one, and its zero point moves by the same 128,
so ``(a - za) * (b - zb)`` is unchanged. The zero points come off after the product:
``sum (a - za)(b - zb) = sum ab - zb sum a - za sum b + K za zb``, all in int32 that
wraps, which is the int32 accumulator's result bit for bit (jit_int8 says why no
bound is needed). Constant weights are packed once per session.

- :class:`PackedB`, :func:`matmul`: MatMulInteger and kin. A's rows are broadcast (uint8),
  B (K, N) is the 16-column side (int8); the float32 form applies a per-column scale and
  bias as each result is made (Cast, Mul and Add's float32 operations).
- :class:`PackedConv`: ConvInteger. W's rows (one per output channel, int8) are
  broadcast, and each image's windows are laid out as the 16-column side (uint8), one
  column per output position, so the result is already (channels, positions): NCHW.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import jit_int8
from .nn_cpu import parallel_rows

#: Below this many multiply-adds (about 300 us on one core) a second thread costs more
#: than it saves: handing work to the run's thread pool cost about 40 us a call on the
#: 2-core machine (ddddocr's convolutions: 331 us on one thread, 686 us split), and a
#: product that reads its weights from memory (ddddocr's 100M multiply-add classifier)
#: is no faster on two cores than on one.
PARALLEL_WORK = 1 << 27
_NO_FLOATS = np.empty(0, np.float32)
_NO_INTS = np.empty(0, np.int32)
_NO_OUTPUT = np.empty((1, 0, 0), np.float32)
_NO_INT_OUTPUT = np.empty((1, 0, 0), np.int32)
_ZERO = np.zeros(1, np.int64)


def available(*dtypes: Any) -> bool:
    """Whether the tiles can run here on operands of these (8-bit) dtypes."""
    ok = all(np.dtype(d) in (np.dtype(np.uint8), np.dtype(np.int8)) for d in dtypes)
    return ok and bool(jit_int8.tiles())


def _up(n: int, step: int) -> int:
    return -(-max(n, 1) // step) * step


def _wrap32(v: Any) -> np.ndarray:
    """int64 values cut to int32 as int32 arithmetic wraps."""
    return np.asarray(v, np.int64).astype(np.int32)


def _padded(v: np.ndarray, n: int, dtype: Any, fill: float = 0) -> np.ndarray:
    out = np.full(n, fill, dtype)
    out[: v.shape[0]] = v
    return out


def _columns_layout(cols: np.ndarray) -> np.ndarray:
    """(K, N) 8-bit columns as the tiles' 16-column side: (K4, 4 N') with each column's four
    k together, K padded to a multiple of 4 and N to one of 16 (zeros)."""
    k, n = cols.shape
    k4, np_ = _up(k, 4) // 4, _up(n, 16)
    buf = np.zeros((k4 * 4, np_), cols.dtype)
    buf[:k, :n] = cols
    return np.ascontiguousarray(buf.reshape(k4, 4, np_).transpose(0, 2, 1)).reshape(k4, 4 * np_)


def _signed(w: np.ndarray) -> tuple[np.ndarray, int]:
    """8-bit weights as int8 and the amount their zero point moves (uint8: minus 128)."""
    if w.dtype == np.uint8:
        return (w.astype(np.int16) - 128).astype(np.int8), 128
    return w, 0


def _run(f: Any, args: tuple, rows: int, cols: int, k: int) -> None:
    """``f(*args, i0, i1, j0, j1)`` over all rows and columns, columns split over the run's
    threads in blocks of 64 (the wide tiles) when the product is large."""
    work = rows * cols * k
    if work < PARALLEL_WORK:
        f(*args, 0, rows, 0, cols)
        return
    parallel_rows(
        -(-cols // 64), work, lambda g0, g1: f(*args, 0, rows, 64 * g0, min(cols, 64 * g1))
    )


class PackedB:
    """A constant (K, N) B and its zero point (None, one value, or one per column).

    ``panels``: B in panels of 64 columns (N padded to 64), each panel's bytes together
    (jit_int8's panel tiles): a product with few rows, run many times on the same B (a
    recurrent step's), streams each panel once from one contiguous block instead of 256
    bytes from each of K / 4 rows N bytes apart.
    """

    def __init__(self, b: np.ndarray, zp: Any, panels: bool = False) -> None:
        k, n = b.shape
        b8, moved = _signed(b)
        self.k, self.n = k, n
        self.nk4 = _up(k, 4) // 4
        self.panels = panels
        #: which tiles run this B (jit_int8.weights_isa: AVX2's sign pairs where they can)
        self.isa = jit_int8.weights_isa(k, int(b8.min()) if b8.size else 0)
        y = _columns_layout(b8)
        if panels:
            width = _up(n, 64)
            wide = np.zeros((self.nk4, 4 * width), np.int8)
            wide[:, : y.shape[1]] = y
            # (nk4, panels, 256) -> (panels, nk4, 256): rows of y are panels x nk4
            y = wide.reshape(self.nk4, width // 64, 256).transpose(1, 0, 2).reshape(-1, 256)
            y = np.ascontiguousarray(y)
        self.y = y
        np_ = _up(n, 64) if panels else y.shape[1] // 4
        z = np.zeros(1, np.int64) if zp is None else np.asarray(zp).astype(np.int64).reshape(-1)
        zb = np.broadcast_to(z, (n,)) - moved
        sb = b8.sum(axis=0, dtype=np.int64)
        # v = acc - sa[m] * zb[n] + za[m] * (K zb[n] - sb[n])
        self.zc = _padded(_wrap32(zb), np_, np.int32)
        self.cc = _padded(_wrap32(k * zb - sb), np_, np.int32)


def matmul(
    a: np.ndarray,
    a_zp: Any,
    packed: PackedB,
    mult: np.ndarray | None = None,
    bias: np.ndarray | None = None,
) -> np.ndarray:
    """(..., M, K) 8-bit ``a`` minus ``a_zp`` (None, one value, or one per row of M) times the
    packed (K, N) B: int32, or with ``mult`` (one or N float32) and optionally ``bias`` (N
    float32) ``float32(acc) * mult + bias`` in float32."""
    k, n = packed.k, packed.n
    lead = a.shape[:-1]
    rows = a.size // k if k else int(np.prod(lead, dtype=np.int64))
    a2 = a.reshape(rows, k)
    za = _ZERO if a_zp is None else np.asarray(a_zp, np.int64).reshape(-1)
    buf = np.empty((rows, 4 * packed.nk4), np.uint8)
    sa, zr, rc = np.empty(rows, np.int32), np.empty(rows, np.int32), np.zeros(rows, np.int32)
    flip = 128 if a2.dtype == np.int8 else 0
    if mult is None:
        jit_int8.loop("mm_prep")(
            a2, flip, za, buf, sa, zr, n, _NO_FLOATS, _NO_FLOATS, _NO_FLOATS, _NO_FLOATS
        )
        out = np.empty((rows, n), np.int32)
        if packed.panels:
            args = (buf, packed.y, packed.nk4, sa, zr, rc, packed.zc, packed.cc, out, n)
            _run(jit_int8.loop("panels_int", packed.isa), args, rows, n, k)
        else:
            args = (0, buf, packed.y, packed.nk4, sa, zr, rc, packed.zc, packed.cc, out, n)
            _run(jit_int8.loop("gemm_int", packed.isa), args, rows, n, k)
    else:
        np_ = packed.zc.shape[0]
        mv, bv = np.empty(np_, np.float32), np.empty(np_, np.float32)
        b = _NO_FLOATS if bias is None else np.asarray(bias, np.float32).reshape(-1)
        m = np.asarray(mult, np.float32).reshape(-1)
        jit_int8.loop("mm_prep")(a2, flip, za, buf, sa, zr, n, m, b, mv, bv)
        out = np.empty((rows, n), np.float32)
        args = (buf, packed.y, packed.nk4, sa, zr, rc, packed.zc, packed.cc, mv, bv, out, n)
        f = jit_int8.loop("panels_float" if packed.panels else "gemm_float", packed.isa)
        _run(f, args, rows, n, k)
    return out.reshape(*lead, n)


def padded_bias(bias: np.ndarray | None, packed: PackedB) -> np.ndarray:
    """A bias (N float32, or None: -0.0, which adding leaves every float32 as it is) padded
    to the packed B's vectors, as :func:`dynamic_matmul` takes it."""
    np_ = packed.zc.shape[0]
    if bias is None:
        return np.full(np_, -0.0, np.float32)
    return _padded(np.asarray(bias, np.float32).reshape(-1), np_, np.float32)


def dynamic_matmul(
    a: np.ndarray, packed: PackedB, b_scale: np.ndarray, bias: np.ndarray
) -> np.ndarray | None:
    """DynamicQuantizeMatMul of float32 ``a`` (..., K) by the packed B in one compiled call:
    ``b_scale`` and ``bias`` padded to the vectors (:func:`padded_bias`; jit_int8's
    dq_matmul says the rest). None when the product is large enough to split over threads,
    or ``a`` holds a NaN or infinity (the caller's path then runs)."""
    k, n = packed.k, packed.n
    rows = a.size // k if k else 0
    if rows == 0 or rows * n * k >= PARALLEL_WORK or packed.panels:
        return None
    x = np.ascontiguousarray(a, np.float32).reshape(-1)
    out = np.empty((rows, n), np.float32)
    f = jit_int8.loop("dq_matmul", packed.isa)
    ok = f(x, k, packed.nk4, packed.y, packed.zc, packed.cc, b_scale, bias, out)
    return out.reshape(*a.shape[:-1], n) if ok else None


class PackedConv:
    """Constant (O, C, KH, KW) 8-bit weights of a 2-D group-1 convolution and their zero
    point (None, one value, or one per output channel), as the tiles' broadcast rows:
    (O, taps * C4) int8, each tap's channels together and padded to C4 (a multiple of 4)
    with zeros, so a window's layout (jit_int8's im2col4) matches."""

    def __init__(self, w: np.ndarray, zp: Any) -> None:
        o, c, kh, kw = w.shape
        w8, moved = _signed(w)
        self.c4 = _up(c, 4)
        rows = np.zeros((o, kh, kw, self.c4), np.int8)
        rows[..., :c] = w8.transpose(0, 2, 3, 1)
        self.x = rows.reshape(o, -1)
        self.nk4 = self.x.shape[1] // 4
        if jit_int8.tiles() in ("avx2", "avx2s"):
            # AVX2's tiles widen each broadcast row to int16 every k4: widened here once,
            # a row's four k are one broadcast load (ddddocr's convolutions: 17% fewer
            # instructions in the loop)
            self.x = self.x.astype(np.int16)
        self.k = c * kh * kw
        z = np.zeros(1, np.int64) if zp is None else np.asarray(zp).astype(np.int64).reshape(-1)
        zw = np.broadcast_to(z, (o,)) - moved
        # v = acc - zw[o] * sx[p] + (zx (K zw[o] - sw[o]))
        self.rs = _wrap32(zw)
        self.kzs = self.k * zw - w8.reshape(o, -1).sum(axis=1, dtype=np.int64)
        self.zr = np.zeros(o, np.int32)

    def run(
        self,
        x: np.ndarray,
        zx: int,
        geo: tuple,
        out_hw: tuple[int, int],
        add: np.ndarray | None = None,
        scale: np.ndarray | None = None,
    ) -> np.ndarray:
        """The int32 (N, O, OH, OW) convolution of 8-bit ``x`` (N, C, H, W) minus ``zx``;
        ``geo`` is (kh, kw, sh, sw, dh, dw, ph, pw) with the begin pads. ``add`` (O int32)
        is added to each channel (wrapping, as int32 Add does); with ``scale`` (O float32)
        the result is ``float32(conv + add) * scale`` per channel, in float32."""
        n, c, h, w = x.shape
        o = self.x.shape[0]
        oh, ow = out_hw
        p = oh * ow
        flip = 128 if x.dtype == np.int8 else 0
        zx8 = zx + flip
        xb = np.ascontiguousarray(x).view(np.uint8)  # each channel a contiguous plane
        cols = np.empty((self.nk4, _up(p, 16)), np.uint32)
        cols8 = cols.view(np.uint8)
        zplane = np.zeros(h * w, np.uint8)
        av = _NO_INTS if add is None else np.ascontiguousarray(add, np.int32)
        if scale is None:
            y, yf, mv = np.empty((n, o, p), np.int32), _NO_OUTPUT, _NO_FLOATS
        else:
            y, yf = _NO_INT_OUTPUT, np.empty((n, o, p), np.float32)
            mv = np.ascontiguousarray(scale, np.float32)
        out = y if scale is None else yf
        if o * p * 4 * self.nk4 < PARALLEL_WORK:
            f = jit_int8.loop("conv_image")
            for i in range(n):
                yi = y[i] if scale is None else y[0]
                yfi = yf[i] if scale is not None else yf[0]
                f(
                    xb[i], flip, zx8, *geo, oh, ow, cols, cols8, zplane,
                    self.x, self.nk4, self.rs, self.zr, self.kzs, av, mv, yi, yfi,
                )  # fmt: skip
            return out.reshape(n, o, oh, ow)
        # large: the windows here, the product split over the run's threads
        sums = np.empty(cols.shape[1], np.int32)
        cc = np.zeros_like(sums)
        rc = _wrap32(zx8 * self.kzs + (0 if add is None else av.astype(np.int64)))
        im2col, col_sums = jit_int8.loop("im2col4"), jit_int8.loop("col_sums")
        gemm = jit_int8.loop("gemm_int" if scale is None else "gemm_row_scaled")
        for i in range(n):
            im2col(xb[i], flip, zx8, *geo, oh, ow, cols, zplane)
            col_sums(cols8, p, sums)
            if scale is None:
                args = (1, self.x, cols8, self.nk4, self.rs, self.zr, rc, sums, cc, y[i], p)
            else:
                args = (self.x, cols8, self.nk4, self.rs, self.zr, rc, sums, cc, mv, yf[i], p)
            _run(gemm, args, o, p, 4 * self.nk4)
        return out.reshape(n, o, oh, ow)
