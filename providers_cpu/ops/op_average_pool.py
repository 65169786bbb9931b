"""AveragePool on NumPy: dense separable window sums times a host-computed reciprocal count map."""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.nn import PoolSpec, avg_divisor, compute_dtype

from .nn_cpu import pad_input, window_reduce


@kernel("AveragePool", since=(1, 7, 10, 11, 19, 22))
def average_pool(node, xp):
    spec = PoolSpec(node)
    include_pad = bool(node.attr("count_include_pad", 0))
    cache: dict = {}

    def run(x):
        in_sp = tuple(x.shape[2:])
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

    return run
