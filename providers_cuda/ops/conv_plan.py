"""What cuDNN is asked to do for a Conv, ConvTranspose or pool, as plain arithmetic (no CuPy).

Each planner takes the input shapes and the node's attributes and returns either a
geometry (the tensor shapes, symmetric pads, strides and dilations to build cuDNN's
descriptors from, and the explicit padding or cropping around the call) or a string:
why cuDNN does not take this case, so the kernel hands it to the generic kernel and
says so. The output shapes always come from the generic kernels' own rules
(``onnxep.providers.ops.nn``), so the two paths cannot disagree on a shape.

The choices (docs/cudnn.md):

- 1-D is run as 2-D with a leading spatial axis of 1 (cuDNN's convolution and pooling
  descriptors take 2 or 3 spatial dims); more than 3 spatial dims falls back.
- cuDNN takes one pad per axis, applied at both ends. An asymmetric pair (SAME_UPPER
  with an even total, explicit pads) gives cuDNN the smaller of the two and pads the
  remainder explicitly first (zeros for Conv and AveragePool with
  count_include_pad=1, the dtype's lowest value for MaxPool); AveragePool excluding
  pads cannot be padded that way (the cells would count) and falls back unless its
  pads are symmetric.
- ConvTranspose is cudnnConvolutionBackwardData: the output is the gradient of a
  forward Conv whose input has the output's size; pads that do not fit one symmetric
  pad are computed on a slightly larger output and cropped.
- Invalid input (channels that do not match the weight, inputs smaller than the
  kernel) falls back too, so the error is the generic kernel's, the same as on the CPU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from onnxep.errors import InvalidArgument
from onnxep.providers.ops.nn import conv_out_dims, pool_geometry, resolve_pads

#: cuDNN's descriptors take int32 sizes and strides.
INT32_MAX = 2**31 - 1

Ints = tuple[int, ...]


@dataclass(frozen=True)
class ConvGeometry:
    """A forward convolution as cuDNN runs it (all shapes in cuDNN's rank: 1-D lifted to 2-D).

    ``pre_pad`` are (begin, end) zero pads per spatial axis applied to the input first
    (None when none), ``x_shape`` the input cuDNN sees after them; ``out_shape`` is the
    ONNX output shape (``y_shape`` reshaped).
    """

    x_shape: Ints
    w_shape: Ints
    y_shape: Ints
    out_shape: Ints
    pads: Ints
    strides: Ints
    dilations: Ints
    group: int
    pre_pad: tuple[tuple[int, int], ...] | None
    lifted: bool


@dataclass(frozen=True)
class TransposeGeometry:
    """ConvTranspose as cudnnConvolutionBackwardData (cuDNN's rank; 1-D lifted).

    cuDNN writes ``dx_shape`` (the forward conv's input), reading ``x_shape`` as the
    gradient; ``crop`` is the (begin) offset per spatial axis of the ONNX output inside
    ``dx_shape``, None when the two are equal.
    """

    x_shape: Ints
    w_shape: Ints
    dx_shape: Ints
    out_shape: Ints
    pads: Ints
    strides: Ints
    dilations: Ints
    group: int
    crop: Ints | None
    lifted: bool


@dataclass(frozen=True)
class PoolGeometry:
    """A pooling call: ``mode`` is "max", "avg_include" or "avg_exclude"; pads symmetric."""

    x_shape: Ints
    y_shape: Ints
    out_shape: Ints
    window: Ints
    pads: Ints
    strides: Ints
    mode: str
    pre_pad: tuple[tuple[int, int], ...] | None
    lifted: bool


def _too_big(*shapes: Sequence[int]) -> str | None:
    for s in shapes:
        if math.prod(s) > INT32_MAX:
            return f"a tensor of shape {tuple(s)} has more than 2**31 - 1 elements (cuDNN's limit)"
    return None


def _lift(shape: Sequence[int]) -> Ints:
    """(N, C, L) -> (N, C, 1, L)."""
    return (*shape[:2], 1, *shape[2:])


def _spatial_check(x_shape, w_shape, spatial: int, op: str) -> str | None:
    if spatial not in (1, 2, 3):
        return f"{op}: {spatial} spatial dims (cuDNN takes 1, 2 or 3)"
    if len(x_shape) != spatial + 2 or len(w_shape) != spatial + 2:
        return f"{op}: input rank {len(x_shape)} and weight rank {len(w_shape)} do not match"
    if any(d <= 0 for d in (*x_shape, *w_shape)):
        return f"{op}: an empty input or weight"
    return None


def conv_geometry(
    x_shape: Sequence[int],
    w_shape: Sequence[int],
    *,
    group: int,
    kernel_shape: Sequence[int] | None,
    strides: Sequence[int],
    dilations: Sequence[int],
    pads_begin: Sequence[int],
    pads_end: Sequence[int],
    auto_pad: str,
) -> ConvGeometry | str:
    """The cuDNN call for a Conv on these shapes, or why there is none."""
    x_shape, w_shape = tuple(int(d) for d in x_shape), tuple(int(d) for d in w_shape)
    spatial = len(strides)
    why = _spatial_check(x_shape, w_shape, spatial, "Conv")
    if why:
        return why
    k = tuple(w_shape[2:])
    if kernel_shape is not None and tuple(kernel_shape) != k:
        return f"Conv: kernel_shape {tuple(kernel_shape)} is not the weight's {k}"
    n, c = x_shape[:2]
    m, cg = w_shape[:2]
    if group < 1 or c != cg * group or m % group:
        return f"Conv: {c} input channels, weight {w_shape}, group {group} do not match"
    if min(strides) < 1 or min(dilations) < 1:
        return "Conv: strides and dilations must be positive"
    in_sp = x_shape[2:]
    pb, pe = resolve_pads(auto_pad, in_sp, k, strides, dilations, pads_begin, pads_end)
    if min(pb, default=0) < 0 or min(pe, default=0) < 0:
        return "Conv: negative pads"
    try:
        out_sp = conv_out_dims("Conv", in_sp, pb, pe, k, dilations, strides)
    except InvalidArgument as exc:
        return str(exc)
    sym = tuple(min(b, e) for b, e in zip(pb, pe))
    pre = tuple((b - s, e - s) for b, e, s in zip(pb, pe, sym))
    x_sp = tuple(d + a + b for d, (a, b) in zip(in_sp, pre))
    out_shape = (n, m, *out_sp)
    xs, ws, ys = (n, c, *x_sp), w_shape, out_shape
    strides, dilations = tuple(strides), tuple(dilations)
    lifted = spatial == 1
    if lifted:
        xs, ws, ys = _lift(xs), _lift(ws), _lift(ys)
        sym, strides, dilations = (0, *sym), (1, *strides), (1, *dilations)
    why = _too_big(xs, ws, ys)
    if why:
        return f"Conv: {why}"
    return ConvGeometry(
        x_shape=xs,
        w_shape=ws,
        y_shape=ys,
        out_shape=out_shape,
        pads=sym,
        strides=strides,
        dilations=dilations,
        group=group,
        pre_pad=pre if any(a or b for a, b in pre) else None,
        lifted=lifted,
    )


def conv_transpose_geometry(
    x_shape: Sequence[int],
    w_shape: Sequence[int],
    *,
    group: int,
    kernel_shape: Sequence[int] | None,
    strides: Sequence[int],
    dilations: Sequence[int],
    full: Sequence[int],
    pads_begin: Sequence[int],
    pads_end: Sequence[int],
) -> TransposeGeometry | str:
    """The cuDNN call for a ConvTranspose, or why there is none.

    ``full``, ``pads_begin`` and ``pads_end`` are the generic kernel's geometry (the
    uncropped output size, output_padding included, and the crop at each end, from
    pads, output_shape and auto_pad); the ONNX output is ``full - pb - pe`` per axis.
    """
    x_shape, w_shape = tuple(int(d) for d in x_shape), tuple(int(d) for d in w_shape)
    spatial = len(strides)
    why = _spatial_check(x_shape, w_shape, spatial, "ConvTranspose")
    if why:
        return why
    k = tuple(w_shape[2:])
    if kernel_shape is not None and tuple(kernel_shape) != k:
        return f"ConvTranspose: kernel_shape {tuple(kernel_shape)} is not the weight's {k}"
    n, c = x_shape[:2]
    if group < 1 or w_shape[0] != c or c % group:
        return f"ConvTranspose: {c} input channels, weight {w_shape}, group {group} do not match"
    if min(strides) < 1 or min(dilations) < 1:
        return "ConvTranspose: strides and dilations must be positive"
    if min(pads_begin, default=0) < 0 or min(pads_end, default=0) < 0:
        return "ConvTranspose: output_shape larger than the full output (negative pads)"
    m = w_shape[1] * group
    in_sp = x_shape[2:]
    pads, dx_sp, crop, out_sp = [], [], [], []
    for nn_, kk, s, d, f, b, e in zip(in_sp, k, strides, dilations, full, pads_begin, pads_end):
        target = f - b - e
        if target < 1:
            return f"ConvTranspose: an output axis of size {target}"
        # The windows of the forward conv touch `base` cells; cells past it (output_padding)
        # are zero. cuDNN covers [p, p + D) of the full output with D = base - 2p + r, 0 <= r < s.
        base = s * (nn_ - 1) + (kk - 1) * d + 1
        r = f - base + b - e  # output_padding + pb - pe: exact when 0 <= r < s with p = pb
        p = b
        if not 0 <= r < s:
            p = min(b, e)
            r = max(0, f - base + p - e)
            if r >= s:
                return f"ConvTranspose: output_padding {f - base} not below stride {s}"
        size = base - 2 * p + r
        if size < target + (b - p):
            return "ConvTranspose: the pads do not fit one symmetric cuDNN pad"
        pads.append(p)
        dx_sp.append(size)
        crop.append(b - p)
        out_sp.append(target)
    out_shape = (n, m, *out_sp)
    exact = tuple(dx_sp) == tuple(out_sp)
    xs, ws, dxs = x_shape, w_shape, (n, m, *dx_sp)
    strides, dilations, pads_t = tuple(strides), tuple(dilations), tuple(pads)
    lifted = spatial == 1
    if lifted:
        xs, ws, dxs = _lift(xs), _lift(ws), _lift(dxs)
        pads_t, strides, dilations = (0, *pads_t), (1, *strides), (1, *dilations)
    why = _too_big(xs, ws, dxs)
    if why:
        return f"ConvTranspose: {why}"
    return TransposeGeometry(
        x_shape=xs,
        w_shape=ws,
        dx_shape=dxs,
        out_shape=out_shape,
        pads=pads_t,
        strides=strides,
        dilations=dilations,
        group=group,
        crop=None if exact else tuple(crop),
        lifted=lifted,
    )


def pool_attrs_refusal(
    op: str, dilations: Sequence[int] | None, want_indices: bool = False
) -> str | None:
    """What makes every call of a pooling node go to the generic kernel (known at build)."""
    if want_indices:
        return f"{op}: the Indices output (cuDNN's pooling does not return argmax indices)"
    if dilations is not None and any(int(d) != 1 for d in dilations):
        return f"{op}: dilations {tuple(dilations)} (cuDNN's pooling has none)"
    return None


def pool_geometry_plan(
    kind: str,
    x_shape: Sequence[int],
    *,
    kernel: Sequence[int],
    strides: Sequence[int],
    pads_begin: Sequence[int],
    pads_end: Sequence[int],
    ceil_mode: bool,
    auto_pad: str,
    count_include_pad: bool = False,
) -> PoolGeometry | str:
    """The cuDNN call for ``kind`` ("max" or "avg") on this input, or why there is none."""
    op = "MaxPool" if kind == "max" else "AveragePool"
    x_shape = tuple(int(d) for d in x_shape)
    spatial = len(kernel)
    if spatial not in (1, 2, 3):
        return f"{op}: {spatial} spatial dims (cuDNN takes 1, 2 or 3)"
    if len(x_shape) != spatial + 2:
        return f"{op}: input rank {len(x_shape)} does not match kernel_shape {tuple(kernel)}"
    if any(d <= 0 for d in x_shape) or min(kernel) < 1 or min(strides) < 1:
        return f"{op}: an empty input, kernel or stride"
    in_sp = x_shape[2:]
    ones = [1] * spatial
    pb, pe = resolve_pads(auto_pad, in_sp, kernel, strides, ones, pads_begin, pads_end)
    if min(pb) < 0 or min(pe) < 0:
        return f"{op}: negative pads"
    out, extra = pool_geometry(in_sp, kernel, strides, ones, pb, pe, ceil_mode, auto_pad)
    if min(out) < 1:
        return f"{op}: an empty output"
    pe_eff = [e + x for e, x in zip(pe, extra)]
    if kind == "max":
        mode = "max"
    elif count_include_pad:
        mode = "avg_include"
        if any(extra):
            return f"{op}: ceil_mode cells past the pads (they must not count; cuDNN counts them)"
    else:
        mode = "avg_exclude"
        if list(pb) != pe_eff:
            return (
                f"{op}: asymmetric pads {tuple(pb)} / {tuple(pe_eff)} with count_include_pad=0 "
                "(cuDNN's pads are symmetric; explicit padding would count)"
            )
    sym = tuple(min(b, e) for b, e in zip(pb, pe_eff))
    if any(p >= k for p, k in zip(sym, kernel)):
        return f"{op}: pads {sym} not smaller than the kernel {tuple(kernel)}"
    pre = tuple((b - s, e - s) for b, e, s in zip(pb, pe_eff, sym))
    x_sp = tuple(d + a + b for d, (a, b) in zip(in_sp, pre))
    # cuDNN's own output size (floor) must be the ONNX one.
    for d, p, k, s, o in zip(x_sp, sym, kernel, strides, out):
        if (d + 2 * p - k) // s + 1 != o:
            return f"{op}: cuDNN's output size differs from ONNX's (ceil_mode windows)"
    n, c = x_shape[:2]
    out_shape = (n, c, *out)
    xs, ys = (n, c, *x_sp), out_shape
    window, strides_t = tuple(kernel), tuple(strides)
    lifted = spatial == 1
    if lifted:
        xs, ys = _lift(xs), _lift(ys)
        window, sym, strides_t = (1, *window), (0, *sym), (1, *strides_t)
    why = _too_big(xs, ys)
    if why:
        return f"{op}: {why}"
    return PoolGeometry(
        x_shape=xs,
        y_shape=ys,
        out_shape=out_shape,
        window=window,
        pads=sym,
        strides=strides_t,
        mode=mode,
        pre_pad=pre if any(a or b for a, b in pre) else None,
        lifted=lifted,
    )


def global_pool_plan(kind: str, x_shape: Sequence[int]) -> PoolGeometry | str:
    """GlobalMaxPool / GlobalAveragePool as one window over every spatial cell."""
    op = "GlobalMaxPool" if kind == "max" else "GlobalAveragePool"
    x_shape = tuple(int(d) for d in x_shape)
    spatial = len(x_shape) - 2
    if spatial not in (1, 2, 3):
        return f"{op}: {spatial} spatial dims (cuDNN takes 1, 2 or 3)"
    if any(d <= 0 for d in x_shape):
        return f"{op}: an empty input"
    ones = [1] * spatial
    zeros = [0] * spatial
    return pool_geometry_plan(
        kind,
        x_shape,
        kernel=x_shape[2:],
        strides=ones,
        pads_begin=zeros,
        pads_end=zeros,
        ceil_mode=False,
        auto_pad="NOTSET",
        count_include_pad=True,
    )
