"""Whether a fused norm + GEMV node normalises in its GEMV's prologue on CUDA.

The unfused norm runs ``norm_rows`` when its operands are float32/float16 of one type,
gamma (and the norm's bias) one value per element of the last axis and the skip a
trailing block of x (``_norm_runners``); the prologue takes exactly those operands, C-
contiguous, so a node that normalises in its prologue gives the bits the two unfused
nodes give, and any other runs the two nodes' kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .norm_runners import fits_axes, trailing_rows
from .reduce_source import CTYPE


def prologue_skip_rows(
    x: Any, skip: Any, gamma: Any, nbias: Any, contiguous: Callable[[Any], bool]
) -> int | None:
    """Rows of ``skip`` (1 without one) when the prologue takes these operands, else None."""
    if x.ndim < 1 or x.dtype not in CTYPE or x.shape[-1] == 0:
        return None
    for a in (x, skip, gamma, nbias):
        if a is not None and (a.dtype != x.dtype or not contiguous(a)):
            return None
    last = x.ndim - 1
    if not fits_axes(gamma.shape, x.shape, last):
        return None
    if nbias is not None and not fits_axes(nbias.shape, x.shape, last):
        return None
    if skip is None:
        return 1
    rows = trailing_rows(skip.shape, x.shape)
    return None if rows is None else max(rows, 1)


def rows_of(x: Any) -> int:
    """Rows of x's last axis (x's leading dims multiplied)."""
    m = 1
    for d in x.shape[:-1]:
        m *= d
    return m
