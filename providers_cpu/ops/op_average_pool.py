"""AveragePool on NumPy: dense separable window sums times a host-computed reciprocal count map."""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.nn import PoolSpec, avg_divisor, compute_dtype

from .. import jit
from .nn_cpu import pad_input, window_reduce


@kernel("AveragePool", since=(1, 7, 10, 11, 19, 22))
def average_pool(node, xp):
    spec = PoolSpec(node)
    include_pad = bool(node.attr("count_include_pad", 0))
    cache: dict = {}
    disjoint = (
        len(spec.kernel) == 2
        and tuple(spec.strides) == tuple(spec.kernel)
        and all(d == 1 for d in spec.dilations)
    )

    def run(x):
        in_sp = tuple(x.shape[2:])
        if disjoint and jit.ENABLED and x.dtype == np.float32 and x.ndim == 4 and x.size:
            y = _disjoint(x, in_sp)
            if y is not None:
                return (y,)
        cdt = compute_dtype(x.dtype)
        pb, pe, out, _ = spec.geometry(in_sp)
        key = (in_sp, cdt)
        inv = cache.get(key)
        if inv is None:
            inv = cache[key] = (1.0 / avg_divisor(spec, in_sp, include_pad)).astype(cdt)
        xc = x if x.dtype == cdt else x.astype(cdt)
        y = window_reduce(
            pad_input(xc, pb, pe, 0), spec.kernel, spec.strides, spec.dilations, out, np.add
        )
        y *= inv
        return (y if y.dtype == x.dtype else y.astype(x.dtype),)

    def _disjoint(x, in_sp):
        """Windows that tile the input with no padding (pool_loops), else None."""
        pb, pe, out, _ = spec.geometry(in_sp)
        kh, kw = spec.kernel
        if any(pb) or any(pe) or tuple(out) != (in_sp[0] // kh, in_sp[1] // kw) or 0 in out:
            return None
        from .pool_loops import average_disjoint

        n, c = x.shape[:2]
        y = np.empty((n, c, *out), np.float32)
        # the general path's divisor map at a full window, as float32
        inv = (1.0 / np.float64(kh * kw)).astype(np.float32)
        average_disjoint(
            np.ascontiguousarray(x).reshape(n * c, *in_sp), kh, kw, inv, y.reshape(n * c, *out)
        )
        return y

    return run
