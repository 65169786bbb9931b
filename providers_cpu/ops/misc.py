"""Shared helpers for the CPU-only string and ai.onnx.ml kernels."""

from __future__ import annotations

from typing import Any

import numpy as np


def to_str(v: Any) -> str:
    """Attribute and tensor strings arrive as ``str`` or UTF-8 ``bytes``."""
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


def str_list(v: Any) -> list[str]:
    if v is None:
        return []
    return [to_str(s) for s in (v.ravel().tolist() if isinstance(v, np.ndarray) else v)]


def as_str_array(x: Any) -> np.ndarray:
    """An object array of ``str``, whatever string flavour came in."""
    x = np.asarray(x)
    out = np.empty(x.shape, dtype=object)
    flat = out.reshape(-1)
    for i, s in enumerate(x.reshape(-1).tolist()):
        flat[i] = to_str(s)
    return out


def str_map(fn: Any, x: np.ndarray, otype: Any = object) -> np.ndarray:
    """Apply a Python function to every string of ``x`` (one vectorized ufunc)."""
    x = as_str_array(x)
    if x.size == 0:
        return np.empty(x.shape, dtype=otype)
    return np.frompyfunc(fn, 1, 1)(x).astype(otype)
