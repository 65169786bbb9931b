"""Shared helpers for the quantization, training and random kernels.

Everything here works on the provider's array namespace ``xp``; host-side
metadata (dtypes, shapes, attribute values) uses NumPy and ml_dtypes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.dtypes import np_dtype

# Float8/float4/float6 targets: saturation clips to the largest finite value.
_FLOAT_TARGETS = {
    np.dtype(getattr(ml_dtypes, n))
    for n in (
        "float8_e4m3fn",
        "float8_e4m3fnuz",
        "float8_e5m2",
        "float8_e5m2fnuz",
        "float4_e2m1fn",
        "float6_e2m3fn",
        "float6_e3m2fn",
    )
    if hasattr(ml_dtypes, n)
}
# These have no Inf/NaN encoding that a non-saturating cast could fall back to.
_ALWAYS_SATURATE = {
    np.dtype(getattr(ml_dtypes, n))
    for n in ("float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn")
    if hasattr(ml_dtypes, n)
}


def int_range(dt: np.dtype) -> tuple[int, int]:
    """The representable range of an integer dtype, sub-byte ones included."""
    info = ml_dtypes.iinfo(dt) if np.dtype(dt).kind == "V" else np.iinfo(dt)
    return int(info.min), int(info.max)


def _is_int(dt: np.dtype) -> bool:
    dt = np.dtype(dt)
    if dt.kind in "iu":
        return True
    try:
        ml_dtypes.iinfo(dt)
    except (ValueError, TypeError):
        return False
    return True


def is_int_dtype(dt: np.dtype) -> bool:
    return _is_int(dt)


def onnx_dtype(elem: int, what: str) -> np.dtype:
    try:
        return np_dtype(int(elem))
    except ValueError:
        raise NotSupported(f"{what}: ONNX element type {elem} is not supported") from None


def saturate_cast(v: Any, dt: np.dtype, xp: Any, saturate: bool = True) -> Any:
    """Cast float ``v`` to quantized ``dt`` the way QuantizeLinear does.

    Integer targets round half to even and clip to the type's range; float8
    targets clip to the largest finite value when ``saturate`` (otherwise the
    cast itself produces Inf or NaN), float4/float6 always clip.
    """
    dt = np.dtype(dt)
    if _is_int(dt):
        lo, hi = int_range(dt)
        # fmax, not clip: NaN (x / 0, inf / inf) saturates to the minimum, as onnxruntime's
        # QuantizeLinear does (its clamp's max(x, lo) returns lo for NaN).
        v = xp.minimum(xp.fmax(xp.round(v), lo), hi)
        # Sub-byte ml_dtypes convert from int32 reliably, and from float by truncation.
        if dt.itemsize <= 1 and dt.kind == "V":
            v = v.astype(xp.int32)
        return v.astype(dt)
    if dt in _FLOAT_TARGETS:
        if saturate or dt in _ALWAYS_SATURATE:
            m = float(ml_dtypes.finfo(dt).max)
            v = xp.clip(v, -m, m)
        return v.astype(dt)
    return v.astype(dt)


def expand_param(p: Any, x_shape: Sequence[int], axis: int, block_size: int, xp: Any) -> Any:
    """Reshape or repeat a scale/zero-point so it broadcasts against ``x``.

    Per-tensor parameters (scalar or one element) broadcast as they are; a
    1-D parameter along ``axis`` gets singleton dims around it; a blocked one
    repeats each entry ``block_size`` times along ``axis`` and is cut to size.
    """
    rank = len(x_shape)
    if p.ndim == 0 or (p.ndim == 1 and p.shape[0] == 1 and block_size <= 0):
        return p.reshape(())
    axis = axis % rank
    if p.ndim == 1 and rank != 1 and block_size <= 0:
        shape = [1] * rank
        shape[axis] = p.shape[0]
        return p.reshape(tuple(shape))
    if p.ndim == 1 and rank == 1 and block_size <= 0:
        return p
    if block_size <= 0:
        block_size = math.ceil(x_shape[axis] / p.shape[axis])
    p = xp.repeat(p, block_size, axis=axis)
    if p.shape[axis] != x_shape[axis]:
        idx = [slice(None)] * rank
        idx[axis] = slice(0, x_shape[axis])
        p = p[tuple(idx)]
    return p


def to_float(x: Any, dt: Any) -> Any:
    """Widen ``x`` (any quantized type) to float ``dt``."""
    x_dt = np.dtype(x.dtype)
    if x_dt.kind == "V" and _is_int(x_dt):
        # Sub-byte integers widen through int32 (their float casts are exact anyway).
        return x.astype(np.int32).astype(dt)
    return x.astype(dt)


# --- convolution helper for ConvInteger / QLinearConv ---------------------------------


def conv_params(node: Any, w_shape: Sequence[int] | None, nspatial: int | None) -> dict:
    """Parse Conv-style attributes once; kernel shape comes from W when not given."""
    ks = node.attr("kernel_shape", None)
    if ks is None and w_shape is not None and all(isinstance(d, int) for d in w_shape[2:]):
        ks = list(w_shape[2:])
    n = len(ks) if ks is not None else nspatial
    return {
        "kernel_shape": list(ks) if ks is not None else None,
        "strides": list(node.attr("strides", None) or ([1] * n if n else [])),
        "dilations": list(node.attr("dilations", None) or ([1] * n if n else [])),
        "pads": list(node.attr("pads", None) or ([0] * (2 * n) if n else [])),
        "auto_pad": _s(node.attr("auto_pad", "NOTSET")),
        "group": int(node.attr("group", 1)),
    }


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _resolve_pads(
    in_sp: Sequence[int], ks: Sequence[int], st: Sequence[int], dl: Sequence[int], p: dict
) -> list[int]:
    n = len(in_sp)
    auto = p["auto_pad"]
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begins, ends = [], []
        for i in range(n):
            out = -(-in_sp[i] // st[i])
            total = max(0, (out - 1) * st[i] + (ks[i] - 1) * dl[i] + 1 - in_sp[i])
            small, big = total // 2, total - total // 2
            if auto == "SAME_UPPER":
                begins.append(small)
                ends.append(big)
            else:
                begins.append(big)
                ends.append(small)
        return begins + ends
    if auto == "VALID":
        return [0] * (2 * n)
    pads = p["pads"] or [0] * (2 * n)
    return list(pads)


def conv_nd(x: Any, w: Any, p: dict, xp: Any) -> Any:
    """Grouped N-D convolution by im2col and one batched matmul.

    ``x`` is (N, C, *spatial), ``w`` (M, C/group, *kernel); both already in
    the accumulation dtype. Loops run over kernel offsets only.
    """
    n_batch, c = x.shape[0], x.shape[1]
    m = w.shape[0]
    ks = list(w.shape[2:])
    nsp = len(ks)
    st = p["strides"] or [1] * nsp
    dl = p["dilations"] or [1] * nsp
    in_sp = list(x.shape[2:])
    pads = _resolve_pads(in_sp, ks, st, dl, p)
    if any(pads):
        widths = [(0, 0), (0, 0)] + [(pads[i], pads[i + nsp]) for i in range(nsp)]
        x = xp.pad(x, widths)
    padded = list(x.shape[2:])
    out_sp = [(padded[i] - (ks[i] - 1) * dl[i] - 1) // st[i] + 1 for i in range(nsp)]
    cols = []
    for offs in np.ndindex(*ks):
        idx = [slice(None), slice(None)]
        for i in range(nsp):
            start = offs[i] * dl[i]
            idx.append(slice(start, start + st[i] * (out_sp[i] - 1) + 1, st[i]))
        cols.append(x[tuple(idx)])
    k = int(np.prod(ks)) if ks else 1
    o = int(np.prod(out_sp)) if out_sp else 1
    g = p["group"]
    cg = c // g
    # (N, C, K, *out) -> (N, G, Cg*K, O)
    col = xp.stack(cols, axis=2).reshape(n_batch, g, cg * k, o)
    wm = w.reshape(g, m // g, cg * k)
    y = xp.matmul(wm[None], col)  # (N, G, M/G, O)
    return y.reshape((n_batch, m, *out_sp))


# --- host random numbers for the Random* / Bernoulli / Multinomial kernels -------------


class HostRng:
    """A NumPy generator owned by one node, safe to share between threads.

    With a ``seed`` attribute the node draws the same sequence in every
    session (as onnxruntime does: one seeded generator per kernel, advanced
    by each run); without one it is seeded from the OS.
    """

    def __init__(self, seed: float | None) -> None:
        import threading

        if seed is not None and not math.isnan(float(seed)):
            self.gen = np.random.default_rng(int(seed))
        else:
            self.gen = np.random.default_rng()
        self.lock = threading.Lock()

    def uniform(self, shape: Sequence[int], low: float = 0.0, high: float = 1.0) -> np.ndarray:
        with self.lock:
            return self.gen.uniform(low, high, tuple(int(d) for d in shape))

    def normal(self, shape: Sequence[int], mean: float = 0.0, scale: float = 1.0) -> np.ndarray:
        with self.lock:
            return self.gen.normal(mean, scale, tuple(int(d) for d in shape))


def random_dtype(node: Any, default: Any) -> np.dtype | None:
    """The ``dtype`` attribute (an ONNX element type), else ``default``."""
    elem = node.attr("dtype", None)
    if elem is None or int(elem) == 0:
        return None if default is None else np.dtype(default)
    return onnx_dtype(int(elem), f"{node.op_type} dtype")


def like_dtype(fixed: np.dtype | None, x_dtype: Any) -> np.dtype:
    """The *Like ops' output type: ``dtype`` if set, else the input's when it is a float."""
    if fixed is not None:
        return fixed
    dt = np.dtype(x_dtype)
    # Random floats cannot take a string, bool or integer input's type.
    return dt if dt.kind == "f" or dt.name == "bfloat16" else np.dtype(np.float32)
