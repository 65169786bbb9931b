"""ConvTranspose through cuDNN (cudnnConvolutionBackwardData, + cudnnAddTensor): capture-safe.

The output is the data gradient of the forward Conv whose input has the output's
size; pads, output_padding, output_shape and auto_pad come from the generic kernel's
geometry (``conv_transpose_setup``), so both paths agree on every shape. Pads that do
not fit one symmetric cuDNN pad are computed on a larger output and cropped
(``conv_plan.conv_transpose_geometry``). What cuDNN cannot take goes to the generic
kernel (matmul + col2im, not capture-safe), as in ``op_conv``.
"""

from __future__ import annotations

from onnxep.providers.kernel import kernel, not_capture_safe
from onnxep.providers.ops import op_conv_transpose as generic

from . import conv_plan
from .cudnn_run import PerShape, build_refusal, contiguous, generic_note
from .op_conv import _spatial_rank


@kernel("ConvTranspose", since=(1, 11, 22))
def conv_transpose(node, xp):
    fallback = generic.conv_transpose(node, xp)
    why = build_refusal(node, "ConvTranspose", _spatial_rank(node))
    if why is not None:
        return not_capture_safe(fallback, generic_note(why))
    from .. import dnn

    group, ksh, strides, dil, geometry = generic.conv_transpose_setup(node)
    shapes = PerShape("ConvTranspose", node.name)

    def build(x_shape, w_shape, dt):
        k = list(ksh) if ksh is not None else list(w_shape[2:])
        if len(x_shape) != len(strides) + 2 or len(k) != len(strides):
            return "ConvTranspose: input, weight and attribute ranks do not match"
        full, pb, pe = geometry(list(x_shape[2:]), k)
        geom = conv_plan.conv_transpose_geometry(
            x_shape,
            w_shape,
            group=group,
            kernel_shape=ksh,
            strides=strides,
            dilations=dil,
            full=full,
            pads_begin=pb,
            pads_end=pe,
        )
        if isinstance(geom, str):
            return geom
        return geom, dnn.ConvBackwardData(geom, dt), dnn.BiasAdd(geom.out_shape, dt)

    def run(x, w, b=None):
        dt = x.dtype.name
        if (
            dt not in dnn.SUPPORTED_DTYPES
            or w.dtype != x.dtype
            or (b is not None and (b.dtype != x.dtype or b.ndim != 1))
        ):
            shapes.fell_back(f"dtypes {x.dtype}/{w.dtype} or bias shape")
            return fallback(x, w, b)
        key = (tuple(x.shape), tuple(w.shape), dt)
        entry = shapes.get(key, lambda: build(x.shape, w.shape, dt))
        if isinstance(entry, str) or (b is not None and b.shape != (entry[0].out_shape[1],)):
            shapes.fell_back(entry if isinstance(entry, str) else "bias shape")
            return fallback(x, w, b)
        geom, op, bias_add = entry
        first = op.algo is None
        try:
            dx = op(contiguous(xp, x, geom.x_shape), contiguous(xp, w, geom.w_shape))
        except dnn.DnnError as exc:
            if not (first and exc.not_supported):
                raise
            shapes.refuse(key, f"cuDNN refused it: {exc}")
            shapes.fell_back(f"cuDNN refused it: {exc}")
            return fallback(x, w, b)
        n, m = geom.out_shape[:2]
        dx_sp = geom.dx_shape[3:] if geom.lifted else geom.dx_shape[2:]
        y = dx.reshape(n, m, *dx_sp)
        if geom.crop is not None:
            sl = tuple(slice(c, c + o) for c, o in zip(geom.crop, geom.out_shape[2:]))
            y = xp.ascontiguousarray(y[(slice(None), slice(None), *sl)])
        if b is not None:
            bias_add(y, xp.ascontiguousarray(b))
        return (y,)

    run.cudnn = shapes
    return run
