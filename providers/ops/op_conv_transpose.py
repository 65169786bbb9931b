"""ConvTranspose as one matmul per group (W^T X) followed by a col2im scatter-add."""

from __future__ import annotations

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel

from .nn import auto_pad_of, col2im_add, compute_dtype, crop_spatial, spatial_attrs


def conv_transpose_setup(node):
    """Static attributes: (group, kernel_shape or None, strides, dilations, geometry).

    ``geometry(in_sp, k)`` gives the full (uncropped) output size and the crop
    at each end: (full, pb, pe), from pads, output_padding, output_shape and auto_pad.
    """
    w = node.inputs[1]
    ksh = node.attr("kernel_shape", None)
    if ksh is not None:
        rank = len(ksh)
    elif w is not None and w.rank is not None:
        rank = w.rank - 2
    else:
        raise NotSupported("ConvTranspose: kernel rank unknown (no kernel_shape, W rank unknown)")
    strides, dil, pb0, pe0 = spatial_attrs(node, rank, ksh)
    group = int(node.attr("group", 1))
    out_pad = list(node.attr("output_padding", None) or [0] * rank)
    out_shape = node.attr("output_shape", None)
    auto_pad = auto_pad_of(node)

    def geometry(in_sp, k):
        pb, pe = list(pb0), list(pe0)
        target = None
        if out_shape is not None:
            target = list(out_shape)[-rank:]
        elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            target = [n * s for n, s in zip(in_sp, strides)]
        full = [
            s * (n - 1) + (kk - 1) * d + 1 + op
            for n, s, kk, d, op in zip(in_sp, strides, k, dil, out_pad)
        ]
        if target is not None:
            pb, pe = [], []
            for f, t in zip(full, target):
                tot = f - t
                if auto_pad == "SAME_UPPER":
                    pb.append(tot // 2)
                    pe.append(tot - tot // 2)
                else:
                    pb.append(tot - tot // 2)
                    pe.append(tot // 2)
        return full, pb, pe

    return group, ksh, strides, dil, geometry


@kernel("ConvTranspose", since=(1, 11, 22))
def conv_transpose(node, xp):
    group, ksh, strides, dil, geometry = conv_transpose_setup(node)
    rank = len(strides)

    def run(x, w, b=None):
        k = list(ksh) if ksh is not None else list(w.shape[2:])
        in_sp = list(x.shape[2:])
        full, pb, pe = geometry(in_sp, k)
        dt = x.dtype
        cdt = compute_dtype(dt)
        n, c = x.shape[:2]
        mg = w.shape[1]
        kk = 1
        for v in k:
            kk *= v
        lsz = 1
        for v in in_sp:
            lsz *= v
        xg = x.astype(cdt, copy=False).reshape(n, group, c // group, lsz)
        wg = w.astype(cdt, copy=False).reshape(group, c // group, mg * kk)
        cols = xp.matmul(xp.swapaxes(wg, 1, 2), xg)  # (N, G, Mg*K, L)
        cols = cols.reshape(n, group * mg, kk, *in_sp)
        # Out-of-range output_padding cells stay zero: the scatter covers only the kernel span.
        y = col2im_add(xp, cols, k, strides, dil, in_sp, full)
        y = crop_spatial(xp, y, pb, pe)
        if b is not None:
            y = y + b.astype(cdt, copy=False).reshape(1, -1, *([1] * rank))
        return (y.astype(dt, copy=False),)

    return run
