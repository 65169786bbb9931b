"""onnxep::GRUCell(gi, gh, h_prev) -> h: one step of an unrolled GRU cell.

What ``fuse_gru_cell`` (providers/fusions/gru_cell.py) makes of the sixteen nodes a
tracing exporter writes per step of a GRU cell loop (six Slices of the two products,
two Adds and Sigmoids for the reset and update gates, the reset gate's Mul, an Add and
Tanh for the new gate, then ``(1 - z) * n + z * h_prev``). Attribute ``offsets`` gives
the column of the r, z and n blocks in ``gi`` then in ``gh``, ``hidden_size`` their
width.

- float32 with numba, rows without broadcasting: one compiled pass (cell_loops.py)
  with the LSTM kernels' logistic and tanh (recurrent_loops: 3e-7 relative against
  NumPy's, hence a tolerance-level fusion). Sixteen kernel calls and fifteen
  intermediate buffers become one call.
- anything else (numba off, operands that broadcast, another dtype): the nodes' own
  operations in NumPy, broadcasting as they did.
"""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel

from .. import jit
from .logistic import logistic

_F32 = np.dtype(np.float32)


def _numpy(gi, gh, h0, offsets, H):
    ir, iz, i_n, hr, hz, h_n = offsets

    def blk(x, at):
        return x[:, at : at + H]

    r = logistic(np.ascontiguousarray(blk(gi, ir) + blk(gh, hr)))
    z = logistic(np.ascontiguousarray(blk(gi, iz) + blk(gh, hz)))
    n = np.tanh(blk(gi, i_n) + r * blk(gh, h_n))
    one = np.asarray(1, dtype=z.dtype)
    return ((one - z) * n + z * h0).astype(np.result_type(gi, h0), copy=False)


def _fits(gi, gh, h0, offsets, H) -> bool:
    """Whether the compiled loop takes these operands: float32 rows, no broadcasting,
    every block inside its row."""
    if gi.dtype != _F32 or gh.dtype != _F32 or h0.dtype != _F32:
        return False
    if gi.ndim != 2 or gh.ndim != 2 or h0.shape != (gi.shape[0], H):
        return False
    if gh.shape[0] != gi.shape[0]:
        return False
    return max(offsets[:3]) + H <= gi.shape[1] and max(offsets[3:]) + H <= gh.shape[1]


@kernel("GRUCell", domain="onnxep", dtypes=("float", "double"))
def gru_cell(node, xp):
    offsets = tuple(int(k) for k in node.attr("offsets"))
    H = int(node.attr("hidden_size"))
    loop = None
    if jit.ENABLED:
        from .cell_loops import gru_cell as loop
    offs = np.array(offsets, np.int64)

    def run(gi, gh, h0):
        if loop is None or not _fits(gi, gh, h0, offsets, H):
            return (_numpy(gi, gh, h0, offsets, H),)
        h = np.empty(h0.shape, _F32)
        loop(np.ascontiguousarray(gi), np.ascontiguousarray(gh), np.ascontiguousarray(h0), offs, h)
        return (h,)

    return run
