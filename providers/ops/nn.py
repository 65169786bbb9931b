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

from onnxep.errors import InvalidArgument, NotSupported

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


def conv_out_dims(op, in_sp, pb, pe, kernel, dilations, strides) -> tuple[int, ...]:
    """Conv's output sizes; an input shorter than the dilated kernel (with its pads) is an
    error naming the axis, as onnxruntime's "Invalid input shape" is, not an empty output."""
    out = []
    for axis, (n, a, e, k, d, s) in enumerate(zip(in_sp, pb, pe, kernel, dilations, strides)):
        span = (k - 1) * d + 1
        if n + a + e < span:
            raise InvalidArgument(
                f"{op}: the input's spatial axis {axis + 2} has {n} elements ({a} + {e} with "
                f"its pads), fewer than the kernel's extent {span} (kernel {k}, dilation {d}); "
                f"feed at least {max(span - a - e, 1)} there, or pad the input"
            )
        out.append((n + a + e - span) // s + 1)
    return tuple(out)


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

    def __init__(self, node):
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
    # A window lying wholly in the padding averages nothing; avoid 0/0.
    return np.where(cnt == 0, 1.0, cnt)


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


# ---------------------------------------------------------------- Resize


def _source_coords(ctm, out_len, in_len, scale, roi_pair):
    """Source coordinate of each output index along one axis, and the extrapolated mask.

    Computed in float32 like onnxruntime, so exact ties round the same way.
    """
    f = np.float32
    y = np.arange(out_len, dtype=f)
    scale = f(scale)
    roi_pair = tuple(f(v) for v in roi_pair)
    outside = None
    # With scales given, onnxruntime and the ONNX reference use the unrounded
    # resized length (scale * in) where the spec writes "length_resized".
    out_f = scale * f(in_len)
    if ctm == "align_corners":
        x = np.zeros(out_len, f) if out_f == 1 else y * f(in_len - 1) / (out_f - f(1))
    elif ctm == "asymmetric":
        x = y / scale
    elif ctm == "tf_crop_and_resize":
        r0, r1 = roi_pair
        if out_f == 1:
            x = np.full(out_len, (r1 - r0) * f(in_len - 1) / f(2), dtype=f)
        else:
            x = y * (r1 - r0) * f(in_len - 1) / (out_f - f(1))
        x = x + r0 * f(in_len - 1)
        outside = (x < 0) | (x > in_len - 1)
    elif ctm == "pytorch_half_pixel":
        x = np.full(out_len, -0.5, f) if out_f == 1 else (y + f(0.5)) / scale - f(0.5)
    elif ctm == "half_pixel":
        x = (y + f(0.5)) / scale - f(0.5)
    elif ctm == "tf_half_pixel_for_nn":  # Resize-11 only
        x = (y + f(0.5)) / scale
    elif ctm == "half_pixel_symmetric":
        adjustment = f(out_len) / out_f
        offset = f(in_len) / f(2) * (f(1) - adjustment)
        x = offset + (y + f(0.5)) / scale - f(0.5)
    else:
        raise NotSupported(f"Resize: coordinate_transformation_mode {ctm!r} is not supported")
    return x.astype(np.float64), outside


def nearest_index(x, nearest_mode, in_len, downsample=False):
    fl = np.floor(x)
    frac = x - fl
    if nearest_mode == "round_prefer_floor":
        idx = fl + (frac > 0.5)
    elif nearest_mode == "round_prefer_ceil":
        idx = fl + (frac >= 0.5)
    elif nearest_mode == "floor":
        idx = fl
    elif nearest_mode == "ceil":
        idx = np.ceil(x)
    elif nearest_mode == "simple":  # Upsample / Resize-10 (onnxruntime's rule)
        idx = np.ceil(x) if downsample else fl
    else:
        raise NotSupported(f"Resize: nearest_mode {nearest_mode!r} is not supported")
    return np.clip(idx, 0, in_len - 1).astype(np.int64)


def _cubic_w(t, a):
    t = np.abs(t)
    return np.where(
        t <= 1,
        ((a + 2) * t - (a + 3)) * t * t + 1,
        np.where(t < 2, ((a * t - 5 * a) * t + 8 * a) * t - 4 * a, 0.0),
    )


class ResizeTaps:
    """A linear or cubic resize along one axis as taps: output ``j`` is
    ``sum_k weights[j, k] * input[index[j, k]]``, every index inside ``[0, in_len - 1]``."""

    def __init__(self, index: np.ndarray, weights: np.ndarray, in_len: int) -> None:
        self.index = index  # (out, taps) int64
        self.weights = weights  # (out, taps) float64
        self.in_len = in_len
        self._dense: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return (self.index.shape[0], self.in_len)

    def dense(self) -> np.ndarray:
        """The (out, in) weight matrix (taps on one input index summed), made once."""
        if self._dense is None:
            out, k = self.index.shape
            m = np.zeros((out, self.in_len))
            rows = np.repeat(np.arange(out), k)
            np.add.at(m, (rows, self.index.reshape(-1)), self.weights.reshape(-1))
            self._dense = m
        return self._dense


def interp_taps(mode, x, in_len, scale, antialias, cubic_a, exclude_outside) -> ResizeTaps:
    """The taps of a linear or cubic resize along one axis, at source coordinates ``x``."""
    s = min(scale, 1.0) if antialias else 1.0
    xi = np.floor(x)
    ratio = x - xi
    # An exact integer coordinate counts as ratio 1 from the pixel on its left.
    on = ratio == 0
    ratio = np.where(on, 1.0, ratio)
    xi = np.where(on, xi - 1, xi).astype(np.int64)
    if mode == "linear":
        start = int(np.floor(-1 / s) + 1)
    else:
        start = int(np.floor(-2 / s) + 1)
    taps = np.arange(start, 2 - start)
    t = (taps[None, :] - ratio[:, None]) * s
    if mode == "linear":
        w = np.clip(1 - np.abs(t), 0, 1)
    else:
        w = _cubic_w(t, cubic_a)
    idx = xi[:, None] + taps[None, :]
    if exclude_outside:
        w = np.where((idx < 0) | (idx >= in_len), 0.0, w)
    if antialias or exclude_outside:
        tot = w.sum(axis=1, keepdims=True)
        w = w / np.where(tot == 0, 1.0, tot)
    return ResizeTaps(np.clip(idx, 0, in_len - 1), w, in_len)


class ResizePlan:
    """Per-axis gather indices or weight matrices for one input shape and scales/sizes."""

    def __init__(self, axes_ops, out_shape, outside_masks):
        # [(axis, "take", int64 indices) | (axis, "matmul", ResizeTaps) | (axis, "empty", None)]
        self.axes_ops = axes_ops
        self.out_shape = out_shape
        self.outside = outside_masks  # [(axis, bool mask)]


def make_resize_plan(
    in_shape,
    scales,
    sizes,
    roi,
    axes,
    *,
    mode,
    ctm,
    nearest_mode,
    cubic_a,
    exclude_outside,
    antialias,
    policy="stretch",
):
    r = len(in_shape)
    axes = list(range(r)) if axes is None else [a + r if a < 0 else a for a in axes]
    sc = [1.0] * r
    out = list(in_shape)
    if sizes is not None and len(sizes):
        sz = [int(v) for v in sizes]
        if policy == "stretch":
            for a, v in zip(axes, sz):
                out[a] = v
                sc[a] = v / in_shape[a]
        else:
            ratios = [v / in_shape[a] for a, v in zip(axes, sz)]
            s = min(ratios) if policy == "not_larger" else max(ratios)
            for a in axes:
                sc[a] = s
                out[a] = int(s * in_shape[a] + 0.5)
    elif scales is not None and len(scales):
        for a, v in zip(axes, scales):
            sc[a] = float(v)
            out[a] = int(np.floor(float(v) * in_shape[a]))
    else:
        raise NotSupported("Resize: neither scales nor sizes given")
    roi_full = None
    if roi is not None and len(roi):
        roi = [float(v) for v in roi]
        roi_full = [0.0] * r + [1.0] * r
        n = len(axes)
        for i, a in enumerate(axes):
            roi_full[a] = roi[i]
            roi_full[r + a] = roi[n + i]
    ops, masks = [], []
    for a in axes:
        n_in, n_out, s = in_shape[a], out[a], sc[a]
        pair = (0.0, 1.0) if roi_full is None else (roi_full[a], roi_full[r + a])
        if n_out == n_in and s == 1.0 and (ctm != "tf_crop_and_resize" or pair == (0.0, 1.0)):
            continue
        if n_out == 0 or n_in == 0:
            ops.append((a, "empty", None))
            continue
        x, outside = _source_coords(ctm, n_out, n_in, s, pair)
        if mode == "nearest":
            ops.append((a, "take", nearest_index(x, nearest_mode, n_in, s < 1)))
        else:
            taps = interp_taps(mode, x, n_in, s, antialias, cubic_a, exclude_outside)
            ops.append((a, "matmul", taps))
        if outside is not None and outside.any():
            masks.append((a, outside))
    return ResizePlan(ops, out, masks)


def apply_resize_plan(xp, x, plan: ResizePlan, extrapolation_value=0.0):
    dt = x.dtype
    needs_float = any(op == "matmul" for _, op, _ in plan.axes_ops)
    cdt = compute_dtype(dt) if needs_float else dt
    y = x.astype(cdt, copy=False) if needs_float else x
    for a, op, arr in plan.axes_ops:
        if op == "take":
            y = xp.take(y, xp.asarray(arr), axis=a)
        elif op == "empty":
            shp = list(y.shape)
            shp[a] = 0
            y = xp.zeros(tuple(shp), dtype=y.dtype)
        else:
            shp = y.shape
            pre = prod(shp[:a])
            post = prod(shp[a + 1 :])
            m = xp.asarray(arr.dense().astype(cdt))
            if post == 1:
                z = xp.matmul(y.reshape(pre, shp[a]), m.T)
            else:
                z = xp.matmul(m, y.reshape(pre, shp[a], post))
            y = z.reshape(*shp[:a], arr.shape[0], *shp[a + 1 :])
    if plan.outside:
        mask = None
        for a, m in plan.outside:
            shp = [1] * y.ndim
            shp[a] = m.shape[0]
            mm = m.reshape(shp)
            mask = mm if mask is None else (mask | mm)
        y = xp.where(xp.asarray(mask), xp.asarray(np.array(extrapolation_value, dtype=y.dtype)), y)
    if y.dtype != dt:
        if np.dtype(dt).kind in "iu":
            info = np.iinfo(dt)
            y = xp.clip(xp.round(y), info.min, info.max)
        y = y.astype(dt)
    return y


# ---------------------------------------------------------------- signal


def to_complex(xp, x):
    """(..., 1|2) real/complex pairs -> complex array (float32/64 precision kept)."""
    cdt = compute_dtype(x.dtype)
    xc = x.astype(cdt, copy=False)
    if x.shape[-1] == 1:
        return xc[..., 0], False
    return xc[..., 0] + 1j * xc[..., 1], True


def from_complex(xp, z, dt):
    return xp.stack([xp.real(z), xp.imag(z)], axis=-1).astype(dt)


def cosine_window(node, xp, coeffs):
    """Builder body shared by the Hann/Hamming/Blackman window ops: sum_k a_k cos(2 pi k n / N)."""
    from onnxep.providers.dtypes import np_dtype

    periodic = bool(node.attr("periodic", 1))
    out_dt = np_dtype(int(node.attr("output_datatype", 1)))

    def run(size):
        n = int(np.asarray(size).reshape(-1)[0])
        denom = n if periodic else n - 1
        k = np.arange(n, dtype=np.float64)
        w = np.zeros(n)
        for i, a in enumerate(coeffs):
            w = w + a * np.cos(2 * np.pi * i * k / denom) if denom else w + a
        return (xp.asarray(w.astype(out_dt)),)

    return run
