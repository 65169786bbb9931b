"""Bit-exact block copies that avoid glibc's slow ``rep movsb`` distance on AMD Zen 3.

NumPy copies a contiguous run with ``memmove``. glibc's AVX2 ``memmove`` copies runs from
4 KB up to its non-temporal threshold (about 0.75 MB on this Zen 3) with ``rep movsb``,
which Zen 3 runs about ten times slower when the destination lies 1-63 bytes after the
source modulo 4096 (a 400 KB run: 138 us against 14; 64 bytes and more, or the
destination before the source, run at full speed). NumPy's allocations are only 16-byte
aligned, so which copies land there depends on where the heap put each array: YOLOv8n's
first channel Concat (three 400 KB blocks) met a distance of 16 run after run.

A run at that distance is copied instead through an integer ufunc (``np.positive`` on
unsigned views of the same bytes: NumPy's vectorised loop, no ``memmove``, every bit kept,
NaN payloads and -0 included): 16 us for the same 400 KB.
"""

from __future__ import annotations

import numpy as np

#: Runs in [REP_MIN, REP_MAX) bytes go to ``rep movsb``: glibc's AVX2 threshold (shorter runs
#: use vector moves) and a margin over its non-temporal threshold (streaming stores, fast at
#: any distance)
REP_MIN = 4096
REP_MAX = 1 << 20
_PAGE = 4096
_NEAR = 64  # distances measured slow: 16 (10x), 32 and 48 (up to 2x at 4 KB); 64 and up not

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def slow_distance(dst: int, src: int) -> bool:
    """Whether a ``memmove`` from address ``src`` to ``dst`` is at the slow distance."""
    return 0 < (dst - src) % _PAGE < _NEAR


def copy_run(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` for two C-contiguous arrays of the same shape and dtype, bit for bit,
    without ``memmove`` (the caller found the slow distance)."""
    ui = _UINT.get(src.dtype.itemsize)
    if ui is None:  # complex128 and other widths: bytes
        ui = np.uint8
    np.positive(src.reshape(-1).view(ui), out=dst.reshape(-1).view(ui))
