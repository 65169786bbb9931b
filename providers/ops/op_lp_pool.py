"""LpPool: (sum |x|^p)^(1/p) over each window; padding contributes zeros."""

from __future__ import annotations

from onnxep.providers.kernel import kernel

from .nn import PoolSpec, compute_dtype, pad_spatial, pool_windows


@kernel("LpPool", since=(1, 2, 11, 18, 22))
def lp_pool(node, xp):
    spec = PoolSpec(node)
    p = float(node.attr("p", 2))

    def run(x):
        pb, pe, out, _ = spec.geometry(x.shape[2:])
        cdt = compute_dtype(x.dtype)
        xa = xp.abs(x.astype(cdt, copy=False))
        xpw = xa * xa if p == 2.0 else xa**p
        xpad = pad_spatial(xp, xpw, pb, pe, 0)
        acc = None
        for _, v in pool_windows(xpad, spec, out):
            acc = v.copy() if acc is None else acc + v
        y = xp.sqrt(acc) if p == 2.0 else acc ** (1.0 / p)
        return (y.astype(x.dtype, copy=False),)

    return run
