"""DeformConv: bilinear sampling at offset kernel taps, then a grouped matmul like Conv."""

from __future__ import annotations

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel

from .nn import compute_dtype


@kernel("DeformConv", since=(19, 22))
def deform_conv(node, xp):
    w_info = node.inputs[1]
    ksh = node.attr("kernel_shape", None)
    if ksh is None and (w_info is None or w_info.rank is None):
        raise NotSupported("DeformConv: kernel rank unknown (no kernel_shape, W rank unknown)")
    rank = len(ksh) if ksh is not None else w_info.rank - 2
    if rank != 2:
        raise NotSupported(f"DeformConv: only 2-D inputs are supported, got {rank} spatial dims")
    strides = list(node.attr("strides", None) or [1, 1])
    dil = list(node.attr("dilations", None) or [1, 1])
    pads = list(node.attr("pads", None) or [0, 0, 0, 0])
    group = int(node.attr("group", 1))
    og = int(node.attr("offset_group", 1))

    def run(x, w, offset, b=None, mask=None):
        kh, kw = list(ksh) if ksh is not None else list(w.shape[2:])
        dt = x.dtype
        cdt = compute_dtype(dt)
        n, c, h, wd = x.shape
        oh = (h + pads[0] + pads[2] - ((kh - 1) * dil[0] + 1)) // strides[0] + 1
        ow = (wd + pads[1] + pads[3] - ((kw - 1) * dil[1] + 1)) // strides[1] + 1
        kk, p, cg = kh * kw, oh * ow, c // og
        # (N, og, H*W, Cg): advanced indices on the first three axes keep Cg last.
        xt = xp.swapaxes(x.astype(cdt, copy=False).reshape(n, og, cg, h * wd), 2, 3)
        off = offset.astype(cdt, copy=False).reshape(n, og, kk, 2, p)
        msk = None if mask is None else mask.astype(cdt, copy=False).reshape(n, og, kk, p)
        ni = xp.arange(n).reshape(n, 1, 1)
        gi = xp.arange(og).reshape(1, og, 1)
        base_y = (xp.arange(oh, dtype=cdt) * strides[0] - pads[0]).reshape(oh, 1)
        base_x = (xp.arange(ow, dtype=cdt) * strides[1] - pads[1]).reshape(1, ow)
        cols = []
        for k in range(kk):
            i, j = divmod(k, kw)
            py = (base_y + i * dil[0] + xp.zeros((1, ow), dtype=cdt)).reshape(1, 1, p)
            px = (base_x + j * dil[1] + xp.zeros((oh, 1), dtype=cdt)).reshape(1, 1, p)
            y = py + off[:, :, k, 0]
            xx = px + off[:, :, k, 1]
            y0 = xp.floor(y)
            x0 = xp.floor(xx)
            ly, lx = y - y0, xx - x0
            y0i = y0.astype(xp.int64)
            x0i = x0.astype(xp.int64)
            acc = None
            for dy, dx, wgt in (
                (0, 0, (1 - ly) * (1 - lx)),
                (0, 1, (1 - ly) * lx),
                (1, 0, ly * (1 - lx)),
                (1, 1, ly * lx),
            ):
                yy, xc = y0i + dy, x0i + dx
                ok = (yy >= 0) & (yy < h) & (xc >= 0) & (xc < wd)
                flat = xp.where(ok, yy * wd + xc, 0)
                v = xt[ni, gi, flat]  # (N, og, P, Cg)
                term = v * xp.where(ok, wgt, 0)[..., None]
                acc = term if acc is None else acc + term
            if msk is not None:
                acc = acc * msk[:, :, k][..., None]
            cols.append(acc)
        col = xp.stack(cols, axis=2)  # (N, og, K, P, Cg)
        col = xp.transpose(col, (0, 1, 4, 2, 3)).reshape(n, group, (c // group) * kk, p)
        m = w.shape[0]
        wg = w.astype(cdt, copy=False).reshape(group, m // group, -1)
        out = xp.matmul(wg, col).reshape(n, m, oh, ow)
        if b is not None:
            out = out + b.astype(cdt, copy=False).reshape(1, m, 1, 1)
        return (out.astype(dt, copy=False),)

    return run
