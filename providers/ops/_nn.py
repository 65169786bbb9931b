"""Shared helpers for convolution, pooling, image and signal kernels.

Geometry (pads, output sizes) is computed on the host with plain Python ints;
tensor work goes through the provider's namespace ``xp`` with functions that
NumPy and CuPy share.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence

import numpy as np

from onnxep.errors import NotSupported

# Dtypes BLAS and the ufuncs handle natively; anything else is computed in float32.
_NATIVE_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def compute_dtype(dt) -> np.dtype:
    """The dtype to compute a floating kernel in: float16/bfloat16/float8 go through float32."""
    dt = np.dtype(dt)
    return dt if dt in _NATIVE_FLOATS else np.dtype(np.float32)


def spatial_attrs(node, nsp: int, kernel: Sequence[int] | None):
    """strides, dilations and explicit pads (begin, end) with ONNX defaults."""
    strides = list(node.attr("strides", None) or [1] * nsp)
    dilations = list(node.attr("dilations", None) or [1] * nsp)
    pads = list(node.attr("pads", None) or [0] * (2 * nsp))
    if len(strides) != nsp or len(dilations) != nsp or len(pads) != 2 * nsp:
        raise NotSupported(
            f"{node.op_type}: strides/dilations/pads do not match {nsp} spatial dims"
        )
    return strides, dilations, pads[:nsp], pads[nsp:]


def auto_pad_of(node) -> str:
    ap = node.attr("auto_pad", "NOTSET")
    if isinstance(ap, bytes):
        ap = ap.decode()
    if ap not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        raise NotSupported(f"{node.op_type}: auto_pad {ap!r} is not an ONNX value")
    return ap


def str_attr(node, name: str, default: str) -> str:
    v = node.attr(name, default)
    return v.decode() if isinstance(v, bytes) else v


def resolve_pads(auto_pad, in_sp, kernel, strides, dilations, pb, pe):
    """Explicit (begin, end) pads for ``auto_pad`` (Conv and pooling rules)."""
    if auto_pad == "NOTSET":
        return list(pb), list(pe)
    if auto_pad == "VALID":
        return [0] * len(in_sp), [0] * len(in_sp)
    b, e = [], []
    for n, k, s, d in zip(in_sp, kernel, strides, dilations):
        out = -(-n // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - n)
        small, big = total // 2, total - total // 2
        if auto_pad == "SAME_UPPER":
            b.append(small)
            e.append(big)
        else:
            b.append(big)
            e.append(small)
    return b, e


def pool_geometry(in_sp, kernel, strides, dilations, pb, pe, ceil_mode, auto_pad="NOTSET"):
    """Output sizes and the extra end padding ceil_mode needs (beyond ``pe``)."""
    out, extra = [], []
    for n, k, s, d, b, e in zip(in_sp, kernel, strides, dilations, pb, pe):
        dk = (k - 1) * d + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-n // s)
        elif auto_pad == "VALID":
            o = (n - dk) // s + 1 if not ceil_mode else -(-(n - dk) // s) + 1
        else:
            span = n + b + e - dk
            o = (-(-span // s) if ceil_mode else span // s) + 1
            # A window may not start inside the end padding.
            if ceil_mode and (o - 1) * s >= n + b:
                o -= 1
        o = max(o, 0)
        out.append(o)
        extra.append(max(0, (o - 1) * s + dk - (n + b + e)))
    return out, extra


def window_slices(kernel, strides, dilations, out) -> Iterator[tuple[tuple[int, ...], tuple]]:
    """(kernel position, spatial slices) for every position of the kernel window."""
    for kpos in itertools.product(*(range(k) for k in kernel)):
        sl = tuple(
            slice(k * d, k * d + (o - 1) * s + 1, s)
            for k, d, s, o in zip(kpos, dilations, strides, out)
        )
        yield kpos, sl


def pad_spatial(xp, x, pb, pe, value=0):
    """Pad the trailing spatial dims of ``x`` (after N and C)."""
    if not any(pb) and not any(pe):
        return x
    widths = [(0, 0)] * (x.ndim - len(pb)) + list(zip(pb, pe))
    return xp.pad(x, widths, mode="constant", constant_values=value)


def lowest(dt):
    dt = np.dtype(dt)
    if dt.kind in "iu":
        return np.iinfo(dt).min
    if dt.kind == "b":
        return False
    return -np.inf


def im2col(xp, xpad, kernel, strides, dilations, out):
    """Stack the kernel-offset views of a padded input: (N, C, prod(kernel), *out)."""
    views = [
        xpad[(slice(None), slice(None), *sl)]
        for _, sl in window_slices(kernel, strides, dilations, out)
    ]
    return xp.stack(views, axis=2)


def prod(xs) -> int:
    return int(math.prod(xs))


class PoolSpec:
    """A pooling node's static attributes, and its per-input-shape geometry."""

    def __init__(self, node, rank_hint: int | None = None):
        self.kernel = list(node.attr("kernel_shape"))
        nsp = len(self.kernel)
        self.strides, self.dilations, self.pb, self.pe = spatial_attrs(node, nsp, self.kernel)
        self.auto_pad = auto_pad_of(node)
        self.ceil_mode = bool(node.attr("ceil_mode", 0))
        self._cache: dict = {}

    def geometry(self, in_sp):
        """(pads begin, pads end incl. ceil extra, output sizes, explicit pads end)."""
        key = tuple(in_sp)
        g = self._cache.get(key)
        if g is None:
            pb, pe = resolve_pads(
                self.auto_pad, in_sp, self.kernel, self.strides, self.dilations, self.pb, self.pe
            )
            out, extra = pool_geometry(
                in_sp,
                self.kernel,
                self.strides,
                self.dilations,
                pb,
                pe,
                self.ceil_mode,
                self.auto_pad,
            )
            g = (pb, [e + x for e, x in zip(pe, extra)], out, pe)
            self._cache[key] = g
        return g


def pool_windows(xpad, spec: PoolSpec, out):
    """The strided view of ``xpad`` for each kernel position."""
    for kpos, sl in window_slices(spec.kernel, spec.strides, spec.dilations, out):
        yield kpos, xpad[(Ellipsis, *sl)]


def avg_divisor(spec: PoolSpec, in_sp, count_include_pad: bool) -> np.ndarray:
    """Per-output-position element counts for AveragePool, computed on the host.

    Explicit pads count when ``count_include_pad``; the extra cells ceil_mode
    adds past the end padding never count.
    """
    pb, pe_full, out, pe = spec.geometry(in_sp)
    ones = np.ones(tuple(in_sp), dtype=np.float64)
    fill = 1.0 if count_include_pad else 0.0
    mask = np.pad(ones, list(zip(pb, pe)), constant_values=fill)
    extra = [f - e for f, e in zip(pe_full, pe)]
    mask = np.pad(mask, [(0, x) for x in extra], constant_values=0.0)
    cnt = np.zeros(tuple(out), dtype=np.float64)
    for _, v in pool_windows(mask, spec, out):
        cnt += v
    return cnt


def col2im_add(xp, cols, kernel, strides, dilations, blocks, full_sp):
    """Scatter-add ``cols`` (N, C, prod(kernel), *blocks) into a zero (N, C, *full_sp) image."""
    n, c = cols.shape[:2]
    img = xp.zeros((n, c, *full_sp), dtype=cols.dtype)
    for i, (_, sl) in enumerate(window_slices(kernel, strides, dilations, blocks)):
        img[(slice(None), slice(None), *sl)] += cols[:, :, i]
    return img


def crop_spatial(xp, y, pb, pe):
    """Remove ``pb``/``pe`` from the spatial dims; a negative amount pads with zeros."""
    if any(p < 0 for p in (*pb, *pe)):
        y = pad_spatial(xp, y, [max(0, -p) for p in pb], [max(0, -p) for p in pe])
        pb = [max(0, p) for p in pb]
        pe = [max(0, p) for p in pe]
    sl = tuple(slice(b, y.shape[2 + i] - e) for i, (b, e) in enumerate(zip(pb, pe)))
    return y[(slice(None), slice(None), *sl)]
