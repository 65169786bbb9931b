"""AveragePool: sum over the kernel offsets divided by a host-computed count map."""

from __future__ import annotations

from onnxep.providers.kernel import kernel

from .nn import PoolSpec, avg_divisor, compute_dtype, pad_spatial, pool_windows


@kernel("AveragePool", since=(1, 7, 10, 11, 19, 22))
def average_pool(node, xp):
    spec = PoolSpec(node)
    include_pad = bool(node.attr("count_include_pad", 0))
    cache: dict = {}

    def run(x):
        in_sp = tuple(x.shape[2:])
        pb, pe, out, _ = spec.geometry(in_sp)
        cdt = compute_dtype(x.dtype)
        # The count map is uploaded once per shape and kept on the device: an upload per
        # run would be a host-to-device copy, which a CUDA stream capture refuses (the
        # cuDNN kernel hands ceil_mode and asymmetric excluded pads to this one).
        div = cache.get((in_sp, cdt))
        if div is None:
            div = cache[(in_sp, cdt)] = xp.asarray(
                avg_divisor(spec, in_sp, include_pad).astype(cdt)
            )
        xpad = pad_spatial(xp, x.astype(cdt, copy=False), pb, pe, 0)
        acc = None
        for _, v in pool_windows(xpad, spec, out):
            acc = v.copy() if acc is None else acc + v
        y = acc / div
        return (y.astype(x.dtype, copy=False),)

    return run
