"""Which norm nodes take the CUDA ``norm_rows`` kernel (``norm_cuda``), and the callables.

float32/float16 nodes whose operands all have X's type take the kernel when
their scale (and bias) hold one value per normalised element and a skip
input is a trailing block of X (broadcast over leading dims). Everything
else, including double statistics (stash_type=11), runs the generic kernel
on the device. The decision is made once per input shape and kept.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from onnxep.providers.node import NodeInfo

from . import reduce_cuda as K
from .norm_cuda import RMS, NormKernel, NormKind, NormLaunch

Runner = Callable[..., tuple]
F32 = np.dtype(np.float32)


def declared_dtype(node: NodeInfo, j: int, default: np.dtype | None = None) -> np.dtype | None:
    v = node.outputs[j] if j < len(node.outputs) else None
    return default if v is None or v.dtype is None else np.dtype(v.dtype)


def fits_axes(shape: tuple[int, ...], target: tuple[int, ...], a: int) -> bool:
    """Whether an operand of ``shape`` holds exactly one value per element of ``target``'s
    dims ``a..`` (leading 1s allowed) and so broadcasts without changing the output."""
    if len(shape) > len(target):
        return False
    padded = (1,) * (len(target) - len(shape)) + tuple(shape)
    return all(d == 1 for d in padded[:a]) and padded[a:] == tuple(target[a:])


def trailing_rows(shape: tuple[int, ...], target: tuple[int, ...]) -> int | None:
    """How many rows of ``target``'s last axis an operand of ``shape`` holds when it is a
    trailing block of ``target`` (broadcast over the leading dims, as x + skip broadcasts),
    else None."""
    if not shape or not target or len(shape) > len(target) or shape[-1] != target[-1]:
        return None
    padded = (1,) * (len(target) - len(shape)) + tuple(shape)
    lead = 0
    while lead < len(padded) and padded[lead] == 1:
        lead += 1
    if padded[lead:] != tuple(target[lead:]):
        return None
    return math.prod(padded[:-1])


def _meta(a: Any) -> tuple | None:
    return None if a is None else (a.shape, a.dtype)


def axis_norm_runner(node: NodeInfo, xp: Any, general: Runner, kind: NormKind) -> Runner:
    """SimplifiedLayerNormalization(X, scale) -> (Y[, inv_std_var]) with ``kind`` RMS, or
    LayerNormalization(X, Scale[, B]) -> (Y[, Mean, InvStdDev]), over dims ``axis..``."""
    axis = int(node.attr("axis", -1))
    eps = np.float32(node.attr("epsilon", 1e-5))
    dtypes = K.dtypes_for(node.input_dtype(0))
    if int(node.attr("stash_type", 1)) == 11 or not dtypes:
        return general  # double statistics, or a dtype the kernel lacks
    layer = kind.centered
    y_decl = declared_dtype(node, 0)
    if layer:  # (Y, Mean, InvStdDev): both statistics in one type, as on the CPU
        want = (node.has_output(1), node.has_output(2))
        stat = declared_dtype(node, 1, declared_dtype(node, 2, F32))
        stat_dtypes = (stat, stat)
        width = 3 if any(want) else 1
    else:  # (Y, inv_std_var)
        want = (False, node.has_output(1))
        stat_dtypes = (F32, declared_dtype(node, 1, F32))
        width = max(node.num_outputs, 1)
    kern = NormKernel(dtypes, kind, eps)
    contiguous = K.contiguity_test(xp)

    def plan_for(xm: tuple, wm: tuple, bm: tuple | None) -> NormLaunch | None:
        (xs, xdt), (ws, wdt) = xm, wm
        r = len(xs)
        a = axis + r if axis < 0 else axis
        if xdt not in kern.fns or wdt != xdt or (y_decl is not None and y_decl != xdt):
            return None  # mixed types: the generic kernel's promotions
        if bm is not None and (bm[1] != xdt or not fits_axes(bm[0], xs, a)):
            return None
        if not 0 <= a < r or not fits_axes(ws, xs, a):
            return None  # the generic kernel raises, or broadcasts the scale
        return kern.prepare(math.prod(xs[:a]), math.prod(xs[a:]), xdt)

    plans = K.PlanCache(plan_for)
    if (metas := K.static_metas(node, (0, 1, 2))) is not None and None not in metas[:2]:
        plans.prewarm(*metas)

    def run(x: Any, scale: Any, bias: Any = None) -> tuple:
        launch = plans((x.shape, x.dtype), (scale.shape, scale.dtype), _meta(bias))
        if launch is None:
            return general(x, scale) if bias is None else general(x, scale, bias)
        if not (contiguous(x) and contiguous(scale) and (bias is None or contiguous(bias))):
            x, scale, bias = (_dense(xp, a) for a in (x, scale, bias))
        y = xp.empty(x.shape, x.dtype)
        mean = inv = None
        if want[0] or want[1]:
            a = axis + x.ndim if axis < 0 else axis
            stat_shape = x.shape[:a] + (1,) * (x.ndim - a)
            mean = xp.empty(stat_shape, F32) if want[0] else None
            inv = xp.empty(stat_shape, F32) if want[1] else None
        launch(x, scale, y, beta=bias, mean_out=mean, inv_out=inv)
        if layer:
            return (y, _as(mean, stat_dtypes[0]), _as(inv, stat_dtypes[1]))[:width]
        return (y, _as(inv, stat_dtypes[1]), *(None,) * (width - 2))[:width]

    return run


def skip_norm_runner(node: NodeInfo, xp: Any, general: Runner, kind: NormKind) -> Runner:
    """SkipSimplifiedLayerNormalization(input, skip, gamma[, bias]) with ``kind`` RMS, or
    SkipLayerNormalization(input, skip, gamma[, beta[, bias]]), -> (output, mean,
    inv_std_var, input_skip_bias_sum), each only where the node has it (mean is 0 for RMS)."""
    eps = np.float32(node.attr("epsilon", 1e-12))
    dtypes = K.dtypes_for(node.input_dtype(0))
    if not dtypes:
        return general
    want = [node.has_output(j) for j in range(4)]
    stat_dtypes = [declared_dtype(node, j, F32) for j in (1, 2)]
    width = max(node.num_outputs, 1)
    kern = NormKernel(dtypes, kind, eps)
    contiguous = K.contiguity_test(xp)

    def plan_for(xm: tuple, sm: tuple, *row_vectors: tuple | None) -> NormLaunch | None:
        (xs, xdt), (ss, sdt) = xm, sm
        given = [m for m in row_vectors if m is not None]
        if xdt not in kern.fns or not xs or any(d != xdt for d in (sdt, *(m[1] for m in given))):
            return None  # mixed types: the generic kernel's promotions
        skip_rows = trailing_rows(ss, xs)
        if skip_rows is None or not all(fits_axes(m[0], xs, len(xs) - 1) for m in given):
            return None  # the generic kernel broadcasts (or refuses) these
        return kern.prepare(math.prod(xs[:-1]), xs[-1], xdt, max(skip_rows, 1))

    plans = K.PlanCache(plan_for)
    slots = (0, 1, 2, None, 3) if kind is RMS else (0, 1, 2, 3, 4)  # x skip gamma beta bias
    if (metas := K.static_metas(node, slots)) is not None and None not in metas[:3]:
        plans.prewarm(*metas)

    def run(x: Any, skip: Any, gamma: Any, *rest: Any) -> tuple:
        beta, bias = (None, rest[0] if rest else None) if kind is RMS else (*rest, None, None)[:2]
        launch = plans(_meta(x), _meta(skip), _meta(gamma), _meta(beta), _meta(bias))
        if launch is None:
            return general(x, skip, gamma, *rest)
        arrays = (x, skip, gamma, beta, bias)
        if not all(a is None or contiguous(a) for a in arrays):
            x, skip, gamma, beta, bias = (_dense(xp, a) for a in arrays)
        y = xp.empty(x.shape, x.dtype)
        mean = inv = total = None
        if want[1] or want[2]:
            stat_shape = x.shape[:-1] + (1,)
            mean = xp.empty(stat_shape, F32) if want[1] else None
            inv = xp.empty(stat_shape, F32) if want[2] else None
        if want[3]:
            total = xp.empty(x.shape, x.dtype)
        launch(x, gamma, y, beta, skip, bias, total, mean, inv)
        return (y, _as(mean, stat_dtypes[0]), _as(inv, stat_dtypes[1]), total)[:width]

    return run


def _dense(xp: Any, a: Any) -> Any:
    return None if a is None else xp.ascontiguousarray(a)


def _as(a: Any, dtype: np.dtype) -> Any:
    return a if a is None or a.dtype == dtype else a.astype(dtype)
