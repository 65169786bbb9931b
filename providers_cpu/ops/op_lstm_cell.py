"""onnxep::LSTMCell(gates, c_prev[, gates2]) -> (h, c): one step of an unrolled LSTM cell.

What ``fuse_lstm_cell`` (providers/fusions/lstm_cell.py) makes of the eleven nodes a
tracing exporter writes per step of a ``torch.nn.LSTMCell`` loop (Add of the two
products, Split in four, three Sigmoid, two Tanh, three Mul, one Add). Attribute
``gates`` gives the column block of each gate in (input, forget, cell, output) order.

- float32 with numba: one compiled pass (cell_loops.py) over the batch's rows, the
  products summed in the loop, the logistic and tanh of the LSTM kernels (recurrent_loops'
  rational tanh: 3e-7 relative against NumPy's, hence a tolerance-level fusion). An
  unrolled step's eleven kernel calls and ten intermediate buffers become one call.
- anything else (numba off, shapes that broadcast, another dtype): the nodes' own
  operations in NumPy, broadcasting as they did.
"""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel

from .. import jit
from .logistic import logistic

_F32 = np.dtype(np.float32)
_NONE = np.empty((0, 0), np.float32)


def _numpy(a, c0, b, order):
    g = a if b is None else a + b
    parts = np.split(g, 4, axis=-1)
    i, f, gg, o = (parts[k] for k in order)
    c = logistic(np.ascontiguousarray(f)) * c0 + logistic(np.ascontiguousarray(i)) * np.tanh(gg)
    c = c.astype(g.dtype, copy=False)
    h = (logistic(np.ascontiguousarray(o)) * np.tanh(c)).astype(g.dtype, copy=False)
    return h, c


def _fits(a, c0, b) -> bool:
    """Whether the compiled loop takes these operands: float32 rows with no broadcasting."""
    if a.dtype != _F32 or c0.dtype != _F32 or a.ndim != 2 or a.shape[1] % 4:
        return False
    if c0.shape != (a.shape[0], a.shape[1] // 4):
        return False
    return b is None or (b.dtype == _F32 and b.shape == a.shape)


@kernel("LSTMCell", domain="onnxep", dtypes=("float", "double"))
def lstm_cell(node, xp):
    order = tuple(int(k) for k in node.attr("gates", (0, 1, 2, 3)))
    loop = None
    if jit.ENABLED:
        from .cell_loops import lstm_cell as loop
    order_arr = np.array(order, np.int64)

    def run(a, c0, b=None):
        if loop is None or not _fits(a, c0, b):
            return _numpy(a, c0, b, order)
        h = np.empty(c0.shape, _F32)
        c = np.empty(c0.shape, _F32)
        loop(
            np.ascontiguousarray(a),
            _NONE if b is None else np.ascontiguousarray(b),
            np.ascontiguousarray(c0),
            order_arr,
            h,
            c,
        )
        return h, c

    return run
