"""MaxPool with optional Indices, by a running max over the kernel offsets."""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel

from .nn import PoolSpec, lowest, pad_spatial, pool_windows, prod


def _flat_index(spec: PoolSpec, kpos, pb, out, in_sp, storage_order):
    """Host array (out shape) of the flat spatial input index read at kernel offset ``kpos``."""
    coords = np.meshgrid(
        *[
            np.arange(o) * s - b + k * d
            for o, s, b, k, d in zip(out, spec.strides, pb, kpos, spec.dilations)
        ],
        indexing="ij",
    )
    dims = list(in_sp)
    order = range(len(dims)) if not storage_order else reversed(range(len(dims)))
    idx = np.zeros(tuple(out), dtype=np.int64)
    mult = 1
    for i in reversed(list(order)):
        idx += coords[i] * mult
        mult *= dims[i]
    return idx


@kernel("MaxPool", since=(1, 8, 10, 11, 12, 22))
def max_pool(node, xp):
    spec = PoolSpec(node)
    storage_order = int(node.attr("storage_order", 0))
    want_idx = node.has_output(1)

    def run(x):
        in_sp = x.shape[2:]
        pb, pe, out, _ = spec.geometry(in_sp)
        xpad = pad_spatial(xp, x, pb, pe, lowest(x.dtype))
        best = None
        best_idx = None
        for kpos, v in pool_windows(xpad, spec, out):
            if best is None:
                best = v
                if want_idx:
                    best_idx = xp.asarray(_flat_index(spec, kpos, pb, out, in_sp, storage_order))
                    best_idx = xp.broadcast_to(best_idx, v.shape)
                continue
            if want_idx:
                upd = v > best
                idx = xp.asarray(_flat_index(spec, kpos, pb, out, in_sp, storage_order))
                best_idx = xp.where(upd, idx, best_idx)
                best = xp.where(upd, v, best)
            else:
                best = xp.maximum(best, v)
        if not want_idx:
            return (best,)
        n, c = x.shape[:2]
        base = xp.arange(n * c, dtype=xp.int64).reshape(n, c, *([1] * len(out))) * prod(in_sp)
        return (best, best_idx + base)

    return run
