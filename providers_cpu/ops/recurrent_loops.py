"""Compiled whole-sequence loops of the CPU recurrent kernels (numba; see recurrent_jit.py).

Imported only once ``jit.ENABLED`` has said numba is there and wanted. Each loop runs
every time step of one direction in one call: the recurrent product, the gates and the
state update, with no Python between steps (the NumPy path pays one BLAS call and ten to
fifteen NumPy calls a step, about 1 us each, which was most of a small recurrence).

- **The recurrent product** ``h @ R^T`` is a loop over R in ONNX's own ``[gates*H, H]``
  layout: each output is a dot product over a contiguous row, computed for two rows of
  h and four outputs at a time (eight sums that LLVM keeps in vector registers, R's rows
  read once for both rows of h). Measured against OpenBLAS on one thread: [2, 256] x
  [256, 1024] 10 us (BLAS 19), [1, 128] x [128, 512] 2.4 us (2.7); with 8-bit weights
  converted in the loop 6.5 us (a quarter of the bytes). Only batches of eight and more
  rows are slower than BLAS here (8 rows: 10 against 6 us). These loops may reassociate
  the sums (``fastmath`` reassoc/contract only: no approximate division, NaN and inf
  kept): the order is fixed by the shapes, so results repeat run to run.
- **tanh and the logistic** are :func:`tanh32`, a rational approximation on a clamped
  input (pure arithmetic, which LLVM vectorises; numba's ``math.tanh`` is a scalar libm
  call, which made an earlier compiled cell 13x slower than NumPy's vectorised tanh), and
  ``sigmoid(x) = (tanh(x / 2) + 1) / 2`` (the NumPy path's identity).
- **DynamicQuantizeLSTM's hidden state** goes through uint8 per step and direction with
  exactly the float32 operations of op_dynamic_quantize_lstm's NumPy round trip
  (:func:`quantize_rows`, compiled without fastmath); its integers times the 8-bit
  weights, summed in float32, are scaled once per output.
"""

from __future__ import annotations

import numpy as np

from .. import jit

if not jit.ENABLED:  # reading it imports numba, or says why not
    raise ImportError("providers_cpu.ops.recurrent_loops needs numba (see providers_cpu/jit.py)")
nb = jit.nb

#: Products may be reassociated and contracted to FMA; no other fast-math license.
_SUMS = {"reassoc", "contract"}
_CELL = {"contract"}

# tanh(x) ~ x * P(x^2) / Q(x^2) on x clamped to [-9, 9] (tanh(9) rounds to 1 in
# float32). Coefficients fitted for this project (minimax relative error by Lawson's
# iteration on the linearised problem, then rounded to float32 one by one from the
# highest power down, refitting the others each time): 3.8e-8 relative in exact
# arithmetic. Evaluated in float32 with FMA, every 17th float32 in (0, 12] checked
# against float64 tanh: at most 3.0e-7 relative (4-5 units in the last place, near
# |x| = 7 where the result is just under 1; 3.3e-7 without FMA); see docs/cpu_kernels.md.
_P1 = np.float32(0.13085763156414032)
_P2 = np.float32(0.0031058788299560547)
_P3 = np.float32(1.1173414350196254e-05)
_P4 = np.float32(-2.0296814895459647e-08)
_P5 = np.float32(5.3093029972473005e-11)
_P6 = np.float32(-8.561655209663246e-14)
_Q1 = np.float32(0.46419093012809753)
_Q2 = np.float32(0.024502934888005257)
_Q3 = np.float32(0.00025488855317234993)
_ONE = np.float32(1.0)
_HALF = np.float32(0.5)
_NINE = np.float32(9.0)


@nb.njit(inline="always", fastmath=_CELL, nogil=True, error_model="numpy")
def tanh32(x):
    """tanh of a float32, to 3e-7 relative; NaN stays NaN, the result stays in [-1, 1]."""
    x = min(max(x, -_NINE), _NINE)
    u = x * x
    p = ((((_P6 * u + _P5) * u + _P4) * u + _P3) * u + _P2) * u + _P1
    p = p * u + _ONE
    q = ((_Q3 * u + _Q2) * u + _Q1) * u + _ONE
    y = x * p / q
    return min(max(y, -_ONE), _ONE)


@nb.njit(inline="always", fastmath=_CELL, nogil=True, error_model="numpy")
def sigmoid32(x):
    return _HALF * tanh32(_HALF * x) + _HALF


@nb.njit(cache=True, nogil=True, fastmath=_CELL, error_model="numpy")
def tanh_array(x, out):
    """:func:`tanh32` over an array (the tests' and the docs' error sweep)."""
    for j in range(x.shape[0]):
        out[j] = tanh32(x[j])


@nb.njit(cache=True, nogil=True, fastmath=_CELL, error_model="numpy")
def sigmoid_array(x, out):
    for j in range(x.shape[0]):
        out[j] = sigmoid32(x[j])


# The cell's elementwise passes: each a loop from 0 over one to four contiguous rows (a
# gate's slice of the buffer, a state), so that LLVM vectorises it: numba checks an index
# that might be negative, and an offset index (``a[2 * H + k]``) or a range from a
# runtime start kept the loops scalar, 8x slower; one loop over every gate and state at
# once met too many possibly aliasing arrays. ``clip`` is +inf when the node has none:
# min(max(x, -c), c) keeps x, NaN included (numba's max(x, y) is x when x is NaN).


@nb.njit(inline="always", fastmath=_CELL, nogil=True, error_model="numpy")
def _sigmoids(a, clip):
    for j in range(a.shape[0]):
        a[j] = sigmoid32(min(max(a[j], -clip), clip))


@nb.njit(inline="always", fastmath=_CELL, nogil=True, error_model="numpy")
def _tanhs(a, clip):
    for j in range(a.shape[0]):
        a[j] = tanh32(min(max(a[j], -clip), clip))


@nb.njit(inline="always", fastmath=_CELL, nogil=True, error_model="numpy")
def _add_row(a, x, sc, scaled):
    """a += x, or a = a * sc + x (the 8-bit product's scales)."""
    if scaled:
        for j in range(a.shape[0]):
            a[j] = a[j] * sc[j] + x[j]
    else:
        for j in range(a.shape[0]):
            a[j] += x[j]


@nb.njit(inline="always", nogil=True)
def _copy(dst, src):
    # an explicit loop: numba's slice assignment checks for overlap and may copy through
    # a temporary first
    for k in range(dst.shape[0]):
        dst[k] = src[k]


@nb.njit(inline="always", fastmath=_CELL, nogil=True, error_model="numpy")
def _peep(a, p, c):
    """a += p * c (a peephole)."""
    for k in range(a.shape[0]):
        a[k] += p[k] * c[k]


@nb.njit(cache=True, nogil=True, boundscheck=False, fastmath=_SUMS, error_model="numpy")
def matvec(R, j0, j1, hb, n, out):
    """out[i, j - j0] = sum_k hb[i, k] * R[j, k] for rows i < n and outputs j0 <= j < j1.

    ``R`` float32, int8 or int16 ([outputs, K], rows contiguous), ``hb`` float32 [>= n, K].
    Two rows of ``hb`` and four outputs at a time: eight sums, each row of R read once
    for both rows of hb; an odd last row eight outputs at a time.
    """
    K = hb.shape[1]
    i = 0
    while i + 2 <= n:
        ha = hb[i]
        hc = hb[i + 1]
        oa = out[i]
        oc = out[i + 1]
        j = j0
        while j + 4 <= j1:
            r0 = R[j]
            r1 = R[j + 1]
            r2 = R[j + 2]
            r3 = R[j + 3]
            s0 = s1 = s2 = s3 = np.float32(0.0)
            t0 = t1 = t2 = t3 = np.float32(0.0)
            for k in range(K):
                x = ha[k]
                y = hc[k]
                a0 = np.float32(r0[k])
                a1 = np.float32(r1[k])
                a2 = np.float32(r2[k])
                a3 = np.float32(r3[k])
                s0 += x * a0
                s1 += x * a1
                s2 += x * a2
                s3 += x * a3
                t0 += y * a0
                t1 += y * a1
                t2 += y * a2
                t3 += y * a3
            o = j - j0
            oa[o] = s0
            oa[o + 1] = s1
            oa[o + 2] = s2
            oa[o + 3] = s3
            oc[o] = t0
            oc[o + 1] = t1
            oc[o + 2] = t2
            oc[o + 3] = t3
            j += 4
        while j < j1:
            r0 = R[j]
            s0 = t0 = np.float32(0.0)
            for k in range(K):
                a0 = np.float32(r0[k])
                s0 += ha[k] * a0
                t0 += hc[k] * a0
            oa[j - j0] = s0
            oc[j - j0] = t0
            j += 1
        i += 2
    if i < n:  # the last, odd row: eight outputs at a time
        ha = hb[i]
        oa = out[i]
        j = j0
        while j + 8 <= j1:
            r0 = R[j]
            r1 = R[j + 1]
            r2 = R[j + 2]
            r3 = R[j + 3]
            r4 = R[j + 4]
            r5 = R[j + 5]
            r6 = R[j + 6]
            r7 = R[j + 7]
            s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = np.float32(0.0)
            for k in range(K):
                x = ha[k]
                s0 += x * np.float32(r0[k])
                s1 += x * np.float32(r1[k])
                s2 += x * np.float32(r2[k])
                s3 += x * np.float32(r3[k])
                s4 += x * np.float32(r4[k])
                s5 += x * np.float32(r5[k])
                s6 += x * np.float32(r6[k])
                s7 += x * np.float32(r7[k])
            o = j - j0
            oa[o] = s0
            oa[o + 1] = s1
            oa[o + 2] = s2
            oa[o + 3] = s3
            oa[o + 4] = s4
            oa[o + 5] = s5
            oa[o + 6] = s6
            oa[o + 7] = s7
            j += 8
        while j < j1:
            r0 = R[j]
            s0 = np.float32(0.0)
            for k in range(K):
                s0 += ha[k] * np.float32(r0[k])
            oa[j - j0] = s0
            j += 1


@nb.njit(cache=True, nogil=True, boundscheck=False, fastmath=_CELL, error_model="numpy")
def project(W, rows, scale, bias, out):
    """out[r, j] = (rows[r] . W[j]) * scale[j] + bias[j] (``scale`` or ``bias`` may be empty).

    The input projection of every step, for a few rows, where a BLAS call costs more
    than the products (and, with 8-bit W, reads a quarter of the bytes).
    """
    n, G = out.shape
    matvec(W, 0, G, rows, n, out)
    if scale.shape[0] or bias.shape[0]:
        sc = scale if scale.shape[0] else np.ones(G, np.float32)
        bs = bias if bias.shape[0] else np.zeros(G, np.float32)
        for r in range(n):
            o = out[r]
            for j in range(G):
                o[j] = o[j] * sc[j] + bs[j]


@nb.njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def quantize_rows(h, rows, n, hq):
    """h's rows ``rows[:n]`` through uint8 with dynamic quantisation's range rule.

    Writes each value's integer step (``q - zero_point``, a float) into ``hq[:n]`` and
    returns the scale: the float32 operations of op_dynamic_quantize_lstm's NumPy round
    trip one element at a time (the same integers and scale, bit for bit), so that
    ``hq * scale`` is its output. Returns -1 if a value is not finite (the caller then
    leaves the whole node to the NumPy path, with NumPy's NaN rules).
    """
    zero = np.float32(0.0)
    top = np.float32(255.0)
    lo = zero
    hi = zero
    H = h.shape[1]
    for i in range(n):
        hr = h[rows[i]]
        for k in range(H):
            v = hr[k]
            if v - v != zero:
                return np.float32(-1.0)
            if v < lo:
                lo = v
            if v > hi:
                hi = v
    scale = np.float32(1.0) if hi == lo else np.float32((hi - lo) / top)
    zp = zero - lo / scale
    zp = np.float32(np.rint(min(max(zp, zero), top)))
    qlo = -zp
    qhi = top - zp
    for i in range(n):
        hr = h[rows[i]]
        o = hq[i]
        for k in range(H):
            q = np.float32(np.rint(hr[k] / scale))
            if q < qlo:
                q = qlo
            if q > qhi:
                q = qhi
            o[k] = q + zero
    return scale


@nb.njit(inline="always", nogil=True)
def _running(lens, s, rows):
    """Rows whose sequence has a step ``s`` into ``rows``; their count."""
    n = 0
    for b in range(lens.shape[0]):
        if lens[b] > s:
            rows[n] = b
            n += 1
    return n


@nb.njit(inline="always", nogil=True)
def _zero_finished(lens, s, ys):
    """Outputs of step ``s`` of the rows that have ended are zeros (ONNX's padding)."""
    H = ys.shape[2]
    for b in range(lens.shape[0]):
        if lens[b] <= s:
            for k in range(H):
                ys[s, b, k] = 0


@nb.njit(inline="always", fastmath=_CELL, nogil=True, error_model="numpy")
def _lstm_cell(gi, cr, hr, P, clip, input_forget):
    """One row's gates ``gi`` [4H] (iofc, the products and biases summed) to its new states:
    ``cr`` and ``hr`` [H] in place (P as for :func:`lstm_direction`)."""
    H = hr.shape[0]
    one = np.float32(1.0)
    ai = gi[:H]
    ao = gi[H : 2 * H]
    af = gi[2 * H : 3 * H]
    ac = gi[3 * H :]
    peep = P.shape[0] > 0
    if peep:
        _peep(ai, P[:H], cr)
        _peep(af, P[2 * H :], cr)
    _sigmoids(ai, clip)
    if input_forget:
        for k in range(H):
            af[k] = one - ai[k]
    else:
        _sigmoids(af, clip)
    _tanhs(ac, clip)
    for k in range(H):
        cr[k] = af[k] * cr[k] + ai[k] * ac[k]
    if peep:
        _peep(ao, P[H : 2 * H], cr)
    _sigmoids(ao, clip)
    for k in range(H):
        hr[k] = ao[k] * tanh32(cr[k])


@nb.njit(cache=True, nogil=True, boundscheck=False, fastmath=_CELL, error_model="numpy")
def lstm_direction(xw, R, rs, quant, P, clip, input_forget, lens, rev, h, c, ys):
    """One direction of LSTM over every step; returns False if quantisation met a NaN/inf.

    xw [T, batch, 4H] (W x_t + Wb + Rb, steps in time order), R [4H, H] (iofc rows,
    float32 or 8/16-bit integers with per-output scales ``rs`` [4H] when ``quant``),
    P [3H] peepholes (i, o, f) or empty, lens [batch] (each row's length; the reverse
    direction runs t = len - 1 down to 0), h / c [batch, H] initial states, updated to
    each row's final ones, ys [T, batch, H] outputs (zeros past each row's length).
    """
    T, B, G = xw.shape
    H = h.shape[1]
    hb = np.empty((max(B, 1), H), np.float32)
    g = np.empty((max(B, 1), G), np.float32)
    sc = np.empty(G, np.float32)
    rows = np.empty(max(B, 1), np.int64)
    for s in range(T):
        _zero_finished(lens, s, ys)
        n = _running(lens, s, rows)
        if n == 0:
            continue
        if quant:
            scale = quantize_rows(h, rows, n, hb)
            if scale < 0:
                return False
            for j in range(G):
                sc[j] = scale * rs[j]
        else:
            for i in range(n):
                _copy(hb[i], h[rows[i]])
        matvec(R, 0, G, hb, n, g)
        for i in range(n):
            b = rows[i]
            t = lens[b] - 1 - s if rev else s
            x = xw[t, b]
            gi = g[i]
            _add_row(gi, x, sc, quant)
            _lstm_cell(gi, c[b], h[b], P, clip, input_forget)
            _copy(ys[t, b], h[b])
    return True


@nb.njit(cache=True, nogil=True, boundscheck=False, fastmath=_CELL, error_model="numpy")
def gru_direction(xw, R, rbh, lbr, clip, lens, rev, h, ys):
    """One direction of GRU over every step (default activations).

    xw [T, batch, 3H] (W x_t + Wb, plus Rb of z and r, and Rb of h unless ``lbr``),
    R [3H, H] (zrh rows), rbh [H] (Rb of h when ``lbr``: linear_before_reset multiplies
    it by r); lens, rev, h, ys as for :func:`lstm_direction`.
    """
    T, B, G = xw.shape
    H = h.shape[1]
    hb = np.empty((max(B, 1), H), np.float32)
    g = np.empty((max(B, 1), G), np.float32)
    rows = np.empty(max(B, 1), np.int64)
    no_scale = np.empty(0, np.float32)
    for s in range(T):
        _zero_finished(lens, s, ys)
        n = _running(lens, s, rows)
        if n == 0:
            continue
        for i in range(n):
            _copy(hb[i], h[rows[i]])
        matvec(R, 0, G if lbr else 2 * H, hb, n, g)
        for i in range(n):
            b = rows[i]
            t = lens[b] - 1 - s if rev else s
            x = xw[t, b]
            gi = g[i]
            zr = gi[: 2 * H]
            _add_row(zr, x[: 2 * H], no_scale, False)
            _sigmoids(zr, clip)
            r = gi[H : 2 * H]
            gh = gi[2 * H :]
            if lbr:
                xh = x[2 * H :]
                for k in range(H):
                    gh[k] = xh[k] + r[k] * (gh[k] + rbh[k])
            else:
                hi = hb[i]
                for k in range(H):
                    hi[k] = r[k] * hi[k]  # r * h, the h gate's recurrent input
        if not lbr:
            matvec(R[2 * H :], 0, H, hb, n, g[:, 2 * H :])
        for i in range(n):
            b = rows[i]
            t = lens[b] - 1 - s if rev else s
            gi = g[i]
            z = gi[:H]
            gh = gi[2 * H :]
            if not lbr:
                _add_row(gh, xw[t, b, 2 * H :], no_scale, False)
            _tanhs(gh, clip)
            hr = h[b]
            for k in range(H):
                hr[k] = gh[k] + z[k] * (hr[k] - gh[k])  # (1 - z) n + z h
            _copy(ys[t, b], hr)
    return True


@nb.njit(cache=True, nogil=True, boundscheck=False, fastmath=_CELL, error_model="numpy")
def rnn_direction(xw, R, clip, lens, rev, h, ys):
    """One direction of RNN with tanh: h = tanh(x_t W^T + h R^T + Wb + Rb)."""
    T, B, H = xw.shape
    hb = np.empty((max(B, 1), H), np.float32)
    g = np.empty((max(B, 1), H), np.float32)
    rows = np.empty(max(B, 1), np.int64)
    no_scale = np.empty(0, np.float32)
    for s in range(T):
        _zero_finished(lens, s, ys)
        n = _running(lens, s, rows)
        if n == 0:
            continue
        for i in range(n):
            _copy(hb[i], h[rows[i]])
        matvec(R, 0, H, hb, n, g)
        for i in range(n):
            b = rows[i]
            t = lens[b] - 1 - s if rev else s
            gi = g[i]
            _add_row(gi, xw[t, b], no_scale, False)
            _tanhs(gi, clip)
            _copy(h[b], gi)
            _copy(ys[t, b], gi)
    return True
