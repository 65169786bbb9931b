"""Conv on NumPy: im2col through one strided view and one copy, then one BLAS matmul per group.

Constant weights are reshaped to (group, M/group, C/group * prod(kernel)) once,
at build time; 1x1 stride-1 unpadded convolutions skip im2col entirely.
"""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops._nn import compute_dtype, resolve_pads
from onnxep.providers.ops.op_conv import conv_setup

from ._nn_cpu import pad_input, window_view


@kernel("Conv", since=(1, 11, 22))
def conv(node, xp):
    group, ksh, strides, dil, pb0, pe0, auto_pad = conv_setup(node)
    wconst = node.const_input(1)
    bconst = node.const_input(2) if node.has_input(2) else None
    geo_cache: dict = {}
    packed: dict = {}

    def weights(w, cdt):
        if wconst is not None:
            key = cdt
            wg = packed.get(key)
            if wg is None:
                wg = packed[key] = np.ascontiguousarray(
                    np.asarray(wconst).astype(cdt).reshape(group, wconst.shape[0] // group, -1)
                )
            return wg
        return w.astype(cdt, copy=False).reshape(group, w.shape[0] // group, -1)

    def geometry(shape, k):
        g = geo_cache.get(shape)
        if g is None:
            in_sp = shape[2:]
            pb, pe = resolve_pads(auto_pad, in_sp, k, strides, dil, pb0, pe0)
            out = tuple(
                (n + a + e - ((kk - 1) * d + 1)) // s + 1
                for n, a, e, kk, d, s in zip(in_sp, pb, pe, k, dil, strides)
            )
            pointwise = (
                all(v == 1 for v in k)
                and all(s == 1 for s in strides)
                and not any(pb)
                and not any(pe)
            )
            g = geo_cache[shape] = (pb, pe, out, pointwise)
        return g

    def run(x, w, b=None):
        k = ksh or list(w.shape[2:])
        pb, pe, out, pointwise = geometry(x.shape, k)
        dt = x.dtype
        cdt = compute_dtype(dt)
        xc = x if x.dtype == cdt else x.astype(cdt)
        n, c = x.shape[:2]
        wg = weights(w, cdt)
        m = wg.shape[0] * wg.shape[1]
        lsz = 1
        for o in out:
            lsz *= o
        if pointwise:
            cols = xc.reshape(n, group, c // group, lsz)
        else:
            xpad = pad_input(xc, pb, pe)
            view = window_view(xpad, k, strides, dil, out)  # (N, C, *k, *out)
            cols = view.reshape(n, group, -1, lsz)  # the one im2col copy
        if group == 1:
            # One GEMM per image, written straight into the output.
            y = np.matmul(wg[0], cols[:, 0])
        else:
            y = np.matmul(wg, cols)
        y = y.reshape(n, m, *out)
        if b is not None:
            bb = bconst if bconst is not None else b
            y += np.asarray(bb, dtype=cdt).reshape(1, m, *([1] * len(out)))
        return (y if y.dtype == dt else y.astype(dt),)

    return run
