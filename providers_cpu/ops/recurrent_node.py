"""GRU's and LSTM's usual call (constant weights, no ``sequence_lens``, float32 X) in one
compiled call per direction range: the few-row input projection and the whole recurrence.

Imported only once ``jit.ENABLED`` has said numba is there. ``recurrent_jit.run``, the
general driver, spent about twenty NumPy calls and Python lines around the loops (shape
checks, states, lengths, views, closures), which on a one-step GRU (akiki VAD: H 128,
batch 1) was three times the loops' own 8 us. This path calls the same loops
(``recurrent_loops.project`` and ``gru_direction`` / ``lstm_direction``) on the same buffers
in the same order,
so its results are the general path's bit for bit; everything else goes there.
"""

from __future__ import annotations

import numpy as np

from .. import jit
from .recurrent_loops import gru_direction, lstm_direction, project

if not jit.ENABLED:  # reading it imports numba, or says why not
    raise ImportError("providers_cpu.ops.recurrent_node needs numba (see providers_cpu/jit.py)")
nb = jit.nb


@nb.njit(cache=True, nogil=True, boundscheck=False)
def gru_dirs(rows, W, bias, proj, do_project, R, rbh, lbr, clip, rev, layout, T, h, Y, d0, d1):
    """Directions ``d0..d1`` of a GRU over every step.

    rows [T*batch, input] (X's rows in X's order), W [dirs, 3H, input], bias [dirs, 3H]
    (the foldable biases, zeros if none), proj [dirs, T*batch, 3H] (the projections:
    written here when ``do_project``, else already there), R / rbh / lbr / clip as for
    ``gru_direction``, rev [dirs] (1: reverse), h [dirs, batch, H] (initial states, left
    final), Y the output, [T, dirs, batch, H] (layout 0) or [batch, T, dirs, H] (layout 1).
    """
    batch = h.shape[1]
    G = proj.shape[2]
    lens = np.full(batch, T, np.int64)
    none = np.empty(0, np.float32)
    for d in range(d0, d1):
        if do_project:
            project(W[d], rows, none, bias[d], proj[d])
        if layout == 0:
            xw = proj[d].reshape((T, batch, G))
            gru_direction(xw, R[d], rbh[d], lbr, clip, lens, rev[d] != 0, h[d], Y[:, d])
        else:
            xw = proj[d].reshape((batch, T, G)).transpose((1, 0, 2))
            ys = Y[:, :, d].transpose((1, 0, 2))
            gru_direction(xw, R[d], rbh[d], lbr, clip, lens, rev[d] != 0, h[d], ys)


@nb.njit(cache=True, nogil=True, boundscheck=False)
def lstm_dirs(rows, W, bias, proj, do_project, R, clip, input_forget, rev, layout, T, h, c, Y,
              d0, d1):  # fmt: skip
    """Directions ``d0..d1`` of an LSTM without peepholes over every step; as
    :func:`gru_dirs` (4H gates, iofc), with ``c`` [dirs, batch, H] the cell states."""
    batch = h.shape[1]
    G = proj.shape[2]
    lens = np.full(batch, T, np.int64)
    none = np.empty(0, np.float32)
    ok = True
    for d in range(d0, d1):
        if do_project:
            project(W[d], rows, none, bias[d], proj[d])
        r = rev[d] != 0
        if layout == 0:
            xw = proj[d].reshape((T, batch, G))
            ok &= lstm_direction(
                xw, R[d], none, False, none, clip, input_forget, lens, r, h[d], c[d], Y[:, d]
            )
        else:
            xw = proj[d].reshape((batch, T, G)).transpose((1, 0, 2))
            ys = Y[:, :, d].transpose((1, 0, 2))
            ok &= lstm_direction(
                xw, R[d], none, False, none, clip, input_forget, lens, r, h[d], c[d], ys
            )
    return ok
