from onnxep.errors import InvalidArgument, NotSupported
from onnxep.providers.kernel import kernel

from .shape import ints, norm_axes, string_zero

_MODES = ("constant", "reflect", "edge", "wrap")


def _pad(xp, x, pads, axes, mode, value):
    rank = x.ndim
    axes = list(range(rank)) if axes is None else norm_axes(axes, rank, "Pad")
    if len(pads) != 2 * len(axes):
        raise ValueError(f"Pad: {len(pads)} pads for {len(axes)} axes")
    before = [0] * rank
    after = [0] * rank
    for i, a in enumerate(axes):
        before[a], after[a] = pads[i], pads[i + len(axes)]
    # negative pads crop; do that first so the pad modes see the cropped data
    if any(p < 0 for p in before + after):
        index = tuple(
            slice(max(-b, 0), x.shape[d] - max(-e, 0))
            for d, (b, e) in enumerate(zip(before, after))
        )
        x = x[index]
    width = tuple((max(b, 0), max(e, 0)) for b, e in zip(before, after))
    if not any(b or e for b, e in width):
        return x
    if mode in ("reflect", "edge"):
        _check_mirrored(x.shape, width, mode)
    if mode == "constant":
        if value is None:
            value = string_zero(x.dtype)
        if x.dtype.kind in "biufc":
            return _pad_constant(xp, x, width, value)
        return xp.pad(x, width, mode="constant", constant_values=value)
    if mode == "reflect":
        return _pad_reflect(xp, x, width)
    return xp.pad(x, width, mode=mode)


# np.pad is general (any width, repeated reflection) and spends tens of microseconds in
# Python per call; ONNX's modes need much less, so the two common ones are a few slices.


def _pad_constant(xp, x, width, value):
    out = xp.full(tuple(n + b + e for n, (b, e) in zip(x.shape, width)), value, dtype=x.dtype)
    out[tuple(slice(b, b + n) for n, (b, _) in zip(x.shape, width))] = x
    return out


def _pad_reflect(xp, x, width):
    """Mirror each padded axis in turn, the edge element not repeated (widths are checked
    to be at most n - 1 by ``_check_mirrored``)."""
    for axis, (b, e) in enumerate(width):
        if not (b or e):
            continue
        n = x.shape[axis]
        head = (slice(None),) * axis
        parts = []
        if b:
            parts.append(x[(*head, slice(b, 0, -1))])
        parts.append(x)
        if e:  # e = n - 1 runs to the first element: a stop of -1 would mean the last
            stop = n - 2 - e
            parts.append(x[(*head, slice(n - 2, stop if stop >= 0 else None, -1))])
        x = xp.concatenate(parts, axis=axis)
    return x


def _check_mirrored(shape, width, mode):
    """Reflect mirrors at most ``n - 1`` elements of an axis of ``n`` and edge needs one;
    NumPy would instead reflect again and again, which is not what ONNX (or onnxruntime)
    computes, so a wider pad is refused as onnxruntime refuses it."""
    for axis, ((b, e), n) in enumerate(zip(width, shape)):
        if not (b or e):
            continue
        limit = n - 1 if mode == "reflect" else (None if n else 0)
        if n == 0 or (limit is not None and max(b, e) > limit):
            need = 2 if mode == "reflect" else 1
            raise InvalidArgument(
                f"Pad {mode}: axis {axis} has {n} element(s) (after negative pads crop it) and "
                f"pads ({b}, {e}); {mode} needs at least {need} element(s) there and pads of at "
                f"most {max(n - 1, 0) if mode == 'reflect' else 'any size'}: use mode "
                "'constant' or a smaller pad"
            )


def _mode(node, allowed):
    mode = node.attr("mode", "constant")
    if mode not in allowed:
        raise NotSupported(f"Pad: mode {mode!r} is not one of {allowed} at opset {node.opset}")
    return mode


@kernel("Pad", since=(1, 2))
def pad_attr(node, xp):
    mode = _mode(node, _MODES[:3])
    pads = [int(p) for p in node.attr("pads" if node.opset >= 2 else "paddings")]
    value = node.attr("value", 0.0)

    def run(x):
        return (_pad(xp, x, pads, None, mode, value),)

    return run


def _value(v):
    # a host scalar; an empty tensor means the default
    if v is None or v.size == 0:
        return None
    return v.reshape(-1)[0]


@kernel("Pad", since=(11, 18, 19), host_inputs=(1, 2, 3))
def pad(node, xp):
    mode = _mode(node, _MODES if node.opset >= 19 else _MODES[:3])

    def run(x, pads, constant_value=None, axes=None):
        ax = None if axes is None else ints(axes)
        return (_pad(xp, x, ints(pads), ax, mode, _value(constant_value)),)

    return run
