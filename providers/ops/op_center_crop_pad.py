from onnxep.providers.kernel import kernel

from .shape import ints, norm_axes, string_zero


@kernel("CenterCropPad", since=18, host_inputs=(1,))
def center_crop_pad(node, xp):
    axes_attr = node.attr("axes", None)

    def run(x, shape):
        target = ints(shape)
        axes = list(range(x.ndim)) if axes_attr is None else norm_axes(axes_attr, x.ndim)
        src = [slice(None)] * x.ndim
        dst = [slice(None)] * x.ndim
        out_shape = list(x.shape)
        for a, want in zip(axes, target):
            have = x.shape[a]
            # the odd element of an uneven difference goes to the end
            if want < have:
                off = (have - want) // 2
                src[a] = slice(off, off + want)
            elif want > have:
                off = (want - have) // 2
                dst[a] = slice(off, off + have)
            out_shape[a] = want
        out = xp.full(tuple(out_shape), string_zero(x.dtype), dtype=x.dtype)
        out[tuple(dst)] = x[tuple(src)]
        return (out,)

    return run
