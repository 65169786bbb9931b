from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel

from ._shape import ints, norm_axes, string_zero

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
    if mode == "constant":
        if value is None:
            value = string_zero(x.dtype)
        return xp.pad(x, width, mode="constant", constant_values=value)
    if mode == "reflect":
        # A reflection has size - 1 values to mirror; NumPy would reflect again past them,
        # onnxruntime refuses (the spec defines no more).
        for axis, (b, e) in enumerate(width):
            if max(b, e) > x.shape[axis] - 1:
                raise ValueError(
                    f"Pad: reflect pads ({b}, {e}) on axis {axis} of shape {list(x.shape)} "
                    f"exceed the {x.shape[axis] - 1} values a reflection can mirror"
                )
    return xp.pad(x, width, mode=mode)


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
