"""DynamicQuantizeLSTM's whole-sequence loop on the 8-bit tiles (numba): AVX-512 VNNI, or
AVX2's exact widened product (jit_int8_avx2).

Imported only once ``jit_int8.tiles()`` has said the tiles run here. One call
(:func:`_lstm_node`) runs a node: X through uint8 once for the sequence, then per
direction the input projection of every step as one uint8 x int8 product on the tiles
(W packed into 64-column panels once per session), then each step's hidden state through
uint8 (:func:`quantize_rows_u8`, the NumPy round trip's integers) times R on the panel
tiles, in exact int32, scaled once per output and handed to recurrent_loops' LSTM cell.
The products are the integer ones onnxruntime's MLAS makes with the same instruction.
The float loop before this (recurrent_loops.lstm_direction with 8-bit weights) summed
the same integers in float32, exact while the sums stay under 2^24: its step's product
([2, 256] x [256, 1024]) took about 6.5 us, the panel tiles' 1.5.

numba's disk cache checks only the file that defines a compiled function, and these
loops compile in jit_int8's tiles and recurrent_loops' cell: :func:`loops` compiles them
under names that carry a digest of both files, so an edit there never runs a stale
cached loop.
"""

from __future__ import annotations

import hashlib
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from .. import jit, jit_int8
from . import recurrent_loops
from .recurrent_loops import _copy, _lstm_cell, _running, _zero_finished

nb = jit.nb
_CELL = {"contract"}
_loops: dict[str, SimpleNamespace] = {}


# exact float32 operations (no fast-math): the NumPy round trip's bits
@nb.njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def quantize_rows_u8(h, rows, n, hq, sums):
    """h's rows ``rows[:n]`` through uint8 with dynamic quantisation's range rule, as the
    tiles take them: ``hq[i, :H]`` the uint8 values (``clip(rint(h / scale) + zp, 0, 255)``,
    the integers of recurrent_loops.quantize_rows plus the zero point), ``sums[i]`` their
    sum. Returns (scale, zero point), or a scale of -1 if a value is not finite (the caller
    then leaves the node to the NumPy path, with NumPy's NaN rules)."""
    # the range over the bits ordered as integers (a float's bits xor 0x7fffffff where
    # negative sort as the floats do, NaN past the infinities): no early exit and no float
    # comparison, so the loop vectorizes
    mask = np.int32(0x7FFFFFFF)
    kmin = np.int32(0)  # the key of +0.0: the range always holds 0
    kmax = np.int32(0)
    H = h.shape[1]
    for i in range(n):
        hb = h[rows[i]].view(np.int32)
        for k in range(H):
            v = hb[k]
            key = v ^ ((v >> np.int32(31)) & mask)
            kmin = min(kmin, key)
            kmax = max(kmax, key)
    zero = np.float32(0.0)
    top = np.float32(255.0)
    if kmax >= np.int32(0x7F800000) or kmin <= np.int32(-0x7F800001):
        return np.float32(-1.0), zero
    bits = np.empty(2, np.int32)
    bits[0] = kmin ^ ((kmin >> np.int32(31)) & mask)
    bits[1] = kmax ^ ((kmax >> np.int32(31)) & mask)
    fl = bits.view(np.float32)
    lo = min(fl[0], zero)
    hi = max(fl[1], zero)
    scale = np.float32(1.0) if hi == lo else np.float32((hi - lo) / top)
    zp = zero - lo / scale
    zp = np.float32(np.rint(min(max(zp, zero), top)))
    for i in range(n):
        hr = h[rows[i]]
        o = hq[i]
        s = np.int32(0)
        for k in range(H):
            q = np.float32(np.rint(hr[k] / scale)) + zp
            q = min(max(q, zero), top)
            u = np.uint8(q)
            o[k] = u
            s += np.int32(u)
        sums[i] = s
    return scale, zp


def _lstm_direction_vnni(
    xq, xz, wy, wnk4, wzc, wcc, wmult, wbias, xw, xw2,
    ry, rnk4, rzc, rcc, rs, P, clip, input_forget, lens, rev, h, c, ys,
):  # fmt: skip
    """One direction of DynamicQuantizeLSTM; returns False if the hidden state met a NaN/inf.

    xq [T * batch, 4 wnk4] X's uint8 rows (zeros past the input size) less ``xz``; W
    packed (wy, wnk4, wzc, wcc: vnni_gemm.PackedB(panels=True)); ``wmult`` X's scale times
    W's per output and ``wbias`` Wb + Rb (both padded to the panels); ``xw`` [T, batch, 4H]
    the projection's buffer (``xw2`` the same as [T * batch, 4H]); R packed likewise with
    scales ``rs`` [4H]; P, clip, input_forget, lens, rev, h, c, ys as for
    recurrent_loops.lstm_direction.
    """
    TB = xq.shape[0]
    B = h.shape[0]
    G = rs.shape[0]
    T = ys.shape[0]
    xs = np.empty(TB, np.int32)
    for r in range(TB):
        row = xq[r]
        s = np.int32(0)
        for k in range(row.shape[0]):
            s += np.int32(row[k])
        xs[r] = s
    zx = np.full(TB, np.int32(xz), np.int32)
    rcx = np.zeros(TB, np.int32)
    _panels_float(xq, wy, wnk4, xs, zx, rcx, wzc, wcc, wmult, wbias, xw2, G, 0, TB, 0, G)  # noqa: F821
    nb_ = max(B, 1)
    hq = np.zeros((nb_, 4 * rnk4), np.uint8)
    hs = np.empty(nb_, np.int32)
    zh = np.empty(nb_, np.int32)
    rch = np.zeros(nb_, np.int32)
    gq = np.empty((nb_, G), np.int32)
    g = np.empty((nb_, G), np.float32)
    sc = np.empty(G, np.float32)
    rows = np.empty(nb_, np.int64)
    for s in range(T):
        _zero_finished(lens, s, ys)
        n = _running(lens, s, rows)
        if n == 0:
            continue
        scale, zp = quantize_rows_u8(h, rows, n, hq, hs)
        if scale < 0:
            return False
        for i in range(n):
            zh[i] = np.int32(zp)
        _panels_int(hq, ry, rnk4, hs, zh, rch, rzc, rcc, gq, G, 0, n, 0, G)  # noqa: F821
        for j in range(G):
            sc[j] = scale * rs[j]
        for i in range(n):
            b = rows[i]
            t = lens[b] - 1 - s if rev else s
            x = xw[t, b]
            gi = g[i]
            qi = gq[i]
            for j in range(G):
                gi[j] = np.float32(qi[j]) * sc[j] + x[j]
            _lstm_cell(gi, c[b], h[b], P, clip, input_forget)
            _copy(ys[t, b], h[b])
    return True


def _lstm_node(
    x, wy, wnk4, wzc, wcc, wsc, wbias, ry, rnk4, rzc, rcc, rsc, P, clip, input_forget,
    rev, h, c, Y, d0, d1,
):  # fmt: skip
    """Directions d0..d1 of a DynamicQuantizeLSTM node over full-length sequences, in one
    call: X (x [T, batch, input] float32) through uint8 with DynamicQuantizeLinear's rule
    (jit_int8's dq_uint8, bit for bit the NumPy kernel's; a zero range has scale 1), then
    :func:`_lstm_direction_vnni` per direction, the per-direction arrays stacked on their
    first axis (W's and R's panels, their zero-point terms and scales, the bias, P
    [dirs, 3H or 0], rev [dirs]); h, c [dirs, batch, H] the initial states, updated;
    Y [T, dirs, batch, H]. Returns -1 (nothing written) when X holds a NaN or infinity,
    0 when a hidden state stops being finite, 1 when done.
    """
    T, B, n_in = x.shape
    G = rsc.shape[1]
    flat = x.reshape(-1)
    q = np.empty(flat.shape[0], np.uint8)
    ok, xs, xz = _dq_uint8(flat, flat.view(np.int32), q)  # noqa: F821
    if not ok:
        return -1
    if xs == np.float32(0.0):
        xs = np.float32(1.0)
    TB = T * B
    if 4 * wnk4 == n_in:
        xq = q.reshape(TB, n_in)
    else:
        xq = np.zeros((TB, 4 * wnk4), np.uint8)
        qr = q.reshape(TB, n_in)
        for r in range(TB):
            for k in range(n_in):
                xq[r, k] = qr[r, k]
    lens = np.full(B, T, np.int64)
    mult = np.empty(wsc.shape[1], np.float32)
    proj = np.empty((TB, G), np.float32)
    for d in range(d0, d1):
        for j in range(mult.shape[0]):
            mult[j] = xs * wsc[d, j]
        done = _direction(  # noqa: F821
            xq, xz, wy[d], wnk4, wzc[d], wcc[d], mult, wbias[d], proj.reshape(T, B, G), proj,
            ry[d], rnk4, rzc[d], rcc[d], rsc[d], P[d], clip, input_forget, lens, rev[d],
            h[d], c[d], Y[:, d],
        )  # fmt: skip
        if not done:
            return 0
    return 1


def cache_digest() -> str:
    """What the loops' cache names carry: a digest of jit_int8.py and recurrent_loops.py."""
    h = hashlib.sha256(jit_int8.source_digest().encode())
    h.update(Path(recurrent_loops.__file__).read_bytes())
    return h.hexdigest()[:16]


def loops(isa: str | None = None) -> SimpleNamespace:
    """``quantize_rows_u8``, ``lstm_direction`` and ``lstm_node`` compiled (on first use) on
    ``isa``'s tiles (by default jit_int8.tiles()), the tiles with them."""
    isa = isa or jit_int8.tiles()
    if not isa:
        raise RuntimeError("recurrent_vnni.loops(): no 8-bit tiles on this CPU")
    found = _loops.get(isa)
    if found is None:
        # a namespace per ISA, where that ISA's copies look their callees up
        g = dict(globals())
        g["_panels_int"] = jit_int8.loop("panels_int", isa)
        g["_panels_float"] = jit_int8.loop("panels_float", isa)
        g["_dq_uint8"] = jit_int8.loop("dq_uint8")
        digest = cache_digest()
        opts = dict(cache=True, nogil=True, boundscheck=False, error_model="numpy")
        compiled = {}
        for name, src in (("_direction", _lstm_direction_vnni), ("_node", _lstm_node)):
            fn = types.FunctionType(src.__code__, g, src.__name__, src.__defaults__)
            # the cache's file name is made from the qualified name
            fn.__qualname__ = f"{src.__name__}_{isa}_{digest}"
            compiled[name] = g[name] = nb.njit(fastmath=_CELL, **opts)(fn)
        found = _loops[isa] = SimpleNamespace(
            quantize_rows_u8=quantize_rows_u8,
            lstm_direction=compiled["_direction"],
            lstm_node=compiled["_node"],
        )
    return found
