"""``w @ cols`` for a product of a few columns (a convolution over a short signal), compiled.

The VAD encoders' convolutions (silero, akiki) are products of 64-258 filters by 1-5
im2col columns: OpenBLAS's SGEMM packs both operands on every call and its kernels are
at their worst there ([128, 388] x [388, 3]: 29 us on one thread of the loaded 2-core
machine, its GEMV per column 15, this loop 9; in the models' convolutions, with the
im2col copy around it, 37 -> 31 us for akiki's first conv and 51 -> 38 us for silero's).
Here the columns are turned into rows (K x n values) and ``recurrent_loops.matvec``, the
recurrences' dot-product loop (two rows and four filters at a time), makes every output;
the result is transposed into place.

The route depends on the product's shape and dtype alone (float32, up to
``MAX_COLUMNS`` columns, numba present), never on timing; the sums are reassociated
(``fastmath`` reassoc/contract, as matvec), so the values agree with BLAS's within
float32 rounding, not bit for bit.
"""

from __future__ import annotations

import numpy as np

from .. import jit

#: Up to this many columns the compiled loop runs; from 8 on SGEMM's own kernels fit. One
#: column is BLAS's GEMV, which is as fast; below ``MIN_WEIGHTS`` weights neither gains.
MAX_COLUMNS = 6
MIN_WEIGHTS = 1 << 14

_loop = None


def applies(w: np.ndarray, n_cols: int) -> bool:
    """Whether ``w @ cols`` of ``n_cols`` columns runs here (shape and dtype only)."""
    return (
        1 < n_cols <= MAX_COLUMNS
        and w.size >= MIN_WEIGHTS
        and w.dtype == np.float32
        and w.ndim == 2
        and w.flags.c_contiguous
        and bool(jit.ENABLED)
    )


def product(w: np.ndarray, cols: np.ndarray, out: np.ndarray) -> None:
    """``out[:] = w @ cols`` (float32; ``cols`` [K, n] any strides, ``out`` [M, n])."""
    global _loop
    if _loop is None:
        _loop = _compile()
    _loop(w, cols, out)


def _compile():
    from .few_columns_loop import few_columns

    return few_columns
