"""One copy of a constant weight, and of its transpose, for every node that uses it.

An unrolled RNN applies one initializer at every time step: captcha-crnn's forty
``Gemm(x_t, W_ih, b, transB=1)`` nodes use two [400, 4096] weights. onnx-ir hands each
node its own array of an initializer (``TensorProtoTensor.numpy()`` copies), and a
kernel that lays the weight out once per node (Gemm's transposed copy, MatMul's
[N, K] copy for the few-rows loop) multiplied that again: 40 nodes kept 80 copies
of 6.5 MB. Nodes whose constants are equal byte for byte now share one
:class:`SharedWeight`, and with it each layout, made once on first use.

Equality is checked in full (a sample of the values only picks the candidates), so
two weights that merely look alike never share. The table holds its entries weakly:
a weight lives as long as a kernel that uses it.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

_lock = threading.Lock()
_table: dict[tuple, list[weakref.ref]] = {}


class SharedWeight:
    """A constant, C-contiguous, with its transpose made on first use."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self._transposed: np.ndarray | None = None
        self._layouts: dict = {}
        self._lock = threading.Lock()

    def layout(self, key, make) -> np.ndarray:
        """``make(array)``, made once for every user that asks with the same ``key`` (a
        kernel's own packing of the weight: weight_gemm.py's padded rows)."""
        got = self._layouts.get(key)
        if got is None:
            with self._lock:
                got = self._layouts.get(key)
                if got is None:
                    got = self._layouts[key] = make(self.array)
        return got

    @property
    def transposed(self) -> np.ndarray:
        """``array.T`` of a 2-D weight, C-contiguous (one copy for every user)."""
        t = self._transposed
        if t is None:
            with self._lock:
                t = self._transposed
                if t is None:
                    t = self._transposed = np.ascontiguousarray(self.array.T)
        return t


def _bytes(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


def sample_key(a: np.ndarray) -> tuple:
    """dtype, shape and 64 values spread over the array: the candidates' table key."""
    flat = _bytes(a)
    step = max(1, flat.size // 64)
    return (a.dtype.str, a.shape, flat[::step].tobytes())


def shared(const: np.ndarray) -> SharedWeight:
    """The :class:`SharedWeight` of every constant equal to ``const`` byte for byte."""
    a = np.ascontiguousarray(const)
    key = sample_key(a)
    with _lock:
        refs = _table.setdefault(key, [])
        refs[:] = [r for r in refs if r() is not None]
        for r in refs:
            w = r()
            if w is not None and np.array_equal(_bytes(w.array), _bytes(a)):
                return w
        w = SharedWeight(a)
        refs.append(weakref.ref(w))
        return w
