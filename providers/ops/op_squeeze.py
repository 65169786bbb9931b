from onnxep.providers.kernel import kernel

from .shape import ints, norm_axes


def _squeeze(xp, x, axes):
    if axes is None:
        keep = [d for d in x.shape if d != 1]
    else:
        drop = set(norm_axes(axes, x.ndim, "Squeeze"))
        for a in drop:
            if x.shape[a] != 1:
                raise ValueError(f"Squeeze: axis {a} has size {x.shape[a]}, not 1")
        keep = [d for i, d in enumerate(x.shape) if i not in drop]
    return xp.reshape(x, tuple(keep))


@kernel("Squeeze", since=(1, 11))
def squeeze_attr(node, xp):
    axes = node.attr("axes", None)

    def run(x):
        return (_squeeze(xp, x, axes),)

    return run


@kernel("Squeeze", since=13, host_inputs=(1,))
def squeeze(node, xp):
    def run(x, axes=None):
        # an empty axes tensor means "not given", as onnxruntime reads it
        return (_squeeze(xp, x, ints(axes) or None),)

    return run
