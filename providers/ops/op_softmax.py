"""Softmax: before opset 13 over the flattened dims from ``axis`` on, then over one axis."""

from onnxep.providers.kernel import kernel

from .reduce import coerced_axes, softmax, widen


@kernel("Softmax", since=(1, 11, 13))
def softmax_kernel(node, xp):
    axes_for = coerced_axes(node, 1 if node.opset < 13 else -1)

    def run(x):
        return (softmax(widen(x, xp), axes_for(x.ndim), xp).astype(x.dtype, copy=False),)

    return run
