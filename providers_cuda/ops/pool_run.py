"""The cuDNN pooling path the pool kernels share: plan per input shape, then cudnnPoolingForward.

A plan the pool cannot take (``conv_plan`` says why) or a dtype cuDNN is not used for
goes to the generic kernel, which is elementwise CuPy work (no cuBLAS): the step keeps
the capture safety the generic kernel declares.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .cudnn_run import PerShape, contiguous, padded


def pool_runner(
    xp: Any, op: str, name: str, plan: Callable[[tuple[int, ...]], Any], fallback: Callable
) -> Callable:
    """``run(x)`` for a pool whose geometry for an input shape is ``plan(shape)``."""
    from .. import dnn

    shapes = PerShape(op, name)

    def build(shape, dt):
        geom = plan(shape)
        if isinstance(geom, str):
            return geom
        return geom, dnn.Pooling(geom, dt)

    def run(x):
        dt = x.dtype.name
        if dt not in dnn.SUPPORTED_DTYPES:
            shapes.fell_back(f"dtype {dt}")
            return fallback(x)
        key = (tuple(x.shape), dt)
        entry = shapes.get(key, lambda: build(tuple(x.shape), dt))
        if isinstance(entry, str):
            shapes.fell_back(entry)
            return fallback(x)
        geom, pool = entry
        fill = -math.inf if geom.mode == "max" else 0.0
        xin = contiguous(xp, padded(xp, x, geom.pre_pad, fill), geom.x_shape)
        return (pool(xin).reshape(geom.out_shape),)

    run.cudnn = shapes
    return run
