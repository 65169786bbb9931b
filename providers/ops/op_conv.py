"""Conv as im2col + one batched matmul per group (works on NumPy and CuPy)."""

from __future__ import annotations

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel

from .nn import (
    auto_pad_of,
    compute_dtype,
    conv_out_dims,
    im2col,
    pad_spatial,
    resolve_pads,
    spatial_attrs,
)


def conv_setup(node, w_index=1):
    """Static attributes of a Conv node: (group, kernel, strides, dilations, pb, pe, auto_pad).

    ``w_index`` is the weight's input (QLinearConv's is 3)."""
    w = node.inputs[w_index]
    ksh = node.attr("kernel_shape", None)
    if ksh is None:
        if w is None or w.shape is None or not all(isinstance(d, int) for d in w.shape[2:]):
            ksh = None
        else:
            ksh = list(w.shape[2:])
    rank = len(ksh) if ksh is not None else (w.rank - 2 if w is not None and w.rank else None)
    if rank is None:
        raise NotSupported("Conv: kernel rank unknown (no kernel_shape and W has no static rank)")
    strides, dil, pb, pe = spatial_attrs(node, rank, ksh)
    return int(node.attr("group", 1)), ksh, strides, dil, pb, pe, auto_pad_of(node)


@kernel("Conv", since=(1, 11, 22))
def conv(node, xp):
    group, ksh, strides, dil, pb0, pe0, auto_pad = conv_setup(node)

    def run(x, w, b=None):
        k = ksh or list(w.shape[2:])
        in_sp = x.shape[2:]
        pb, pe = resolve_pads(auto_pad, in_sp, k, strides, dil, pb0, pe0)
        out = list(conv_out_dims(node.op_type, in_sp, pb, pe, k, dil, strides))
        dt = x.dtype
        cdt = compute_dtype(dt)
        xc = x.astype(cdt, copy=False)
        wc = w.astype(cdt, copy=False)
        n, c = x.shape[:2]
        m = w.shape[0]
        cols = im2col(xp, pad_spatial(xp, xc, pb, pe), k, strides, dil, out)
        lsz = 1
        for o in out:
            lsz *= o
        cols = cols.reshape(n, group, -1, lsz)
        wg = wc.reshape(group, m // group, -1)
        y = xp.matmul(wg, cols).reshape(n, m, *out)
        if b is not None:
            y = y + b.astype(cdt, copy=False).reshape(1, m, *([1] * len(out)))
        return (y.astype(dt, copy=False),)

    return run
