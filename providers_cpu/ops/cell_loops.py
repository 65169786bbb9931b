"""The compiled loop of onnxep::LSTMCell (op_lstm_cell.py): one unrolled LSTM step's gates.

Imported only once ``jit.ENABLED`` has said numba is there and wanted. It uses
recurrent_loops' ``sigmoid32`` and ``tanh32`` (3e-7 relative; the LSTM kernels' own
functions), so an unrolled cell and an LSTM node compute their gates alike.
"""

from __future__ import annotations

from .. import jit
from .recurrent_loops import sigmoid32, tanh32

if not jit.ENABLED:  # reading it imports numba, or says why not
    raise ImportError("providers_cpu.ops.cell_loops needs numba (see providers_cpu/jit.py)")
nb = jit.nb

_CELL = {"contract"}


@nb.njit(cache=True, nogil=True, boundscheck=False, fastmath=_CELL, error_model="numpy")
def lstm_cell(a, b, c0, order, h, c):
    """Rows of ``a`` (+ ``b`` when it has rows) [batch, 4H] are the four gates, at the
    column blocks ``order`` = (input, forget, cell, output); ``c0`` [batch, H] the previous
    cell state. Writes ``c = f * c0 + i * g`` and ``h = o * tanh(c)``."""
    H = h.shape[1]
    pi, pf, pg, po = order[0] * H, order[1] * H, order[2] * H, order[3] * H
    summed = b.shape[0] > 0
    for r in range(a.shape[0]):
        ar = a[r]
        br = b[r] if summed else a[r]
        gi, gf, gg, go = ar[pi : pi + H], ar[pf : pf + H], ar[pg : pg + H], ar[po : po + H]
        bi, bf, bg, bo = br[pi : pi + H], br[pf : pf + H], br[pg : pg + H], br[po : po + H]
        cp, cr, hr = c0[r], c[r], h[r]
        if summed:
            for k in range(H):
                s = sigmoid32(gf[k] + bf[k]) * cp[k]
                cr[k] = s + sigmoid32(gi[k] + bi[k]) * tanh32(gg[k] + bg[k])
            for k in range(H):
                hr[k] = sigmoid32(go[k] + bo[k]) * tanh32(cr[k])
        else:
            for k in range(H):
                s = sigmoid32(gf[k]) * cp[k]
                cr[k] = s + sigmoid32(gi[k]) * tanh32(gg[k])
            for k in range(H):
                hr[k] = sigmoid32(go[k]) * tanh32(cr[k])


@nb.njit(cache=True, nogil=True, boundscheck=False, fastmath=_CELL, error_model="numpy")
def gru_cell(gi, gh, h0, offsets, h):
    """Rows of ``gi`` and ``gh`` hold the r, z and n blocks at ``offsets`` (those of ``gi``
    then of ``gh``); ``h0`` [batch, H] the previous state. Writes ``h = (1 - z) * n + z *
    h0`` with ``r``, ``z`` the logistic of the blocks' sums and ``n = tanh(gi_n + r *
    gh_n)`` (the reset gate scaling ``gh``'s block, as torch's GRU)."""
    H = h.shape[1]
    ir, iz, i_n = offsets[0], offsets[1], offsets[2]
    hr, hz, h_n = offsets[3], offsets[4], offsets[5]
    one = gi.dtype.type(1)
    for b in range(h.shape[0]):
        a, g, p, o = gi[b], gh[b], h0[b], h[b]
        for k in range(H):
            r = sigmoid32(a[ir + k] + g[hr + k])
            z = sigmoid32(a[iz + k] + g[hz + k])
            n = tanh32(a[i_n + k] + r * g[h_n + k])
            o[k] = (one - z) * n + z * p[k]
