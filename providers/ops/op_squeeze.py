"""Squeeze: drop size-1 axes, as an attribute up to opset 11, as a host input from 13.

With the axes fixed (an attribute, or a constant input) the output shape depends on the
input's shape alone, so it is worked out (and checked) once per input shape.
"""

from onnxep.providers.kernel import kernel

from .shape import ints, norm_axes, reshaper


def _squeezed(shape, axes):
    if axes is None:
        return tuple(d for d in shape if d != 1)
    drop = set(norm_axes(axes, len(shape), "Squeeze"))
    for a in drop:
        if shape[a] != 1:
            raise ValueError(f"Squeeze: axis {a} has size {shape[a]}, not 1")
    return tuple(d for i, d in enumerate(shape) if i not in drop)


def _squeeze(xp, x, axes):
    return xp.reshape(x, _squeezed(x.shape, axes))


def _fixed(xp, axes):
    memo: dict[tuple, tuple] = {}
    reshape = reshaper(xp)

    def run(x, *_axes):
        shape = memo.get(x.shape)
        if shape is None:
            shape = _squeezed(x.shape, axes)
            if len(memo) < 64:
                memo[x.shape] = shape
        return (reshape(x, shape),)

    return run


@kernel("Squeeze", since=(1, 11))
def squeeze_attr(node, xp):
    return _fixed(xp, node.attr("axes", None))


@kernel("Squeeze", since=13, host_inputs=(1,))
def squeeze(node, xp):
    if node.num_inputs < 2 or not node.has_input(1):
        return _fixed(xp, None)
    const = node.const_input(1)
    if const is not None:
        # an empty axes tensor means "not given", as onnxruntime reads it
        return _fixed(xp, ints(const) or None)

    def run(x, axes=None):
        return (_squeeze(xp, x, ints(axes) or None),)

    return run
