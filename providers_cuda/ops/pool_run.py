"""The cuDNN pooling path the pool kernels share: plan per input shape, then cudnnPoolingForward.

A plan the pool cannot take (``conv_plan`` says why) or a dtype cuDNN is not used for
goes to the generic kernel, which is elementwise CuPy work (no cuBLAS): the step keeps
the capture safety the generic kernel declares.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from . import conv_plan
from .cudnn_run import PerShape, build_refusal, contiguous, padded


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


def windowed_plan(kind: str, spec: Any, count_include_pad: bool = False) -> Callable:
    """``plan(shape)`` of MaxPool ("max") or AveragePool ("avg") from the node's PoolSpec."""

    def plan(shape):
        return conv_plan.pool_geometry_plan(
            kind,
            shape,
            kernel=spec.kernel,
            strides=spec.strides,
            pads_begin=spec.pb,
            pads_end=spec.pe,
            ceil_mode=spec.ceil_mode,
            auto_pad=spec.auto_pad,
            count_include_pad=count_include_pad,
        )

    return plan


def global_pool(node: Any, xp: Any, op: str, kind: str, fallback: Callable) -> Callable:
    """GlobalMaxPool ("max") / GlobalAveragePool ("avg"): one window over every spatial
    cell, or the generic kernel where cuDNN is not used for the node."""
    x = node.inputs[0] if node.inputs else None
    rank = x.rank if x is not None else None
    if build_refusal(node, op, None if rank is None else rank - 2):
        return fallback
    return pool_runner(
        xp, op, node.name, lambda shape: conv_plan.global_pool_plan(kind, shape), fallback
    )
